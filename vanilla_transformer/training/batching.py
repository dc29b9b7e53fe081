"""Token-based batching: fairseq's ``--max-tokens`` for transformers' ``Seq2SeqTrainer``, and what measures it
(``padding_efficiency``, ``compare_batchings``).

The paper batched "sentence pairs together by approximate sequence length", about 25,000 source and 25,000 target
tokens per step (§5.1). A fixed number of sentences per batch wastes compute on padding when lengths vary, and makes
the number of tokens per step (what the learning-rate schedule really sees) vary with them. Here pairs are sorted by
length and packed greedily into batches whose *padded* size, sentences × longest sentence, stays within
``max_tokens`` on the source side and on the target side each.

As in fairseq, the batches are built once (for a given seed) and only their order is shuffled each epoch, with
``seed + epoch``, so every process computes the same list and the number of batches per epoch never changes (the
Trainer reads it once to plan its steps).

Several processes: every rank builds the same batch list and takes every ``num_replicas``-th batch of the epoch's
order. So that ranks take equal numbers of batches (they must, or the gradient all-reduce would wait forever) without
repeating or dropping a pair, the list is first made a multiple of ``num_replicas`` long by halving the batches with
the most sentences. Within an epoch every pair is therefore seen exactly once, on exactly one rank. Only when halving
cannot get there (a tiny dataset in which almost every pair fills a batch alone) are the shortest batches repeated,
fewer than ``num_replicas`` of them, with a warning.
"""

from __future__ import annotations

import heapq
import math
import random
import warnings
from collections.abc import Iterator, Sequence

import datasets
import pyarrow.compute
import torch
from torch.utils.data import DataLoader
from transformers import Seq2SeqTrainer
from transformers.trainer_pt_utils import BatchRebalanceSampler
from transformers.trainer_utils import has_length

from .workarounds import accelerate_batch_sampler_shard, transformers_no_batch_sampler_hook


def _round_up(length: int, multiple: int | None) -> int:
    return length if not multiple else math.ceil(length / multiple) * multiple


def pack_by_tokens(
    source_lengths: Sequence[int],
    target_lengths: Sequence[int] | None,
    max_tokens: int,
    seed: int = 0,
    pad_to_multiple_of: int | None = None,
) -> list[list[int]]:
    """Group pair indices into batches of similar length whose padded size fits ``max_tokens`` on each side.

    Pairs are sorted by (source length, target length), ties broken by a ``seed``-ed shuffle so that pairs of equal
    length do not always share a batch in dataset order; then consecutive pairs fill a batch while
    ``len(batch) × round_up(longest, pad_to_multiple_of) <= max_tokens`` holds for the source and for the target.
    Returns the batches in length order.
    """
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens <= 0:
        raise ValueError(f"max_tokens={max_tokens!r} is invalid; it must be a positive integer.")
    if target_lengths is not None and len(target_lengths) != len(source_lengths):
        raise ValueError(
            f"target_lengths has {len(target_lengths)} entries but source_lengths has {len(source_lengths)}; "
            "there must be one per sentence pair."
        )
    targets = target_lengths if target_lengths is not None else [0] * len(source_lengths)
    order = list(range(len(source_lengths)))
    random.Random(seed).shuffle(order)
    order.sort(key=lambda i: (source_lengths[i], targets[i]))  # stable: equal lengths keep the shuffled order

    batches: list[list[int]] = []
    batch: list[int] = []
    longest_source = longest_target = 0
    for i in order:
        source = _round_up(source_lengths[i], pad_to_multiple_of)
        target = _round_up(targets[i], pad_to_multiple_of)
        if max(source, target) > max_tokens:
            raise ValueError(
                f"Sentence pair {i} has {source_lengths[i]} source and {targets[i]} target tokens (padded to "
                f"{source} and {target}), more than max_tokens={max_tokens}; raise max_tokens, or leave such pairs "
                "out (train.py drops pairs longer than --max_source_length / --max_target_length)."
            )
        size = len(batch) + 1
        if batch and (
            size * max(longest_source, source) > max_tokens or size * max(longest_target, target) > max_tokens
        ):
            batches.append(batch)
            batch, longest_source, longest_target = [], 0, 0
        batch.append(i)
        longest_source, longest_target = max(longest_source, source), max(longest_target, target)
    if batch:
        batches.append(batch)
    return batches


