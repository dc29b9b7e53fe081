"""Bad input gets one clear error naming the argument, its value and what is allowed."""

import ast
import json
import os
from pathlib import Path

import pytest
import safetensors.torch
import torch
from conftest import ROOT, load_script, tiny_config, tiny_model, word_tokenizer
from huggingface_hub.errors import StrictDataclassError
from transformers import AutoConfig, AutoModelForSeq2SeqLM

from vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer.training.checkpoints import load_trained_model
from vanilla_transformer.training.tokenizer import check_tokenizer_matches_config

VOCAB = 64  # tiny_config's vocab_size


def ids(batch: int = 2, length: int = 5) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, length))


@pytest.fixture(scope="module")
def model() -> VanillaTransformerForConditionalGeneration:
    return tiny_model()


# ---------------------------------------------------------------- token ids


@pytest.mark.parametrize("bad", [VOCAB, VOCAB + 100, -1])
@pytest.mark.parametrize("argument", ["input_ids", "decoder_input_ids", "labels"])
def test_token_ids_outside_the_vocabulary(model, argument, bad):
    inputs = dict(input_ids=ids(), decoder_input_ids=ids())
    if argument == "labels":
        inputs = dict(input_ids=ids(), labels=ids())
    inputs[argument][1, 2] = bad
    allowed = r"\[0, vocab_size=64\)" if argument == "input_ids" else r"\[0, decoder_vocab_size=64\)"
    with pytest.raises(ValueError, match=rf"`{argument}` contains the token id {bad}; ids must be in {allowed}"):
        model(**inputs)


def test_labels_may_hold_minus_100_but_no_other_negative(model):
    labels = ids()
    labels[:, 3:] = -100
    assert torch.isfinite(model(input_ids=ids(), labels=labels).loss)
    labels[0, 0] = -5
    with pytest.raises(ValueError, match=r"`labels` contains the token id -5; .* or -100"):
        model(input_ids=ids(), labels=labels)


def test_separate_target_vocabulary_bounds_decoder_ids():
    model = tiny_model(share_encoder_decoder_embeddings=False, decoder_vocab_size=40)
    model(input_ids=torch.full((1, 3), 60), decoder_input_ids=torch.full((1, 3), 39))  # both in range
    with pytest.raises(ValueError, match=r"`decoder_input_ids` contains the token id 50; .*decoder_vocab_size=40"):
        model(input_ids=torch.full((1, 3), 60), decoder_input_ids=torch.full((1, 3), 50))


def test_token_ids_must_be_integers(model):
    with pytest.raises(TypeError, match=r"`input_ids` must hold integer token ids, got dtype torch.float32"):
        model(input_ids=ids().float(), decoder_input_ids=ids())


# ---------------------------------------------------------------- shapes


@pytest.mark.parametrize(
    "inputs, message",
    [
        (dict(attention_mask=torch.ones(2, 4)), r"`attention_mask` has shape \(2, 4\) but `input_ids` needs \(2, 5\)"),
        (dict(attention_mask=torch.ones(3, 5)), r"`attention_mask` has shape \(3, 5\) but `input_ids` needs \(2, 5\)"),
        (dict(attention_mask=torch.ones(5)), r"`attention_mask` has shape \(5,\) but `input_ids` needs \(2, 5\)"),
        (
            dict(decoder_attention_mask=torch.ones(2, 7)),
            r"`decoder_attention_mask` has shape \(2, 7\) but `decoder_input_ids` needs \(2, 3\)",
        ),
    ],
)
def test_attention_mask_must_match_its_ids(model, inputs, message):
    inputs = dict(dict(input_ids=ids(), decoder_input_ids=ids(2, 3)), **inputs)
    with pytest.raises(ValueError, match=message):
        model(**inputs)


def test_source_mask_must_match_precomputed_encoder_outputs(model):
    """The generation path: encoder_outputs come precomputed and only the mask is passed along."""
    encoder_outputs = model.get_encoder()(input_ids=ids())
    with pytest.raises(ValueError, match=r"`attention_mask` has shape \(2, 6\) but `input_ids` needs \(2, 5\)"):
        model(encoder_outputs=encoder_outputs, attention_mask=torch.ones(2, 6), decoder_input_ids=ids(2, 1))


