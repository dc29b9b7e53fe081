"""Preparing the data once for several processes (training/preparation.py): process 0 first, then the first process
of each other machine, then the rest, waiting in a group of their own whose timeout is --preparation_timeout, not
the default group's (--ddp_timeout)."""

import contextlib
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from conftest import ROOT, free_port
from datasets import Dataset, DatasetDict

from vanilla_transformer.training import recipe
from vanilla_transformer.training.data import DataError
from vanilla_transformer.training.preparation import turn

# One process of a 3-process gloo group whose default timeout (the --ddp_timeout) is 3 s: ranks 0 and 1 on one
# machine, rank 2 alone on another. Process 0 prepares for 6 s, longer than that timeout.
PROCESS = """
import datetime, json, os, sys, time
from types import SimpleNamespace
import torch
from vanilla_transformer.training.preparation import in_turn

rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
torch.distributed.init_process_group("gloo", rank=rank, world_size=3, timeout=datetime.timedelta(seconds=3))
args = SimpleNamespace(world_size=3, process_index=rank, local_process_index=local)
with in_turn(args, "sleeping", timeout=120) as turn:
    start = time.time()
    time.sleep(6 if turn == 0 else 0.2)
    record = [turn, start, time.time()]
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(record, f)
"""


def test_turns():
    assert [turn(0, 0), turn(1, 1), turn(2, 0), turn(3, 1)] == [0, 2, 1, 2]


@pytest.mark.distributed
def test_processes_prepare_in_turn_and_wait_past_the_process_group_timeout(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="3")
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", PROCESS, str(tmp_path)],
            env=dict(env, RANK=str(rank), LOCAL_RANK=str(local)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank, local in ((0, 0), (1, 1), (2, 0))
    ]
    outputs = [process.communicate(timeout=180) for process in processes]
    for process, (_, err) in zip(processes, outputs):
        assert process.returncode == 0, err[-3000:]
    assert "train.py: sleeping; 2 other processes wait for it up to 120 s (--preparation_timeout)" in outputs[0][0]
    assert "process 2: waiting up to 120 s (--preparation_timeout) for process 0 to finish sleeping" in outputs[2][1]
    (turn0, start0, end0), (turn1, start1, _), (turn2, start2, end2) = (
        json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(3)
    )
    assert (turn0, turn1, turn2) == (0, 2, 1)
    assert end0 - start0 >= 6 and start2 >= end0 and start1 >= end2  # 6 s waited, past the group's 3 s timeout


def test_a_process_that_finds_no_tokenizer_in_the_output_dir_says_why(tmp_path, monkeypatch):
    """A process after process 0 loads the tokenizer it trained from --output_dir: on another machine without that
    folder, the error names the folder and the two ways out."""
    monkeypatch.setattr(recipe, "in_turn", lambda *args, **kwargs: contextlib.nullcontext(1))
    raw = DatasetDict({"train": Dataset.from_dict({"translation": [{"de": "eins", "en": "one"}]})})
    args = SimpleNamespace(output_dir=str(tmp_path / "not-shared"), process_index=8)
    with pytest.raises(DataError, match=r"process 8 found no tokenizer in --output_dir .*not-shared.*--tokenizer_name"):
        recipe.load_tokenizer(recipe.ModelArguments(preset="small"), raw, "de", "en", args, None)
