"""Workaround for Accelerate: `accelerate launch --multi_gpu` without GPUs starts processes that each train alone.

Written for Accelerate 1.15; checked with 1.16.0.

The limit: on a machine without an accelerator, the processes that `accelerate launch --multi_gpu --num_processes N`
starts find no GPU backend, and unless they are told to use the CPU (`--cpu`, `ACCELERATE_USE_CPU`) each one's
`PartialState` is a single process (DistributedType.NO): N runs side by side, each on the whole data, instead of one
run in a gloo group.

The workaround (`use_cpu_if_no_accelerator`, first thing in scripts/train.py): a launched process on a machine
without an accelerator sets `ACCELERATE_USE_CPU=true`, which transformers' `TrainingArguments` and Accelerate read.

It can go when a launched process without an accelerator joins a gloo group by itself: tests/test_workarounds.py's
`test_accelerate_still_leaves_a_launched_process_alone_without_gpus` then fails.
"""

from __future__ import annotations

import os

import torch


def use_cpu_if_no_accelerator() -> bool:
    """`accelerate launch --multi_gpu` on a machine without GPUs starts N processes, but unless they are told to use
    the CPU each of them trains alone (Accelerate finds no GPU backend). Tell them, so that they join a gloo group.
    Returns True when it did."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1 and not torch.accelerator.is_available():
        os.environ["ACCELERATE_USE_CPU"] = "true"
        return True
    return False
