"""Workaround for PyTorch's `fully_shard`, which swaps a model's class for a generated one, while saving."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def model_class_unwrapped(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """While saving, give an FSDP2 model its own class back. `fully_shard` swaps the class for a generated
    `FSDP<Name>` defined in PyTorch's FSDP package; `save_pretrained` of a trust_remote_code model names the class's
    module in config.json's auto_map and copies its source files, so the checkpoint would point AutoModelForSeq2SeqLM
    at `_fsdp_init.FSDP...` and carry PyTorch's FSDP sources instead of the model's. A model that is not sharded is
    left alone."""
    from torch.distributed.fsdp import FSDPModule

    wrapped = type(model)
    if not isinstance(model, FSDPModule):
        yield model
        return
    own = next(cls for cls in wrapped.__mro__[1:] if not issubclass(cls, FSDPModule))
    model.__class__ = own
    try:
        yield model
    finally:
        model.__class__ = wrapped
