import importlib.util
import os
import sys

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from vanilla_transformer import VanillaTransformerConfig  # noqa: E402


def tiny_config(**overrides) -> VanillaTransformerConfig:
    """A 2+2-layer, d_model 32 model: big enough to have every component, small enough for CPU tests."""
    values = dict(
        vocab_size=64,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=128,
    )
    values.update(overrides)
    return VanillaTransformerConfig(**values)


@pytest.fixture
def config() -> VanillaTransformerConfig:
    return tiny_config()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def word_tokenizer(words: list[str]) -> PreTrainedTokenizerFast:
    """A word-level tokenizer with the model's special ids (pad 0, bos 1, eos 2, unk 3); sentences end with eos."""
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{w: i + 4 for i, w in enumerate(words)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    tokenizer.decoder = decoders.WordPiece()  # joins words with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_script(name: str, folder: str = "scripts"):
    """Import <folder>/<name>.py (scripts/ or benchmarks/) as a module, e.g. to call its main() in-process."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, folder, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses with postponed annotations look their module up there
    spec.loader.exec_module(module)
    return module


def decode_one_token_at_a_time(model, input_ids, attention_mask, decoder_input_ids) -> tuple[torch.Tensor, object]:
    """Run the encoder once, then the decoder one target token per call with the KV cache, as generate() does; returns
    the logits of all steps, concatenated along the target length, and the final cache."""
    encoder_outputs = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)
    cache, steps = None, []
    for t in range(decoder_input_ids.shape[1]):
        out = model(
            encoder_outputs=encoder_outputs,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids[:, t : t + 1],
            cache=cache,
            use_cache=True,
        )
        cache = out.cache
        steps.append(out.logits)
    return torch.cat(steps, dim=1), cache
