"""CPU threads: only the idle cores by default, so that a machine shared with other work does not slow training down;
only the CPUs the process may use; and a resumed run keeps the count of the run it continues.

The slowdown itself is measured, not tested (docs/training.md): here, the choice that set_cpu_threads makes.
"""

import json

import pytest
import torch
from conftest import TINY_OVERRIDES, load_script
from transformers import TrainerCallback

from vanilla_transformer.training import cpu, recipe


@pytest.fixture(autouse=True)
def _restore_threads(monkeypatch, tmp_path):
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(cpu, "CGROUP_CPU_MAX", str(tmp_path / "no-cgroup"), raising=False)  # no quota
    yield
    torch.set_num_threads(before)


def cpus(monkeypatch, count: int) -> None:
    """The process may run on CPUs 0..count-1 of a machine of 16."""
    monkeypatch.setattr(cpu.os, "sched_getaffinity", lambda pid: set(range(count)))
    monkeypatch.setattr(cpu.os, "cpu_count", lambda: 16)


def stat_line(name: str, busy: int, idle: int) -> str:
    """A /proc/stat CPU line: user nice system idle iowait irq softirq steal guest guest_nice, in ticks."""
    return f"{name} {busy} 0 0 {idle} 0 0 0 0 0 0\n"


@pytest.mark.parametrize("affinity", [True, False])
def test_busy_cpus_counts_the_cpus_of_the_process(monkeypatch, tmp_path, affinity):
    """Over 100 ticks: CPU 0 idle, CPU 1 half busy, CPU 2 busy, CPU 3 busy. The process runs on CPUs 0-2: 1.5 of them
    are busy. Where the affinity is unknown, the line of all CPUs counts: 2.5 of 4 (os.cpu_count)."""
    stat = tmp_path / "stat"
    busy_after = {"cpu": 250, "cpu0": 0, "cpu1": 50, "cpu2": 100, "cpu3": 100}

    def write(after: bool) -> None:
        ticks = {name: (busy, (400 if name == "cpu" else 100) - busy) for name, busy in busy_after.items()}
        stat.write_text("".join(stat_line(name, *(t if after else (0, 0))) for name, t in ticks.items()) + "intr 1\n")

    write(after=False)
    monkeypatch.setattr(cpu, "PROC_STAT", str(stat))
    monkeypatch.setattr(cpu.time, "sleep", lambda seconds: write(after=True))
    monkeypatch.setattr(cpu.os, "cpu_count", lambda: 4)
    if affinity:
        monkeypatch.setattr(cpu.os, "sched_getaffinity", lambda pid: {0, 1, 2})
    else:
        monkeypatch.delattr(cpu.os, "sched_getaffinity")
    assert cpu.busy_cpus() == pytest.approx(1.5 if affinity else 2.5)


def test_busy_cpus_without_proc_stat_is_zero(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu, "PROC_STAT", str(tmp_path / "missing"))
    assert cpu.busy_cpus(0.0) == 0.0