def split_to_multiple(batches: list[list[int]], multiple: int) -> list[list[int]]:
    """Make the number of batches a multiple of ``multiple`` by halving the batches with the most sentences.

    A half of a batch pads to at most the batch's own length, so it stays within the token bound, and no index is
    repeated or dropped. When there are too few indices for that (fewer than the next multiple), the first batches
    (the shortest, for length-sorted input) are repeated instead, fewer than ``multiple`` of them, with a warning.
    """
    if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple <= 0:
        raise ValueError(f"multiple={multiple!r} is invalid; it must be a positive integer.")
    wanted = math.ceil(len(batches) / multiple) * multiple
    batches = [list(batch) for batch in batches]
    pairs = sum(len(batch) for batch in batches)
    if wanted > pairs:
        repeats = wanted - len(batches)
        warnings.warn(
            f"Token batching: {pairs} sentence pairs make {len(batches)} batches, which cannot be shared equally among "
            f"{multiple} processes without repeats; {repeats} batch(es) are seen twice per epoch. Use more data, a "
            "larger max_tokens_per_batch or fewer processes to avoid it.",
            stacklevel=2,
        )
        return batches + [list(batches[k % len(batches)]) for k in range(repeats)]
    # max-heap on batch size; the index keeps the result deterministic among equal sizes
    heap = [(-len(batch), k) for k, batch in enumerate(batches)]
    heapq.heapify(heap)
    while len(batches) < wanted:
        _, k = heapq.heappop(heap)
        batch = batches[k]
        half = len(batch) // 2  # batches are length-sorted, so this splits shorter from longer pairs
        batches[k], tail = batch[:half], batch[half:]
        batches.append(tail)
        heapq.heappush(heap, (-len(batches[k]), k))
        heapq.heappush(heap, (-len(tail), len(batches) - 1))
    return batches


class TokenBatchSampler(BatchRebalanceSampler):
    """A batch sampler (``DataLoader(batch_sampler=...)``) of length-grouped batches bounded by padded tokens.

    It shares the batches out among the processes itself, as transformers' ``BatchRebalanceSampler`` does: a
    subclass of it, so that the Trainer passes it to its DataLoader as a rank-aware batch sampler, which Accelerate
    must not shard again (`workarounds.transformers_no_batch_sampler_hook`). None of that class's code is used.

    Args:
        source_lengths: tokens in each source sentence (``len(input_ids)``).
        target_lengths: tokens in each target sentence (``len(labels)``), or None to bound the source side only.
        max_tokens: the most padded tokens a batch may hold, on the source side and on the target side each.
        seed: fixes the tie-breaking among equal lengths and, with the epoch, the order of the batches.
        shuffle: shuffle the order of the batches each epoch (False: shortest first).
        num_replicas / rank: the data-parallel world; each rank yields its own share of every epoch's batches.
            By default they come from ``torch.distributed`` when it is initialised, else 1 and 0.
        pad_to_multiple_of: the collator's ``pad_to_multiple_of``, so that the bound holds after its padding.

    Call ``set_epoch(epoch)`` before each epoch (Trainer and accelerate do) to get a new order.
    """

    def __init__(
        self,
        source_lengths: Sequence[int],
        target_lengths: Sequence[int] | None,
        max_tokens: int,
        seed: int = 0,
        shuffle: bool = True,
        num_replicas: int | None = None,
        rank: int | None = None,
        pad_to_multiple_of: int | None = None,
    ):
        self.max_tokens = max_tokens
        self.seed = seed
        self.shuffle = shuffle
        self.pad_to_multiple_of = pad_to_multiple_of
        self.epoch = 0
        self.source_lengths = list(source_lengths)
        self.target_lengths = list(target_lengths) if target_lengths is not None else None
        if not self.source_lengths:
            raise ValueError("TokenBatchSampler got no sentence pairs (source_lengths is empty).")
        self._length_sorted = pack_by_tokens(
            self.source_lengths, self.target_lengths, max_tokens, seed=seed, pad_to_multiple_of=pad_to_multiple_of
        )
        if num_replicas is None:
            distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
            num_replicas = torch.distributed.get_world_size() if distributed else 1
            rank = (torch.distributed.get_rank() if distributed else 0) if rank is None else rank
        self.set_distributed(num_replicas, 0 if rank is None else rank)

    def set_distributed(self, num_replicas: int, rank: int) -> None:
        """Share the batches among ``num_replicas`` processes, this one being ``rank``."""
        if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
            raise ValueError(f"num_replicas={num_replicas!r} is invalid; it must be a positive integer.")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < num_replicas:
            raise ValueError(f"rank={rank!r} is invalid; it must be in [0, num_replicas={num_replicas}).")
        self.num_replicas, self.rank = num_replicas, rank
        self.batches = split_to_multiple(self._length_sorted, num_replicas)  # the global list, same on every rank

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def epoch_order(self) -> list[list[int]]:
        """All ranks' batches for the current epoch, in the order they are dealt out."""
        if not self.shuffle:
            return self.batches
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return [self.batches[k] for k in torch.randperm(len(self.batches), generator=generator).tolist()]

    def __iter__(self) -> Iterator[list[int]]:
        yield from self.epoch_order()[self.rank :: self.num_replicas]

    def __len__(self) -> int:
        return len(self.batches) // self.num_replicas


