"""Workaround for PyTorch's FSDP2 full-state-dict loader, which fails on a module reached by two paths."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from accelerate import Accelerator


def module_alias_names(model: torch.nn.Module) -> set[str]:
    """State-dict names reached through a second path to the same module, e.g. `model.encoder.embeddings.embed_tokens
    .weight` when the encoder's embedding is the module `model.shared`."""
    canonical = {name for name, _ in model.named_modules()}  # each module once, under its first name
    names = [name for name, _ in model.named_parameters(remove_duplicate=False)]
    names += [name for name, _ in model.named_buffers(remove_duplicate=False)]
    return {name for name in names if name.rpartition(".")[0] not in canonical}


def load_full_state_dict_checkpoint(accelerator: Accelerator, model: torch.nn.Module, path: str) -> None:
    """Load an FSDP2 checkpoint's full state dict (`pytorch_model_fsdp.bin`, FULL_STATE_DICT) into the sharded
    `model`: rank 0 reads it and every rank receives its shards.

    What Accelerate's `load_fsdp_model` does, less the names of modules reached by two paths: the file holds them
    (the encoder's and decoder's embedding is the module `model.shared`), but PyTorch's loader visits each module
    once, and its CPU-offloading broadcast then fails with a KeyError on the first such name; without them, the
    strict load of every name misses them. So they are left out and the load checks the other names itself."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    aliases = module_alias_names(model)
    state_dict = torch.load(path, weights_only=True) if accelerator.is_main_process else {}
    for name in aliases:
        state_dict.pop(name, None)
    # not strict: the module's own load_state_dict then misses the alias names, which hold the same tensors
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
    missing, unexpected = set_model_state_dict(model, state_dict, options=options)
    accelerator.wait_for_everyone()
    if set(missing) - aliases or unexpected:
        raise ValueError(
            f"{path} does not fit the model: missing {sorted(set(missing) - aliases)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}."
        )