@pytest.mark.parametrize("busy, expected", [(0.1, 4), (0.9, 3), (1.0, 3), (2.2, 2), (3.9, 1), (8.0, 1)])
def test_only_idle_cores_get_threads(monkeypatch, busy, expected):
    monkeypatch.setattr(cpu, "busy_cpus", lambda: busy)
    monkeypatch.setattr(cpu.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    torch.set_num_threads(4)  # PyTorch's default on a 4-core machine
    message = cpu.set_cpu_threads()
    assert torch.get_num_threads() == expected
    assert ("busy" in message) == (expected < 4)


def test_never_more_threads_than_pytorch_would_use(monkeypatch):
    monkeypatch.setattr(cpu, "busy_cpus", lambda: 0.0)
    cpus(monkeypatch, 8)  # e.g. 4 cores with 2 hyper-threads each
    torch.set_num_threads(4)
    cpu.set_cpu_threads()
    assert torch.get_num_threads() == 4


def test_only_the_cpus_the_process_may_run_on(monkeypatch):
    """taskset -c 0 on a machine of 16: one thread, whatever the machine's other CPUs do."""
    monkeypatch.setattr(cpu, "busy_cpus", lambda: 0.0)
    cpus(monkeypatch, 1)
    torch.set_num_threads(4)
    message = cpu.set_cpu_threads()
    assert torch.get_num_threads() == 1 and "may run on 1 CPUs" in message


@pytest.mark.parametrize(
    "cpu_max, limit",
    [
        ("max 100000\n", None),
        ("200000 100000\n", 2),
        ("150000 100000\n", 2),
        ("250000 100000\n", 3),  # rounded up: not 2, as rounding down or to the nearest even would give
        ("0 100000\n", 1),  # a quota of nothing still leaves one thread
        ("x", None),
    ],
)
def test_cgroup_cpu_quota(monkeypatch, tmp_path, cpu_max, limit):
    (tmp_path / "cpu.max").write_text(cpu_max)
    monkeypatch.setattr(cpu, "CGROUP_CPU_MAX", str(tmp_path / "cpu.max"))
    assert cpu.cgroup_cpu_limit() == limit
    monkeypatch.setattr(cpu, "busy_cpus", lambda: 0.0)
    cpus(monkeypatch, 8)
    torch.set_num_threads(4)
    message = cpu.set_cpu_threads()
    assert torch.get_num_threads() == min(4, limit or 4) and ("quota" in message) == (limit is not None)


def test_a_checkpoint_gives_back_only_a_positive_thread_count(tmp_path):
    def recorded(entry) -> int | None:
        state = {"stateful_callbacks": {"CpuThreadsCallback": entry}}
        (tmp_path / "trainer_state.json").write_text(json.dumps(state))
        return cpu.recorded_threads(tmp_path)

    assert recorded({"args": {"threads": 3}}) == 3
    assert recorded([{"args": {"threads": 1}}, {"args": {"threads": 2}}]) == 2  # several records: the last
    for bad in (0, -1, True, 1.5, "2", None):
        assert recorded({"args": {"threads": bad}}) is None, bad
    assert recorded([]) is None and recorded("2") is None
    assert cpu.recorded_threads(tmp_path / "missing") is None


def test_no_cgroup_file_means_no_quota():  # the autouse fixture points the reader at a missing file
    assert cpu.cgroup_cpu_limit() is None


def test_the_flag_and_the_environment_win(monkeypatch):
    monkeypatch.setattr(cpu, "busy_cpus", lambda: pytest.fail("must not look at the load"))
    assert cpu.set_cpu_threads(3) == "3 (--threads)" and torch.get_num_threads() == 3
    torch.set_num_threads(2)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert cpu.set_cpu_threads() == "2 (OMP_NUM_THREADS)" and torch.get_num_threads() == 2
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert cpu.set_cpu_threads(recorded=3).startswith("3 (as the run") and torch.get_num_threads() == 3
    assert cpu.set_cpu_threads(1, recorded=3) == "1 (--threads)" and torch.get_num_threads() == 1
    torch.set_num_threads(2)
    monkeypatch.setenv("WORLD_SIZE", "2")  # accelerate launch: each process keeps its launcher's setting
    assert cpu.set_cpu_threads() == "2 (PyTorch's default)"
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="--threads"):
            cpu.set_cpu_threads(bad)


def test_train_and_translate_refuse_a_bad_thread_count(tmp_path, capsys):
    with pytest.raises(SystemExit, match="--threads 0 is invalid"):
        recipe.main(["--output_dir", str(tmp_path), "--threads", "0"])
    with pytest.raises(SystemExit, match="--threads 0 is invalid"):
        load_script("translate").main(["--model_dir", str(tmp_path), "--text", "eins", "--threads", "0"])


class Threads(TrainerCallback):
    """Records the thread count at every training step."""

    def __init__(self):
        self.seen = set()

    def on_step_end(self, args, state, control, **kwargs):
        self.seen.add(torch.get_num_threads())


def test_a_resumed_run_keeps_the_thread_count_of_the_run(monkeypatch, tmp_path):
    """The count is saved with each checkpoint and taken on resume, whatever the load then; --threads still wins."""
    out = tmp_path / "run"
    argv = ["--output_dir", str(out), "--do_train", "--max_steps", "2", "--save_strategy", "steps", "--save_steps", "1"]
    argv += ["--max_train_samples", "16", "--per_device_train_batch_size", "8", "--vocab_size", "300"]
    argv += ["--config_overrides", TINY_OVERRIDES, "--max_source_length", "32", "--max_target_length", "32"]
    argv += ["--disable_tqdm", "true", "--report_to", "none", "--use_cpu"]
    first = Threads()
    recipe.main([*argv, "--threads", "2"], callbacks=[first])
    assert first.seen == {2}
    state = json.loads((out / "checkpoint-1" / "trainer_state.json").read_text())
    assert state["stateful_callbacks"]["CpuThreadsCallback"] == {"args": {"threads": 2}}
    assert cpu.recorded_threads(out / "checkpoint-1") == 2 and cpu.recorded_threads(None) is None

    monkeypatch.setattr(cpu, "busy_cpus", lambda: 64.0)  # left to itself it would now choose 1 thread
    resumed = Threads()
    recipe.main([*argv, "--resume_from_checkpoint", str(out / "checkpoint-1")], callbacks=[resumed])
    assert resumed.seen == {2} and cpu.recorded_threads(out / "checkpoint-2") == 2
    chosen = Threads()
    recipe.main([*argv, "--resume_from_checkpoint", str(out / "checkpoint-1"), "--threads", "1"], callbacks=[chosen])
    assert chosen.seen == {1} and cpu.recorded_threads(out / "checkpoint-2") == 1
