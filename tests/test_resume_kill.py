"""Interrupted training loses nothing.

scripts/train.py runs in child processes that SIGKILL themselves at a chosen moment, which is what an out-of-memory
killer or a pre-empted machine does: no exception handler, no atexit, no flush. A first run is killed in the middle
of writing a checkpoint's optimizer.pt; a second resumes with `--resume_from_checkpoint last` and is killed at a
random training step; a third resumes again and is killed during the final evaluation, after the run's last
checkpoint (at max_steps, in the middle of an epoch) was written; a fourth resumes from that one, trains nothing and
finishes. Its final weights must equal, bit for bit, those of a run that was never interrupted (CPU, same seed).
"""

import json
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import safetensors.torch
import torch
from conftest import TINY_OVERRIDES

from vanilla_transformer.training import recipe
from vanilla_transformer.training.checkpoints import check_checkpoint, checkpoint_problem, last_complete_checkpoint

MAX_STEPS, SAVE_STEPS = 14, 4  # 4 steps per epoch (32 pairs, 8 per batch): the run ends in an epoch's middle
TRAIN_ARGS = [
    "--do_train",
    "--do_eval",
    "--max_steps", str(MAX_STEPS),
    "--save_strategy", "steps",
    "--save_steps", str(SAVE_STEPS),
    "--seed", "11",
    # bit-identical floats need the same thread count in every process; train.py would pick one per idle core
    "--threads", "1",
    "--config_overrides", TINY_OVERRIDES,
    "--vocab_size", "300",
    "--max_train_samples", "32",
    "--max_eval_samples", "1",
    "--max_predict_samples", "1",
    "--per_device_train_batch_size", "8",
    "--warmup_steps", "2",
    "--logging_steps", "4",
    "--dataloader_num_workers", "0",
    "--report_to", "none",
    "--disable_tqdm", "true",
    "--use_cpu",
]  # fmt: skip

# Runs train.py's main() once per JSON argument list given on the command line. KILL_IN_SAVE=<step> makes the
# process SIGKILL itself halfway through writing checkpoint-<step>/optimizer.pt; KILL_AT_STEP=<step> right after
# that optimizer step (before any save); KILL_IN_EVAL=<step> in an evaluation's first batch at that step.
DRIVER = textwrap.dedent(
    """
    import io, json, os, signal, sys
    import torch
    from transformers import TrainerCallback

    kill_in_save, kill_at_step = os.environ.get("KILL_IN_SAVE"), os.environ.get("KILL_AT_STEP")
    kill_in_eval = os.environ.get("KILL_IN_EVAL")
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        if kill_in_save and str(f).endswith(os.path.join(f"checkpoint-{kill_in_save}", "optimizer.pt")):
            buffer = io.BytesIO()
            real_save(obj, buffer, *args, **kwargs)
            with open(f, "wb") as out:
                out.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
            os.kill(os.getpid(), signal.SIGKILL)
        return real_save(obj, f, *args, **kwargs)

    torch.save = save

    class KillAtStep(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if kill_at_step and state.global_step == int(kill_at_step):
                os.kill(os.getpid(), signal.SIGKILL)

        def on_prediction_step(self, args, state, control, **kwargs):
            if kill_in_eval and state.global_step == int(kill_in_eval):
                os.kill(os.getpid(), signal.SIGKILL)

    from vanilla_transformer.training.recipe import main

    for argv in sys.argv[1:]:
        main(json.loads(argv), callbacks=[KillAtStep()])
    """
)


def run(tmp_path: Path, *argvs: list[str], **kill: int) -> subprocess.CompletedProcess:
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", **{k: str(v) for k, v in kill.items()})
    command = [sys.executable, str(driver), *(json.dumps(argv) for argv in argvs)]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def tail(process: subprocess.CompletedProcess) -> str:
    """The end of a run's log, without progress bars."""
    lines = [line for line in process.stderr.splitlines() if "/s]" not in line and line.strip()]
    return "\n".join(lines[-25:])


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return safetensors.torch.load_file(folder / "model.safetensors")


