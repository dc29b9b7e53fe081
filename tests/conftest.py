import os

import pytest
import torch

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
