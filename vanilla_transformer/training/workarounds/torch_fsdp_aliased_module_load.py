"""Workaround for PyTorch's FSDP2 full-state-dict loader, which fails on a module reached by two paths.

Written for torch 2.13 and Accelerate 1.15 (installed: torch 2.13.0, Accelerate 1.16.0, transformers 5.24.0).

The limit: the Trainer resumes an FSDP checkpoint with Accelerate's `load_fsdp_model`, which for FSDP2 and
FULL_STATE_DICT calls `set_model_state_dict(..., full_state_dict=True, broadcast_from_rank0=True)` with every name of
`pytorch_model_fsdp.bin`. The file holds the names of modules reached by two paths (the encoder's and decoder's
embedding is the module `model.shared`), but PyTorch's loader visits each module once, and its broadcast fails with a
KeyError on the first such name; without those names, a strict load misses them.

The workaround (`load_in_trainer`, in `overrides.TrainerOverrides._load_from_checkpoint`):
`load_full_state_dict_checkpoint` does what `load_fsdp_model` does, less those names, and checks the others itself.

It can go when PyTorch loads a full state dict with the alias names: tests/test_workarounds.py's
`test_fsdp_still_fails_to_load_a_full_state_dict_with_module_aliases` then fails. It must change when
`_load_from_checkpoint` is renamed (`test_the_trainer_methods_the_workarounds_override_still_exist`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from accelerate import Accelerator
    from transformers import Trainer


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


def load_in_trainer(trainer: Trainer, resume_from_checkpoint: str, model: torch.nn.Module | None = None) -> bool:
    """Load the checkpoint `resume_from_checkpoint` into the Trainer's model (or `model`) with
    `load_full_state_dict_checkpoint` when it is an FSDP2 FULL_STATE_DICT checkpoint and the Trainer shards with
    FSDP2. Returns False, having loaded nothing, otherwise (the Trainer's own loading applies)."""
    full = os.path.join(resume_from_checkpoint, "pytorch_model_fsdp.bin")  # FSDP's FULL_STATE_DICT checkpoint
    if not (trainer.is_fsdp_enabled and trainer.accelerator.is_fsdp2 and os.path.isfile(full)):
        return False
    load_full_state_dict_checkpoint(trainer.accelerator, model if model is not None else trainer.model, full)
    return True
