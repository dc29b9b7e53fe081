"""Workaround for `accelerate launch --multi_gpu` on a machine without GPUs: each process would train alone."""

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
