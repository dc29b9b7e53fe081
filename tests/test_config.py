import json

import pytest
from conftest import tiny_config
from huggingface_hub.errors import StrictDataclassError
from transformers import AutoConfig, AutoModelForSeq2SeqLM

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration


def test_defaults_are_the_paper_base_model():
    config = VanillaTransformerConfig()
    assert (config.d_model, config.encoder_layers, config.decoder_layers) == (512, 6, 6)
    assert (config.encoder_attention_heads, config.encoder_ffn_dim, config.dropout) == (8, 2048, 0.1)
    assert config.activation_function == "relu"
    assert config.position_embedding_type == "sinusoidal"
    assert config.normalize_before is False and config.scale_embedding is True
    assert config.share_encoder_decoder_embeddings and config.tie_word_embeddings
    assert config.is_encoder_decoder
    # generic tooling reads the standard names
    assert (config.hidden_size, config.num_attention_heads, config.num_hidden_layers) == (512, 8, 6)


def test_decoding_settings_live_on_the_generation_config_which_takes_the_configs_special_ids(tmp_path):
    """transformers 5 keeps decoding settings in generation_config.json: a new model's generation config takes the
    special ids from its config, and a beam setting saved with the model comes back from generation_config.json,
    config.json holding none."""
    config = tiny_config(bos_token_id=3, eos_token_id=4, pad_token_id=5, decoder_start_token_id=6)
    model = VanillaTransformerForConditionalGeneration(config)
    generation = model.generation_config
    ids = (generation.bos_token_id, generation.eos_token_id, generation.pad_token_id, generation.decoder_start_token_id)
    assert ids == (3, 4, 5, 6)
    generation.num_beams = 4
    model.save_pretrained(tmp_path)
    assert "num_beams" not in json.loads((tmp_path / "config.json").read_text())
    assert AutoModelForSeq2SeqLM.from_pretrained(tmp_path).generation_config.num_beams == 4


def test_auto_config_round_trip(tmp_path):
    config = VanillaTransformerConfig(vocab_size=100, d_model=64, encoder_layers=1, normalize_before=True)
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert type(loaded) is VanillaTransformerConfig
    assert loaded.to_diff_dict() == config.to_diff_dict()
    assert loaded.normalize_before and loaded.d_model == 64


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"d_model": 30, "encoder_attention_heads": 4}, "encoder_attention_heads"),
        ({"decoder_attention_heads": 3}, "decoder_attention_heads"),
        ({"encoder_layers": 0}, "encoder_layers"),
        ({"vocab_size": -5}, "vocab_size"),
        ({"encoder_ffn_dim": 0}, "encoder_ffn_dim"),
        ({"activation_function": "softmax"}, "activation_function"),
        ({"position_embedding_type": "rotary"}, "position_embedding_type"),
        ({"init_scheme": "kaiming"}, "init_scheme"),
        ({"init_std": 0.0}, "init_std"),
        ({"dropout": 1.0}, "dropout"),
        ({"attention_dropout": -0.1}, "attention_dropout"),
        ({"vocab_size": 10, "pad_token_id": 10}, "pad_token_id"),
        ({"vocab_size": 10, "eos_token_id": 12}, "eos_token_id"),
        ({"vocab_size": 10, "decoder_start_token_id": -1}, "decoder_start_token_id"),
        ({"decoder_vocab_size": 10, "vocab_size": 20}, "decoder_vocab_size"),
    ],
)
def test_invalid_values_raise_naming_field_and_value(kwargs, field):
    """As transformers' own @strict configs (MarianConfig, BartConfig): huggingface_hub's StrictDataclassError, whose
    message names the field and the value."""
    with pytest.raises(StrictDataclassError, match=field) as error:
        VanillaTransformerConfig(**kwargs)
    assert str(kwargs[field]) in str(error.value)


def test_separate_vocabularies():
    config = VanillaTransformerConfig(vocab_size=8500, decoder_vocab_size=8000, share_encoder_decoder_embeddings=False)
    assert (config.vocab_size, config.decoder_vocab_size) == (8500, 8000)


def test_a_config_saved_when_the_pipeline_lived_in_the_modeling_file_points_to_its_own_file():
    old = {
        "impl": "modeling_vanilla_transformer.VanillaTransformerTranslationPipeline",
        "pt": ["AutoModelForSeq2SeqLM"],
    }
    config = VanillaTransformerConfig(custom_pipelines={"translation": old})
    assert config.custom_pipelines["translation"]["impl"] == (
        "pipeline_vanilla_transformer.VanillaTransformerTranslationPipeline"
    )
    own = {"impl": "my_pipeline.MyTranslationPipeline", "pt": ["AutoModelForSeq2SeqLM"], "type": "text"}
    assert VanillaTransformerConfig(custom_pipelines={"translation": own}).custom_pipelines["translation"] == own