@pytest.mark.slow
def test_killed_training_resumes_to_the_same_weights(tmp_path):
    out, reference = tmp_path / "interrupted", tmp_path / "reference"
    args = [*TRAIN_ARGS, "--output_dir", str(out)]
    resume = [*args, "--resume_from_checkpoint", "last"]
    save_steps = list(range(SAVE_STEPS, MAX_STEPS, SAVE_STEPS)) + [MAX_STEPS]  # 4, 8, 12 and the last, 14
    cut_at = random.choice(save_steps[1:-1])
    kill_step = random.choice(range(cut_at - SAVE_STEPS + 1, MAX_STEPS))
    moments = f"killed writing checkpoint-{cut_at}, at step {kill_step}, in the final evaluation"

    # 1. killed while writing a checkpoint: its optimizer.pt is cut in half, trainer_state.json never written
    first = run(tmp_path, args, KILL_IN_SAVE=cut_at)
    assert first.returncode == -signal.SIGKILL, tail(first)
    half = out / f"checkpoint-{cut_at}"
    assert half.is_dir() and (half / "model.safetensors").is_file() and not (half / "trainer_state.json").exists()
    assert checkpoint_problem(str(half)) is not None
    assert last_complete_checkpoint(str(out)) == str(out / f"checkpoint-{cut_at - SAVE_STEPS}")

    # 2. resumed from the newest complete checkpoint, then killed at a random training step
    second = run(tmp_path, resume, KILL_AT_STEP=kill_step)
    assert second.returncode == -signal.SIGKILL, f"{moments}:\n{tail(second)}"
    assert "Not resuming from" in second.stderr and str(half) in second.stderr  # the skip is reported

    # 3. resumed again, trains to the end, saves its last checkpoint and is killed in the final evaluation
    third = run(tmp_path, resume, KILL_IN_EVAL=MAX_STEPS)
    assert third.returncode == -signal.SIGKILL, f"{moments}:\n{tail(third)}"
    assert last_complete_checkpoint(str(out)) == str(out / f"checkpoint-{MAX_STEPS}")

    # 4. resumed from the run's last checkpoint: nothing left to train (transformers' Trainer alone would run a
    # step 15), evaluates and finishes; then the uninterrupted run, in the same process to save a start-up
    fourth = run(tmp_path, resume, [*TRAIN_ARGS, "--output_dir", str(reference)])
    assert fourth.returncode == 0, f"{moments}:\n{tail(fourth)}"
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == MAX_STEPS
    assert max(entry["step"] for entry in state["log_history"]) == MAX_STEPS
    assert (out / "eval_results.json").is_file()

    resumed, uninterrupted = weights(out), weights(reference)
    assert resumed.keys() == uninterrupted.keys()
    different = [name for name in resumed if not torch.equal(resumed[name], uninterrupted[name])]
    assert not different, f"{moments}: weights differ from the uninterrupted run: {different[:5]}"
    assert not torch.equal(
        resumed["model.shared.weight"], weights(out / f"checkpoint-{SAVE_STEPS}")["model.shared.weight"]
    )


def _save_checkpoint_like_the_trainer(folder: Path, step: int) -> None:
    folder.mkdir(parents=True)
    safetensors.torch.save_file({"w": torch.ones(64, 64)}, folder / "model.safetensors")
    torch.save({"state": {0: torch.ones(64, 64)}}, folder / "optimizer.pt")
    torch.save({"python": 1}, folder / "rng_state.pth")
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}, indent=2))


def _cut(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda f: (f / "trainer_state.json").unlink(), "trainer_state.json is missing"),
        (lambda f: (f / "trainer_state.json").write_text('{\n  "global_step": 2'), "trainer_state.json is cut off"),
        (lambda f: (f / "trainer_state.json").write_text('{"global_step": 1}'), "global_step=1, not 2"),
        (lambda f: _cut(f / "model.safetensors", 1000), "model.safetensors is cut off"),
        (lambda f: (f / "model.safetensors").unlink(), "no model weights"),
        (lambda f: _cut(f / "optimizer.pt", -30), "optimizer.pt is cut off"),
        (lambda f: _cut(f / "rng_state.pth", 0), "rng_state.pth is cut off"),
    ],
)
def test_partial_checkpoints_are_skipped_and_refused(tmp_path, damage, reason):
    _save_checkpoint_like_the_trainer(tmp_path / "checkpoint-1", 1)
    _save_checkpoint_like_the_trainer(tmp_path / "checkpoint-2", 2)
    newest = tmp_path / "checkpoint-2"
    assert last_complete_checkpoint(str(tmp_path)) == str(newest)
    check_checkpoint(str(newest))
    damage(newest)
    assert reason in checkpoint_problem(str(newest))
    assert last_complete_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-1")
    with pytest.raises(ValueError, match=rf"is not a complete checkpoint: .*{re.escape(reason)}"):
        check_checkpoint(str(newest))


def test_train_py_resolves_resume_to_a_complete_checkpoint(tmp_path):
    """train.py's --resume_from_checkpoint: 'last' skips a half-written folder, an explicit one is refused."""
    _save_checkpoint_like_the_trainer(tmp_path / "checkpoint-1", 1)
    _save_checkpoint_like_the_trainer(tmp_path / "checkpoint-2", 2)
    (tmp_path / "checkpoint-2" / "trainer_state.json").unlink()
    resolve = recipe.resolve_checkpoint
    args = SimpleNamespace(output_dir=str(tmp_path), resume_from_checkpoint="last")
    assert resolve(args) == str(tmp_path / "checkpoint-1")
    args.resume_from_checkpoint = str(tmp_path / "checkpoint-2")
    with pytest.raises(ValueError, match="trainer_state.json is missing"):
        resolve(args)
