"""Workaround for torch 2.13: on a CPU, the bf16 matrix products go through oneDNN, which compiles a kernel for every
shape it multiplies and keeps up to 1,024 of them in each of two caches, about 0.7 MiB a shape; token batches bring
new shapes at almost every step, so a training run's memory grows by hundreds of MiB.

Written for torch 2.13.0 (CPU build, installed), with the oneDNN and ideep it ships.

The limit: a bf16 product on a CPU (autocast included) runs as a oneDNN primitive built for its exact shapes. PyTorch's
ideep layer keeps the primitives it built in an LRU cache of `LRU_CACHE_CAPACITY` entries (default 1,024), and
oneDNN keeps their kernels in its own primitive cache of `ONEDNN_PRIMITIVE_CACHE_CAPACITY` entries (default 1,024);
both variables are read once, when the first primitive is built. Measured 2026-12-05 on the 2-core AMD EPYC (AVX-512
BF16), one thread: 200 products of distinct shapes grow the resident memory by 147 MiB with the defaults, by 10 MiB
with both capacities at their minimum. train.py's batches of at most 1,024 tokens differ in sentences and length at
almost every step: its first 100 steps on the French corpus built 444 distinct primitives (three products per weight
and per attention, forward and backward), and the resident memory grew from 806 to about 1,150 MiB during those
steps, to 1,637 MiB after 1,000 steps (docs/performance.md).

The workaround (`limit_kernel_caches`): where train.py trains on a CPU in bf16, before the first product, it sets
both variables to `CAPACITY` (64) unless the environment already sets them (the user's value always wins). After
1,000 steps (`benchmarks/run.py end_to_end --bf16 --max_tokens_per_batch 1024 --max_steps 1000`, two pairs side by
side) the peak resident memory was 883 and 936 MiB against 1,637 and 1,566 with the defaults, and no slower (2,239
and 2,080 source tokens per second against 2,182 and 1,897): a kernel rebuilt takes about 0.5 ms, and the 64 most
recent shapes hold most of what the next steps multiply. Decoding after training took as long (docs/performance.md).

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
    """Set the two cache capacities (`VARIABLES`) to `CAPACITY` in `environ` where training runs on a CPU in bf16,
    each unless `environ` already sets it; return what was set (empty elsewhere). Must run before the process's first
    bf16 product, when the libraries read them."""
    if not (training_args.bf16 and training_args.device.type == "cpu"):
        return {}
    wanted = {name: str(CAPACITY) for name in VARIABLES if name not in environ}
    environ.update(wanted)
    return wanted
