"""Workaround for transformers 5.24: resuming warns that every tied weight's second name is missing.

Written for transformers 5.24.0 (installed).

The limit: `Trainer._load_from_checkpoint` loads a checkpoint with torch's `load_state_dict(strict=False)`, whose
result names as missing every name that the checkpoint stores once (the shared embedding's names under the encoder
and decoder, the tied `lm_head`), and `Trainer._issue_warnings_after_load` warns about them all (it forgives only
`_keys_to_ignore_on_save`), although they were loaded under the name they alias.

The workaround (`drop_loaded_tied_names`, called in `overrides.TrainerOverrides._issue_warnings_after_load`): a tied
name is missing only when the name it aliases is missing too.

It can go when the Trainer no longer warns about tied names: tests/test_workarounds.py's
`test_transformers_still_warns_about_tied_names_on_resume` then fails.
"""

from __future__ import annotations

from typing import Any

import torch

from ..sharding import tied_names


def drop_loaded_tied_names(load_result: Any, model: torch.nn.Module) -> Any:
    """`load_result` (torch's `_IncompatibleKeys`) without the missing names whose tensor was loaded under the name
    they alias."""
    aliases, missing = tied_names(model), set(load_result.missing_keys)
    kept = [name for name in load_result.missing_keys if aliases.get(name, name) in missing]
    return load_result._replace(missing_keys=kept)
