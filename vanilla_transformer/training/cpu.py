"""Which CPUs a process may use and how many PyTorch threads to run on them: shared by training and translating, and
recorded with each checkpoint so that a resumed run sums its floats as the run did; and whether the CPU multiplies
bf16 matrices in hardware."""

from __future__ import annotations

import json
import math
import os
import time

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

TRAINER_STATE_NAME = "trainer_state.json"  # transformers.trainer's name (importing transformers.trainer loads datasets)


PROC_STAT = "/proc/stat"  # CPU times since boot: the line "cpu" of all CPUs, then one "cpuN" line per CPU
CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"  # cgroup v2 CPU quota: "<quota> <period>" in µs, or "max <period>"


def process_cpus() -> set[int] | None:
    """The CPUs this process may run on (``os.sched_getaffinity``: taskset, cpusets, a container's CPUs), or None
    where the platform does not tell (not Linux)."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def cgroup_cpu_limit() -> int | None:
    """The CPUs that the cgroup v2 CPU quota (``CGROUP_CPU_MAX``) pays for, rounded up: a quota of 150000 µs per period
    of 100000 µs gives 2. None without a quota ("max") or without the file (cgroup v1, not Linux)."""
    try:
        with open(CGROUP_CPU_MAX) as f:
            quota, period = f.read().split()[:2]
        return None if quota == "max" else max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError, ZeroDivisionError):
        return None


def busy_cpus(seconds: float = 0.25) -> float:
    """How many of the CPUs this process may run on (``process_cpus``) other work keeps busy, from their lines of
    /proc/stat over `seconds`; from the line of all CPUs where the affinity is unknown, 0.0 where /proc/stat is
    unreadable (e.g. not on Linux)."""
    cpus = process_cpus()

    def sample() -> dict[str, tuple[int, int]]:
        with open(PROC_STAT) as f:
            rows = [line.split() for line in f if line.startswith("cpu")]
        return {row[0]: (sum(map(int, row[1:])), int(row[4]) + int(row[5])) for row in rows}  # all, idle + iowait

    try:
        before = sample()
        time.sleep(seconds)
        after = sample()
    except (OSError, ValueError, IndexError):
        return 0.0
    names = [f"cpu{cpu}" for cpu in sorted(cpus or ())]
    scale = 1
    if not names or not all(name in before and name in after for name in names):
        names, scale = ["cpu"], (os.cpu_count() or 1)
    busy = 0.0
    for name in names:
        total, idle = (a - b for a, b in zip(after[name], before[name]))
        busy += max(0.0, 1.0 - idle / total) if total > 0 else 0.0
    return busy * scale


def set_cpu_threads(threads: int | None = None, recorded: int | None = None) -> str:
    """Choose PyTorch's CPU threads for training or translating, and say how in a few words.

    PyTorch's default, one thread per physical core, is fastest on an idle machine, but when another job holds a core
    the threads spin waiting for the one that shares it, and training slows down several-fold
    (docs/training.md#a-machine-shared-with-other-work). So
    unless `threads` (the scripts' --threads) or OMP_NUM_THREADS says otherwise, only the cores idle at start are used,
    among the CPUs this process may run on (its affinity) and no more than its cgroup's CPU quota pays for.
    Several processes (accelerate launch) and GPU runs keep PyTorch's default.

    `recorded`: the count of the run a resumed run continues (``recorded_threads``), taken unless `threads` or
    OMP_NUM_THREADS is given, so that the resumed run sums its floats as the run did (the thread count decides how a
    sum is split into partial sums)."""
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"--threads {threads!r} is invalid; it must be a positive number of threads.")
        torch.set_num_threads(threads)
        return f"{threads} (--threads)"
    if "OMP_NUM_THREADS" in os.environ:
        return f"{torch.get_num_threads()} (OMP_NUM_THREADS)"
    if recorded is not None:
        torch.set_num_threads(recorded)
        return f"{recorded} (as the run that saved the checkpoint; --threads to choose)"
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 or torch.accelerator.is_available():
        return f"{torch.get_num_threads()} (PyTorch's default)"
    default = torch.get_num_threads()
    cpus = process_cpus()
    count = len(cpus) if cpus else (os.cpu_count() or 1)
    quota = cgroup_cpu_limit()
    busy = busy_cpus()
    chosen = max(1, min(default, count, quota or count, int(count - busy + 0.5)))
    torch.set_num_threads(chosen)
    if chosen == default:
        return f"{chosen}"
    reasons = [f"this process may run on {count} CPUs"] if count < default else []
    reasons += [f"its cgroup's CPU quota pays for {quota}"] if quota is not None and quota < default else []
    reasons += [f"other work keeps {busy:.1f} CPUs busy"] if int(count - busy + 0.5) < min(default, count) else []
    return f"{chosen} of {default}: {', '.join(reasons)} (--threads to choose)"


# x86 features whose instructions multiply bf16 matrices (AMX tiles; AVX-512 BF16 dot products), as PyTorch names them
NATIVE_BF16_FEATURES = ("amx_bf16", "avx512_bf16")


def native_bf16_matmul() -> str | None:
    """The feature (``NATIVE_BF16_FEATURES``) with which this CPU multiplies bf16 matrices in hardware, as PyTorch
    detects it (``torch.cpu.get_capabilities``), or None: a CPU without either, or a PyTorch without that function.
    Where it is present, a bf16 product runs several times faster than a float32 one
    (docs/performance.md#why-bf16-the-eager-attention-and-kernel-caches)."""
    get_capabilities = getattr(torch.cpu, "get_capabilities", None)
    if get_capabilities is None:
        return None
    try:
        capabilities = get_capabilities()
    except RuntimeError:  # cpuinfo could not read the CPU
        return None
    return next((feature for feature in NATIVE_BF16_FEATURES if capabilities.get(feature)), None)


class CpuThreadsCallback(TrainerCallback, ExportableState):
    """Saves the run's CPU thread count with every checkpoint (``trainer_state.json``'s ``stateful_callbacks``), where
    ``recorded_threads`` reads it back when the run resumes. `threads`: what the Trainer passes when it restores the
    state; the count saved is always PyTorch's at the time of the save."""

    def __init__(self, threads: int | None = None):
        self.threads = threads

    def state(self) -> dict:
        return {"args": {"threads": torch.get_num_threads()}}

    def on_train_begin(self, args, state, control, **kwargs):
        # a checkpoint saved without this callback has no entry, which the Trainer's next save would look up
        state.stateful_callbacks[type(self).__name__] = self.state()


def recorded_threads(checkpoint: str | os.PathLike | None) -> int | None:
    """The CPU thread count of the run that saved `checkpoint` (``CpuThreadsCallback``), or None: no checkpoint, or
    one saved without that record."""
    if checkpoint is None:
        return None
    try:
        with open(os.path.join(checkpoint, TRAINER_STATE_NAME)) as f:
            saved = json.load(f).get("stateful_callbacks", {}).get(CpuThreadsCallback.__name__)
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(saved, list):
        saved = saved[-1] if saved else None
    threads = saved.get("args", {}).get("threads") if isinstance(saved, dict) else None
    return threads if isinstance(threads, int) and not isinstance(threads, bool) and threads > 0 else None
