"""Workaround for datasets 5.2: `Dataset.map(num_proc=1)` starts a pool of one worker process.

Written for datasets 5.2.0 (installed).

The limit: `Dataset.map` (and `filter`, which calls it) takes the multiprocessing path for any `num_proc >= 1`: it
starts a `multiprocess` pool, even of one worker, and while doing so replaces `os.environ` by a copy of itself
(`arrow_dataset.py`: `os.environ = prev_env`). One process is the in-process path, which `num_proc=None` takes.

The workaround (`map_num_proc`): pass None for one process.

It can go when `map(num_proc=1)` runs in the calling process: tests/test_workarounds.py's
`test_datasets_still_starts_a_pool_for_one_process` then fails.
"""

from __future__ import annotations


def map_num_proc(num_proc: int | None) -> int | None:
    """The `num_proc` to give `Dataset.map`/`filter` for `num_proc` processes: None (in this process) for one or
    None, the number itself above one."""
    return num_proc if num_proc is not None and num_proc > 1 else None