def test_decoder_mask_covers_past_and_current_tokens_with_a_cache(model):
    source, target = ids(), ids(2, 4)
    full = model(input_ids=source, decoder_input_ids=target).logits
    out = model(input_ids=source, decoder_input_ids=target[:, :3], decoder_attention_mask=torch.ones(2, 3))
    step = model(
        input_ids=source, decoder_input_ids=target[:, 3:], decoder_attention_mask=torch.ones(2, 4), cache=out.cache
    )
    torch.testing.assert_close(step.logits[:, 0], full[:, 3], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"needs \(2, 5\) \(batch, past \+ current tokens\)"):
        model(
            input_ids=source, decoder_input_ids=target[:, 3:], decoder_attention_mask=torch.ones(2, 1), cache=out.cache
        )
    # generate grows the decoder mask by one column per step and must keep working
    prompt = torch.ones(2, 2, dtype=torch.long)
    generated = model.generate(
        input_ids=source,
        decoder_input_ids=prompt,
        decoder_attention_mask=torch.ones(2, 2),
        max_new_tokens=4,
        num_beams=2,
    )
    assert generated.shape[1] > 2


@pytest.mark.parametrize(
    "inputs, message",
    [
        (dict(input_ids=ids(0, 5), decoder_input_ids=ids(0, 3)), r"`input_ids` has shape \(0, 5\): an empty batch"),
        (dict(input_ids=ids(2, 0), decoder_input_ids=ids(2, 3)), r"`input_ids` has shape \(2, 0\): .* zero-length"),
        (dict(input_ids=ids(2, 5), decoder_input_ids=ids(2, 0)), r"`decoder_input_ids` has shape \(2, 0\)"),
        (dict(inputs_embeds=torch.zeros(2, 0, 32), decoder_input_ids=ids()), r"`inputs_embeds` has shape \(2, 0, 32\)"),
    ],
)
def test_empty_batch_or_zero_length_sequence(model, inputs, message):
    with pytest.raises(ValueError, match=message):
        model(**inputs)


def test_labels_of_the_wrong_shape(model):
    with pytest.raises(ValueError, match=r"`labels` has shape \(2, 3\) but the decoder produced \(2, 5\)"):
        model(input_ids=ids(), decoder_input_ids=ids(), labels=ids(2, 3))


def test_source_and_target_batches_of_different_sizes(model):
    # labels of another batch size used to end in a matrix-multiply error deep in cross-attention
    with pytest.raises(ValueError, match=r"`decoder_input_ids` \(or `labels`.*batch size 3 but the source .* has 2"):
        model(input_ids=ids(2, 5), labels=ids(3, 4))
    with pytest.raises(ValueError, match="batch size 1 but the source"):
        model(input_ids=ids(2, 5), decoder_input_ids=ids(1, 4))
    encoder_outputs = model.get_encoder()(input_ids=ids(2, 5))
    with pytest.raises(ValueError, match="`decoder_inputs_embeds` has batch size 3"):
        model(encoder_outputs=encoder_outputs, decoder_inputs_embeds=torch.randn(3, 4, model.config.d_model))


def test_decoder_start_token_id_unset_when_it_is_needed():
    model = tiny_model(decoder_start_token_id=None)
    model(input_ids=ids(), decoder_input_ids=ids())  # not needed: the decoder input is given
    with pytest.raises(ValueError, match=r"`config.decoder_start_token_id` is None, but it is needed"):
        model(input_ids=ids(), labels=ids())


