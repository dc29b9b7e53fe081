"""Workaround for FSDP's full state dict, which gathers each name of a tied weight as a tensor of its own."""

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
