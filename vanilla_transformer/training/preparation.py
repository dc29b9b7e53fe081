"""Preparing the data once for many processes: training the tokenizer and tokenising run first on process 0, then on
the first process of each other machine, then on the rest, which load what the earlier ones left (the tokenizer saved
in --output_dir; the tokenised splits in `datasets`' cache, whose fingerprints are the same on every process).

The processes that wait do so in a gloo group made for the wait, with --preparation_timeout: the default process
group's timeout (--ddp_timeout, 30 minutes) is too short for a big corpus, and it stays as it is for training, where
a process that stops answering should end the run soon. A process that fails ends the others through the launcher
(torchrun, accelerate launch), not through this timeout."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from datetime import timedelta

import torch

logger = logging.getLogger("train")

DEFAULT_TIMEOUT = 24 * 3600  # seconds: a day


def turn(process_index: int, local_process_index: int) -> int:
    """When a process prepares: 0 (process 0), 1 (the first process of another machine), 2 (the others)."""
    return 0 if process_index == 0 else 1 if local_process_index == 0 else 2


@contextlib.contextmanager
def in_turn(training_args, what: str, timeout: float = DEFAULT_TIMEOUT) -> Iterator[int]:
    """Run the body on every process in its `turn`, each turn after the earlier ones have finished it; yields the
    turn. `what` (e.g. "training the tokenizer") names the wait: process 0 prints how long the others will wait, the
    first process of each other machine logs that it waits. One process, or no process group: the body runs at
    once (turn 0)."""
    if training_args.world_size <= 1 or not torch.distributed.is_initialized():
        yield 0
        return
    mine = turn(training_args.process_index, training_args.local_process_index)
    hours = f"{timeout / 3600:g} h" if timeout >= 3600 else f"{timeout:g} s"
    if mine == 0:
        others = training_args.world_size - 1
        waits = f"{others} other processes wait" if others > 1 else "1 other process waits"
        print(f"train.py: {what}; {waits} for it up to {hours} (--preparation_timeout)")
    elif mine == 1:
        logger.warning(
            f"process {training_args.process_index}: waiting up to {hours} (--preparation_timeout) for process 0 "
            f"to finish {what}"
        )
    group = torch.distributed.new_group(backend="gloo", timeout=timedelta(seconds=timeout))
    for earlier in (0, 1):
        if mine > earlier:
            torch.distributed.barrier(group=group)
    yield mine
    for later in (0, 1):
        if mine <= later:
            torch.distributed.barrier(group=group)
    # only on success: a process that failed leaves the group as it is (the others still wait in it)
    torch.distributed.destroy_process_group(group)
