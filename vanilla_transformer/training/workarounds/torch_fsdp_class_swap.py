"""Workaround for PyTorch's `fully_shard`, which swaps a model's class, and transformers' saving of its code.

Written for torch 2.13 and transformers 5.24 (installed: torch 2.13.0, transformers 5.24.0).

The limit: FSDP2's `fully_shard` replaces the class of the module it shards by a generated `FSDP<Name>` defined in
PyTorch's FSDP package (`torch.distributed.fsdp._fully_shard._fsdp_init`). transformers' `save_pretrained` of a
trust_remote_code model (`custom_object_save`) names the class's module in config.json's `auto_map` and copies that
module's source files, so a checkpoint saved under FSDP would point `AutoModelForSeq2SeqLM` at
`_fsdp_init.FSDP...` and carry PyTorch's FSDP sources instead of the model's.

The workaround (`model_class_unwrapped`, around `Trainer._save` in `overrides.TrainerOverrides._save`): while saving,
the model has its own class back (it assigns `model.__class__`).

It can go when `fully_shard` keeps the class, or when transformers saves the code of the class under it:
tests/test_workarounds.py's `test_fully_shard_still_saves_its_own_class_in_the_auto_map` then fails.
"""

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
