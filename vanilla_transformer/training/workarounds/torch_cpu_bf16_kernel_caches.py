"""Workaround for torch 2.13: on a CPU, the bf16 matrix products go through oneDNN, which compiles a kernel for every
shape it multiplies and keeps up to 1,024 of them in each of two caches, about 0.7 MiB a shape; token batches bring
new shapes at almost every step, so a training run's memory grows by hundreds of MiB.

Written for torch 2.13.0 (CPU build, installed), with the oneDNN and ideep it ships.

The limit: ideep keeps the primitives it built in an LRU cache of `LRU_CACHE_CAPACITY` entries and oneDNN their
kernels in a cache of `ONEDNN_PRIMITIVE_CACHE_CAPACITY` entries (both 1,024 by default), read once, when the first
primitive is built.

The workaround (`limit_kernel_caches`): where train.py trains on a CPU in bf16, before the first product, it sets
both variables to `CAPACITY` (64) unless the environment already sets them (the user's value always wins). The peak
memory falls by about 40 % at the same speed: docs/performance.md#why-bf16-the-eager-attention-and-kernel-caches.

It can go when the caches hold little per shape, or when PyTorch bounds them by memory:
tests/test_workarounds.py's `test_torch_still_keeps_about_a_mib_of_bf16_kernels_per_shape` fails when a new shape no
longer costs a quarter of a MiB, or when the two variables no longer bound what is kept.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from transformers import TrainingArguments

CAPACITY = 64
VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def limit_kernel_caches(
    training_args: TrainingArguments, environ: MutableMapping[str, str] = os.environ
) -> dict[str, str]:
    """Set the two cache capacities (`VARIABLES`) to `CAPACITY` in `environ` where training runs on a CPU in bf16
    (the arguments' mixed_precision: --bf16 or `accelerate launch --mixed_precision bf16`), each unless `environ`
    already sets it; return what was set (empty elsewhere). Must run before the process's first bf16 product, when
    the libraries read them."""
    if not (training_args.mixed_precision == "bf16" and training_args.device.type == "cpu"):
        return {}
    wanted = {name: str(CAPACITY) for name in VARIABLES if name not in environ}
    environ.update(wanted)
    return wanted
