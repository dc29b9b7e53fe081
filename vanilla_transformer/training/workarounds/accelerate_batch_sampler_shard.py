"""Workaround for Accelerate's `BatchSamplerShard`, which has no `set_epoch`: a batch sampler it wraps misses the
epoch when the Trainer resumes mid-epoch with several processes.

Written for Accelerate 1.15; checked with 1.16.0 and transformers 5.25.0.

The limit: with several processes, `Accelerator.prepare` wraps a DataLoader's batch sampler in a `BatchSamplerShard`.
transformers 5.25 makes that wrapper a pass-through for a rank-aware batch sampler (`BatchRebalanceSampler`, which
`batching.TokenBatchSampler` is) and sets the epoch of the sampler it wraps (`Trainer._run_epoch`). Resuming
mid-epoch, though, the Trainer's `skip_first_batches` wraps the loader once more, and the epoch then goes to the
`BatchSamplerShard`, which has no `set_epoch`: the token batches of the resumed epoch would come in epoch 0's order.

The workaround (`forward_set_epoch`, in `TokenBatchingSeq2SeqTrainer.get_train_dataloader`): give the wrapper the
sampler's `set_epoch`.

It can go when `BatchSamplerShard` passes the epoch on: tests/test_workarounds.py's
`test_accelerate_batch_sampler_shard_still_has_no_set_epoch` then fails.
"""

from __future__ import annotations

from typing import Any


def forward_set_epoch(dataloader: Any) -> bool:
    """When `dataloader` (as the Trainer prepared it) wraps a batch sampler that has `set_epoch` in a
    `BatchSamplerShard` that has none, give the wrapper the sampler's. Returns True when it did; False with one
    process (no wrapper)."""
    shard = getattr(dataloader, "batch_sampler", None)
    sampler = getattr(shard, "batch_sampler", None)
    if sampler is None or not hasattr(sampler, "set_epoch") or hasattr(shard, "set_epoch"):
        return False
    shard.set_epoch = sampler.set_epoch  # Trainer reaches it through this wrapper when resuming mid-epoch
    return True