def padding_efficiency(
    batches: Sequence[Sequence[int]],
    source_lengths: Sequence[int],
    target_lengths: Sequence[int] | None = None,
    pad_to_multiple_of: int | None = None,
) -> dict[str, float]:
    """Real tokens / padded tokens of a batching, for the source side, the target side and both together.

    A batch pads every sentence to its longest one (rounded up to ``pad_to_multiple_of``), as
    ``DataCollatorForSeq2Seq`` does; 1.0 means no padding at all.
    """
    sides = {"source": source_lengths}
    if target_lengths is not None:
        sides["target"] = target_lengths
    real = dict.fromkeys(sides, 0)
    padded = dict.fromkeys(sides, 0)
    for batch in batches:
        for side, lengths in sides.items():
            batch_lengths = [lengths[i] for i in batch]
            real[side] += sum(batch_lengths)
            padded[side] += len(batch) * _round_up(max(batch_lengths), pad_to_multiple_of)
    result = {side: real[side] / padded[side] for side in sides}
    result["total"] = sum(real.values()) / sum(padded.values())
    return result


def sentence_batches(num_pairs: int, batch_size: int, seed: int = 0) -> list[list[int]]:
    """Plain sentence batching, what Trainer does by default: a random order cut into ``batch_size`` pairs."""
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(num_pairs, generator=generator).tolist()
    return [order[start : start + batch_size] for start in range(0, num_pairs, batch_size)]