def test_learned_positions_fail_clearly_past_max_position_embeddings():
    model = tiny_model(position_embedding_type="learned", max_position_embeddings=8)
    model(input_ids=ids(1, 8), decoder_input_ids=ids(1, 8))
    with pytest.raises(ValueError, match=r"position 8 needs more than max_position_embeddings=8"):
        model(input_ids=ids(1, 9), decoder_input_ids=ids(1, 2))
    # the decoder counts cached positions too
    out = model(input_ids=ids(1, 3), decoder_input_ids=ids(1, 8))
    with pytest.raises(ValueError, match=r"position 8 needs more than max_position_embeddings=8"):
        model(input_ids=ids(1, 3), decoder_input_ids=ids(1, 1), cache=out.cache)


def test_sinusoidal_positions_extend_past_max_position_embeddings():
    model = tiny_model(max_position_embeddings=8)
    logits = model(input_ids=ids(1, 40), decoder_input_ids=ids(1, 40)).logits
    assert logits.shape == (1, 40, VOCAB) and torch.isfinite(logits).all()
    table = model.model.encoder.embeddings.embed_positions(torch.arange(40))
    assert not torch.allclose(table[8:16], table[:8])  # new positions, not the first ones repeated


# ---------------------------------------------------------------- files


@pytest.mark.parametrize(
    "field, value",
    [
        ("d_model", 30),  # not divisible by 4 heads
        ("dropout", 1.5),
        ("activation_function", "swiglu"),
        ("position_embedding_type", "rotary"),
        ("encoder_layers", 0),
        ("pad_token_id", 64),
        ("vocab_size", "64"),
    ],
)
def test_config_json_with_an_invalid_value(tmp_path, field, value):
    tiny_config().save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    data = json.loads(path.read_text())
    data[field] = value
    path.write_text(json.dumps(data))
    with pytest.raises(StrictDataclassError, match=rf"(?s){field}.*{value}"):
        AutoConfig.from_pretrained(tmp_path)


@pytest.mark.parametrize("script", ["translate", "average_checkpoints"])
def test_scripts_report_an_invalid_config_on_one_line(tmp_path, script):
    model_dir = tmp_path / "model"
    tiny_model().save_pretrained(model_dir)
    word_tokenizer([f"w{i}" for i in range(VOCAB - 4)]).save_pretrained(model_dir)
    data = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**data, "dropout": 1.5}))
    argv = {
        "translate": ["--model_dir", str(model_dir), "--text", "w1", "--device", "cpu"],
        "average_checkpoints": ["--checkpoints", str(model_dir), "--output_dir", str(tmp_path / "average")],
    }[script]
    with pytest.raises(SystemExit) as info:
        load_script(script).main(argv)
    text = str(info.value.code)
    assert text.startswith(f"{script}.py: error: ") and "\n" not in text, text
    assert "`dropout`=1.5 is invalid; it must be a probability in [0, 1)" in text, text


def _truncate(path: Path, keep: float) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _drop_tensor(path: Path) -> None:
    tensors = safetensors.torch.load_file(path)
    del tensors[next(k for k in sorted(tensors) if "decoder.layers.1" in k)]
    safetensors.torch.save_file(tensors, path, metadata={"format": "pt"})


@pytest.mark.parametrize(
    "damage, error, message",
    [
        (lambda p: _truncate(p, 0.5), Exception, "incomplete metadata, file not fully covered"),  # SafetensorError
        (lambda p: _truncate(p, 0.0), Exception, "header too small"),
        (lambda p: p.unlink(), OSError, "no file named model.safetensors"),
        (_drop_tensor, OSError, r"lacks 1 encoder/decoder weight\(s\) \(model.decoder.layers.1"),
        (lambda p: safetensors.torch.save_file({}, p), OSError, r"lacks \d+ encoder/decoder weight"),
    ],
    ids=["truncated", "empty-file", "no-weights-file", "missing-tensor", "no-tensors"],
)
def test_a_trained_model_with_missing_or_corrupt_weights_is_refused(tmp_path, damage, error, message):
    """Where a trained model is asked for (translate.py, train.py --model_name_or_path, averaging, plots, uploads)."""
    tiny_model().save_pretrained(tmp_path)
    damage(tmp_path / "model.safetensors")
    with pytest.raises(error, match=message):
        load_trained_model(str(tmp_path))


