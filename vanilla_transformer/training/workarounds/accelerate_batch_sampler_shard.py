"""Workaround for Accelerate's `BatchSamplerShard`, which shards a batch sampler that is already shared out by rank.

Written for Accelerate 1.15; checked with 1.16.0.

The limit: with several processes, `Accelerator.prepare` wraps a DataLoader's batch sampler in a `BatchSamplerShard`
that deals out whole batches round-robin and pads the last round with repeats when their count is uneven; it has no
way to be told that the batch sampler shares itself out already. The token batches (`batching.TokenBatchSampler`)
must be shared out by the sampler itself (it evens the count without repeats), and a wrapper that shards them again
would keep a half of each rank's half. `BatchSamplerShard` also has no `set_epoch`, so Trainer's resume (which calls
`train_dataloader.batch_sampler.batch_sampler.set_epoch` once `skip_first_batches` has wrapped the loader) would not
reach the sampler.

The workaround (`take_over_sharding`): give the sampler the wrapper's process count and index, then make the wrapper
a pass-through (`num_processes, process_index = 1, 0`) and forward its `set_epoch` to the sampler. transformers 5.24
does the same for its own `BatchRebalanceSampler` (`Trainer._get_dataloader`).

It can go when `prepare` leaves a rank-aware batch sampler alone (an option of `DataLoaderConfiguration`, say):
tests/test_workarounds.py's `test_accelerate_still_shards_a_batch_sampler_again` then fails. It must change when
`test_a_pass_through_batch_sampler_shard_yields_the_samplers_batches` fails (the wrapper's fields changed).
"""

from __future__ import annotations

from typing import Any


def take_over_sharding(dataloader: Any, sampler: Any) -> bool:
    """When `dataloader` (as `Accelerator.prepare` returned it) wraps `sampler` (a batch sampler with
    `set_distributed(num_replicas, rank)` and `set_epoch(epoch)`) in a `BatchSamplerShard`, let the sampler share the
    batches out and make the wrapper a pass-through (its process count and index already account for tensor and
    context parallel groups). Returns True when it did; False with one process (no wrapper)."""
    shard = getattr(dataloader, "batch_sampler", None)
    if shard is sampler or getattr(shard, "batch_sampler", None) is not sampler:
        return False
    sampler.set_distributed(shard.num_processes, shard.process_index)
    shard.num_processes, shard.process_index = 1, 0
    # Trainer reaches set_epoch through this wrapper when resuming mid-epoch (skip_first_batches wraps it)
    shard.set_epoch = sampler.set_epoch
    return True
