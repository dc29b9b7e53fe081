"""Workaround for transformers' `Trainer`, which takes no training batch sampler through a public hook.

Written for transformers 5.25.0 (installed).

The limit: `Trainer.get_train_dataloader` builds its DataLoader with the private `Trainer._get_dataloader`, which
removes the unused columns, seeds the workers, lets Accelerate prepare the loader, and hands a rank-aware batch sampler
(a `BatchRebalanceSampler`, which `batching.TokenBatchSampler` is) to the DataLoader as its batch sampler, with
Accelerate's sharding made a pass-through. The sampler comes from the private `_get_train_sampler`; neither the
Trainer's arguments nor `TrainingArguments.train_sampling_strategy` take one of the caller's. A subclass can only copy
`_get_dataloader` or call it.

The workaround (`train_dataloader`, in `batching.TokenBatchingSeq2SeqTrainer.get_train_dataloader`): call
`_get_dataloader` as `get_train_dataloader` does, with the token batch sampler's factory as its `sampler_fn`.

It can go when the Trainer or its arguments take a batch sampler: tests/test_workarounds.py's
`test_transformers_still_takes_no_batch_sampler` then fails. It must change when `_get_dataloader` changes
(`test_the_trainer_dataloader_the_token_batches_go_through_still_exists`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.utils.data import DataLoader, Sampler
    from transformers import Trainer


def train_dataloader(trainer: Trainer, sampler_fn: Callable[[object], Sampler]) -> DataLoader:
    """The DataLoader `trainer.get_train_dataloader()` would build, its sampler made by `sampler_fn(dataset)` (called
    with the training dataset, its unused columns removed)."""
    return trainer._get_dataloader(
        trainer.train_dataset,
        description="Training",
        batch_size=trainer.args.train_batch_size,  # unused by a batch sampler, which makes the batches
        sampler_fn=sampler_fn,
        is_training=True,
    )