def test_from_pretrained_reports_missing_weights_and_initialises_them(tmp_path):
    """As everywhere in transformers: a load report, never an exception, and fresh weights from _init_weights."""
    tiny_model().save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    tensors = safetensors.torch.load_file(path)
    dropped = [
        "model.decoder.layers.1.feed_forward.fc1.weight",
        "model.decoder.layers.1.feed_forward_norm.layer_norm.weight",
    ]
    for key in dropped:
        del tensors[key]
    safetensors.torch.save_file(tensors, path, metadata={"format": "pt"})
    model, info = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, output_loading_info=True)
    assert sorted(info["missing_keys"]) == dropped
    fc1 = model.model.decoder.layers[1].feed_forward.fc1.weight
    assert torch.isfinite(fc1).all() and abs(fc1.std().item() - model.config.init_std) < 0.005  # N(0, 0.02)
    assert torch.equal(model.model.decoder.layers[1].feed_forward_norm.layer_norm.weight, torch.ones(32))


def test_a_missing_task_head_is_still_allowed(tmp_path):
    """Fine-tuning a translation checkpoint for classification starts the new head from random, as in transformers."""
    from transformers import AutoModelForSequenceClassification

    tiny_model().save_pretrained(tmp_path)
    model, info = AutoModelForSequenceClassification.from_pretrained(tmp_path, output_loading_info=True)
    assert info["missing_keys"] and all(k.startswith("classification_head.") for k in info["missing_keys"])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(pad_token_id=3), r"has pad_token_id=0 but the model config has pad_token_id=3"),
        (dict(eos_token_id=5), r"has eos_token_id=2 but the model config has eos_token_id=5"),
        (dict(bos_token_id=7), r"has bos_token_id=1 but the model config has bos_token_id=7"),
        (dict(decoder_start_token_id=2), r"decoder_start_token_id=2 but the tokenizer has bos_token_id=1"),
        (dict(vocab_size=48), r"has 64 tokens but the model's vocabulary holds only 48"),
    ],
)
def test_tokenizer_whose_ids_disagree_with_the_config(overrides, message):
    tokenizer = word_tokenizer([f"w{i}" for i in range(VOCAB - 4)])  # 64 tokens with the specials
    check_tokenizer_matches_config(tokenizer, tiny_config())  # the matching pair passes
    with pytest.raises(ValueError, match=message):
        check_tokenizer_matches_config(tokenizer, tiny_config(**overrides))


# ---------------------------------------------------------------- safe loading


def test_only_safetensors_are_written_and_loading_needs_no_remote_code(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path)
    written = sorted(os.listdir(tmp_path))
    assert "model.safetensors" in written
    assert not [name for name in written if name.endswith((".bin", ".pt", ".pth", ".pkl", ".ckpt"))], written
    # with the package imported, the Auto class resolves to the installed code: no trust_remote_code prompt, and not
    # the copy of the source saved for hosts without the package
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    assert type(loaded) is VanillaTransformerForConditionalGeneration
    torch.testing.assert_close(loaded.state_dict(), model.state_dict())


def unsafe_torch_loads(source: str) -> list[int]:
    """Line numbers of ``torch.load(...)`` calls without ``weights_only=True`` (which unpickles arbitrary code)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "load"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "torch"
        ):
            safe = any(
                k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                for k in node.keywords
            )
            if not safe:
                lines.append(node.lineno)
    return lines


def test_nothing_calls_torch_load_without_weights_only():
    assert unsafe_torch_loads("import torch\nstate = torch.load(path)\n") == [2]  # the scanner sees the unsafe call
    assert unsafe_torch_loads("torch.load(path, map_location='cpu', weights_only=True)") == []
    files = [p for folder in ("vanilla_transformer", "scripts", "tests") for p in (ROOT / folder).rglob("*.py")]
    assert any(p.name == "modeling_vanilla_transformer.py" for p in files)
    offenders = {str(p.relative_to(ROOT)): lines for p in files if (lines := unsafe_torch_loads(p.read_text()))}
    assert not offenders, f"torch.load without weights_only=True: {offenders}"