def _padding_figures(batches: list[list[int]], source: list[int], target: list[int], multiple: int | None) -> dict:
    def padded_length(length: int) -> int:
        return -(-length // multiple) * multiple if multiple else length

    padded = sum(
        len(batch) * (padded_length(max(source[i] for i in batch)) + padded_length(max(target[i] for i in batch)))
        for batch in batches
    )
    return {
        "batches": len(batches),
        "pairs": len(source) / len(batches),
        "padded": padded / len(batches),
        **padding_efficiency(batches, source, target, pad_to_multiple_of=multiple),
    }


def compare_batchings(
    source: list[int],
    target: list[int],
    batch_sizes: Sequence[int],
    budgets: Sequence[int],
    seed: int = 0,
    pad_to_multiple_of: int | None = None,
) -> list[dict]:
    """scripts/padding_efficiency.py's rows: for sentence batches of each of `batch_sizes` and token batches of each
    of `budgets` (max_tokens_per_batch), the number of batches, pairs and padded tokens per batch, and the padding
    efficiency of each side (`padding_efficiency`)."""
    rows = []
    for size in batch_sizes:
        batches = sentence_batches(len(source), size, seed=seed)
        figures = _padding_figures(batches, source, target, pad_to_multiple_of)
        rows.append({"batching": f"sentences, batch_size={size}", **figures})
    for budget in budgets:
        sampler = TokenBatchSampler(source, target, budget, seed=seed, pad_to_multiple_of=pad_to_multiple_of)
        figures = _padding_figures(sampler.batches, source, target, pad_to_multiple_of)
        rows.append({"batching": f"tokens, max_tokens_per_batch={budget}", **figures})
    return rows


def sequence_lengths(dataset) -> tuple[list[int], list[int] | None]:
    """(source lengths, target lengths or None) of a tokenized dataset with ``input_ids`` and optional ``labels``."""
    if isinstance(dataset, datasets.Dataset):
        columns = dataset.column_names
        if "input_ids" not in columns:
            raise ValueError(f"Token batching needs an `input_ids` column; the dataset has {columns}.")
        source, target = [], [] if "labels" in columns else None
        # list lengths straight from Arrow, a chunk at a time: no token ids are copied into Python lists
        for chunk in dataset.with_format("arrow").iter(batch_size=100_000):
            source += pyarrow.compute.list_value_length(chunk["input_ids"]).to_pylist()
            if target is not None:
                target += pyarrow.compute.list_value_length(chunk["labels"]).to_pylist()
        return source, target
    first = dataset[0]
    if "input_ids" not in first:
        raise ValueError(f"Token batching needs examples with `input_ids`; the first example has {list(first)}.")
    source, target = [], [] if "labels" in first else None
    for i in range(len(dataset)):
        example = dataset[i]
        source.append(len(example["input_ids"]))
        if target is not None:
            target.append(len(example["labels"]))
    return source, target


def _check_max_tokens(value):
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ValueError(f"max_tokens_per_batch={value!r} is invalid; it must be a positive integer or None.")
    return value


class TokenBatchingSeq2SeqTrainer(Seq2SeqTrainer):
    """``Seq2SeqTrainer`` whose training batches hold up to ``max_tokens_per_batch`` padded tokens per side.

    A drop-in replacement: the same arguments as ``Seq2SeqTrainer`` plus ``max_tokens_per_batch`` (None keeps
    ``per_device_train_batch_size`` sentence batching). The bound is per process and per micro-batch: with gradient
    accumulation and several processes, an optimizer step sees up to ``max_tokens_per_batch ×
    gradient_accumulation_steps × processes`` tokens per side. Evaluation keeps sentence batches.
    ``per_device_train_batch_size`` then only appears in Trainer's log of its plan.

    The loss of an optimizer step is the mean over all its target tokens (Trainer passes ``num_items_in_batch``,
    summed over the micro-batches and processes), so batches of different sizes weigh by their tokens.
    """

    def __init__(self, *args, max_tokens_per_batch: int | None = None, **kwargs) -> None:
        self.max_tokens_per_batch = _check_max_tokens(max_tokens_per_batch)
        super().__init__(*args, **kwargs)

    def get_train_dataloader(self) -> DataLoader:
        """Trainer's training DataLoader; with ``max_tokens_per_batch``, its batch sampler is a `TokenBatchSampler`,
        which transformers passes on as a rank-aware batch sampler (each process gets its own share)."""
        if self.max_tokens_per_batch is None:
            return super().get_train_dataloader()
        if self.train_dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        if isinstance(self.train_dataset, torch.utils.data.IterableDataset) or not has_length(self.train_dataset):
            raise ValueError(
                "max_tokens_per_batch needs a map-style training dataset with a length (lengths are sorted up front); "
                "the training dataset is iterable."
            )
        config = self.accelerator.dataloader_config
        if config.split_batches or config.dispatch_batches:
            raise ValueError(
                "max_tokens_per_batch cannot be combined with accelerator_config split_batches=True or "
                "dispatch_batches=True: each process builds its own token-bounded batches."
            )
        # the Trainer takes no batch sampler publicly (workarounds.transformers_no_batch_sampler_hook)
        dataloader = transformers_no_batch_sampler_hook.train_dataloader(self, self.token_batch_sampler)
        accelerate_batch_sampler_shard.forward_set_epoch(dataloader)  # resuming mid-epoch with several processes
        return dataloader

    def token_batch_sampler(self, dataset) -> TokenBatchSampler:
        """The `TokenBatchSampler` of a training dataset (its unused columns already removed), for this process."""
        source_lengths, target_lengths = sequence_lengths(dataset)
        return TokenBatchSampler(
            source_lengths,
            target_lengths,
            self.max_tokens_per_batch,
            seed=self.args.data_seed if self.args.data_seed is not None else self.args.seed,
            num_replicas=self.args.world_size,
            rank=self.args.process_index,
            pad_to_multiple_of=getattr(self.data_collator, "pad_to_multiple_of", None),
        )


__all__ = [
    "TokenBatchSampler",
    "compare_batchings",
    "TokenBatchingSeq2SeqTrainer",
    "pack_by_tokens",
    "padding_efficiency",
    "sentence_batches",
    "sequence_lengths",
    "split_to_multiple",
]
