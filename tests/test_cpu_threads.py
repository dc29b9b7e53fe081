"""CPU threads: only the idle cores by default, so that a machine shared with other work does not slow training down.

The slowdown itself is measured, not tested (docs/training.md): here, the choice that set_cpu_threads makes.
"""

import os

import pytest
import torch
from conftest import load_script

from vanilla_transformer import training


@pytest.fixture(autouse=True)
def _restore_threads(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    yield
    torch.set_num_threads(before)


def test_busy_cpus_reads_the_machine():
    assert 0.0 <= training.busy_cpus(0.05) <= os.cpu_count()


@pytest.mark.parametrize("busy, expected", [(0.1, 4), (0.9, 3), (1.0, 3), (2.2, 2), (3.9, 1), (8.0, 1)])
def test_only_idle_cores_get_threads(monkeypatch, busy, expected):
    monkeypatch.setattr(training, "busy_cpus", lambda: busy)
    monkeypatch.setattr(training.os, "cpu_count", lambda: 4)
    torch.set_num_threads(4)  # PyTorch's default on a 4-core machine
    message = training.set_cpu_threads()
    assert torch.get_num_threads() == expected
    assert ("busy" in message) == (expected < 4)


def test_never_more_threads_than_pytorch_would_use(monkeypatch):
    monkeypatch.setattr(training, "busy_cpus", lambda: 0.0)
    monkeypatch.setattr(training.os, "cpu_count", lambda: 8)  # e.g. 4 cores with 2 hyper-threads each
    torch.set_num_threads(4)
    training.set_cpu_threads()
    assert torch.get_num_threads() == 4


def test_the_flag_and_the_environment_win(monkeypatch):
    monkeypatch.setattr(training, "busy_cpus", lambda: pytest.fail("must not look at the load"))
    assert training.set_cpu_threads(3) == "3 (--threads)" and torch.get_num_threads() == 3
    torch.set_num_threads(2)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert training.set_cpu_threads() == "2 (OMP_NUM_THREADS)" and torch.get_num_threads() == 2
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setenv("WORLD_SIZE", "2")  # accelerate launch: each process keeps its launcher's setting
    assert training.set_cpu_threads() == "2 (PyTorch's default)"
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="--threads"):
            training.set_cpu_threads(bad)


def test_train_and_translate_refuse_a_bad_thread_count(tmp_path, capsys):
    with pytest.raises(SystemExit, match="--threads 0 is invalid"):
        load_script("train").main(["--output_dir", str(tmp_path), "--threads", "0"])
    with pytest.raises(SystemExit, match="--threads 0 is invalid"):
        load_script("translate").main(["--model_dir", str(tmp_path), "--text", "eins", "--threads", "0"])
