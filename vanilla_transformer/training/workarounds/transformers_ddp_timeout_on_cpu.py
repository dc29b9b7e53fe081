"""Workaround for transformers 5.24: ``--ddp_timeout`` is ignored by CPU processes.

Written for transformers 5.24.0 (installed).

``TrainingArguments._setup_devices`` (transformers 5.24) gives Accelerate's ``PartialState`` the process-group timeout
(``ddp_timeout``) only for accelerator devices; with ``use_cpu`` or ``ACCELERATE_USE_CPU`` (every CPU launch: the recipe
gives a launched process without an accelerator ``--use_cpu``) the gloo group gets torch's default of 30 minutes.
Processes that stop agreeing then wait half an hour instead of failing with an error. ``init_cpu_process_group`` starts
the group itself, with the timeout, before transformers sets the devices up
(``workarounds.overrides.TrainingArgumentsOverrides._setup_devices``); Accelerate then finds it started and uses it.

It can go when transformers passes the timeout on CPU too: tests/test_workarounds.py's
``test_transformers_still_drops_the_process_group_timeout_on_cpu`` then fails (and
``test_setup_devices_is_still_a_cached_property`` when the override no longer fits). tests/test_distributed.py checks
that a mismatch between two CPU processes ends in seconds.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
from transformers import TrainingArguments
from transformers.utils import strtobool


def init_cpu_process_group(args: TrainingArguments) -> bool:
    """Start the default process group of a multi-process CPU launch with ``args.ddp_timeout``, unless it is already
    started, the launch is not a multi-process one (torchrun's or ``accelerate launch``'s environment), or it uses
    accelerators or DeepSpeed (there transformers passes the timeout itself). Returns True when it started it."""
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1 and "MASTER_ADDR" in os.environ
    on_cpu = args.use_cpu or strtobool(os.environ.get("ACCELERATE_USE_CPU", "false"))
    if not (launched and on_cpu) or args.deepspeed or not torch.distributed.is_available():
        return False
    if torch.distributed.is_initialized():
        return False
    torch.distributed.init_process_group(
        backend=args.ddp_backend or "gloo",
        timeout=timedelta(seconds=args.ddp_timeout),
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
    )
    return True
