"""Workaround for FSDP2's full state dict, which gathers each name of a tied weight as a tensor of its own.

Written for torch 2.13 and transformers 5.24 (installed: torch 2.13.0, transformers 5.24.0).

The limit: the full state dict of a model sharded with `fully_shard` (what Accelerate's `get_state_dict` and the
Trainer's FULL_STATE_DICT save gather on rank 0) holds every name of a tied weight as a separate, equal tensor
(`lm_head.weight`, `model.shared.weight` and both `embed_tokens.weight`), and `save_pretrained`, which finds ties by
shared storage, would store the weight under every name.

The workaround (`share_tied_tensors`, in `overrides.TrainerOverrides._save`): the tied names of the gathered state dict
become one tensor again, so that the checkpoint stores the shared weight once, as a single-process save does.

It can go when the gathered state dict keeps tied names as one tensor: tests/test_workarounds.py's
`test_fsdp_still_gathers_tied_names_as_separate_tensors` then fails.
"""

from __future__ import annotations

import torch

from ..sharding import tied_names


def share_tied_tensors(state_dict: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Make the tied names of a gathered state dict one tensor again, in place. FSDP gathers each name on its own, so
    `lm_head.weight` and `model.shared.weight` arrive as two equal tensors that `save_pretrained` would both store;
    aliased, it stores the shared one once, as a single-process save does. Names whose tensors differ are left
    alone."""
    for target, source in tied_names(model).items():
        if target in state_dict and source in state_dict and state_dict[target] is not state_dict[source]:
            if state_dict[target].shape == state_dict[source].shape and torch.equal(
                state_dict[target], state_dict[source]
            ):
                state_dict[target] = state_dict[source]
    return state_dict
