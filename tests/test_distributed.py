"""Several processes on the defaults, with the shapes users have: the demo corpus's batches of 64 pairs of mixed
length, token batches and gradient accumulation, under DDP and FSDP2 on 2 CPU processes; two "machines" on localhost;
and a mismatch between processes failing in seconds instead of hanging.

Every launch runs with a short process-group timeout (`--ddp_timeout`) and a subprocess timeout, so that processes
that stop agreeing end the test with an error, not by CI's limit.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import torch
from conftest import FSDP_LAUNCH, ROOT, TINY_OVERRIDES, free_port, script_env
from safetensors.torch import load_file

from vanilla_transformer.training import recipe
from vanilla_transformer.training.data import demo_corpus
from vanilla_transformer.training.tokenizer import iterate_texts, train_tokenizer

PROCESS_GROUP_TIMEOUT = "30"  # seconds a collective may wait for the other process (transformers' ddp_timeout)
LAUNCH_TIMEOUT = 240  # seconds for a whole launch: far above a run's ~15 s, far below CI's limit

DDP_LAUNCH = ["--multi_gpu"]
TOKENS_ACCUMULATION = ["--max_tokens_per_batch", "1024", "--gradient_accumulation_steps", "2"]
EVALUATION = ["--do_eval", "--max_eval_samples", "8"]

# Runs train.py's recipe, with FSDP2 on these CPU processes through the test setup (fsdp_on_cpu.py). MISMATCH=1 makes
# process 1 run its first training step twice, a pass the other process does not run: FSDP2's gathers stop matching.
LAUNCHER = (
    f"""
import sys
sys.path.insert(0, {str(ROOT / "tests")!r})
import fsdp_on_cpu
fsdp_on_cpu.enable()
"""
    + """
import json, os
import torch

from vanilla_transformer.training import recipe
from vanilla_transformer.training.trainer import TranslationTrainer

if os.environ.get("MISMATCH") and os.environ.get("RANK") == "1":
    step = TranslationTrainer.training_step

    def twice(self, *args, **kwargs):
        step(self, *args, **kwargs)
        return step(self, *args, **kwargs)

    TranslationTrainer.training_step = twice
recipe.main(sys.argv[2:])
# what is left of the process group once main() has returned
workers = 0
for task in os.listdir("/proc/self/task"):
    with open(f"/proc/self/task/{task}/comm") as f:
        workers += f.read().strip() == "pt_gloo_runloop"
with open(os.path.join(sys.argv[1], f"group-{os.environ.get('RANK', '0')}.json"), "w") as f:
    json.dump({"initialized": torch.distributed.is_initialized(), "gloo worker threads": workers}, f)
"""
)


@dataclass
class Launch:
    """One `accelerate launch`, its output going to `log`."""

    process: subprocess.Popen
    log: Path


def accelerate_launch(
    folder,
    launch_flags: list[str],
    args: list[str],
    machines: int = 1,
    machine_rank: int = 0,
    port: int = 0,
    timeout: str = PROCESS_GROUP_TIMEOUT,
    **env,
) -> Launch:
    """Start `accelerate launch <launch_flags> train.py <args>` through LAUNCHER for 2 processes in all: both on
    this "machine", or one on each of 2."""
    launcher = folder / "launcher.py"
    launcher.write_text(LAUNCHER)
    command = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2"]
    command += ["--num_machines", str(machines), "--machine_rank", str(machine_rank)]
    command += ["--main_process_ip", "127.0.0.1", "--main_process_port", str(port or free_port())]
    command += ["--mixed_precision", "no", "--dynamo_backend", "no", *launch_flags, str(launcher)]
    command += [str(folder), *args, "--ddp_timeout", timeout]
    return start_logged(command, folder / "launch.log", {**script_env(folder), **env})


def start_logged(command: list[str], log: Path, env: dict) -> Launch:
    """Start `command` in a session of its own (pytest's terminal signals stay pytest's), its output going to the
    file `log` (not a pipe: nothing blocks while another launch is waited for), Python's fault handler on."""
    with open(log, "w") as f:
        process = subprocess.Popen(
            command, stdout=f, stderr=subprocess.STDOUT, env={**env, "PYTHONFAULTHANDLER": "1"}, start_new_session=True
        )
    return Launch(process, log)


FAILED_LAUNCH_GRACE = 60  # seconds the other launches get to end once one has failed (collectives time out in 30)


def finish(*launches: Launch) -> list[tuple[int, str]]:
    """(return code, output) of each launch, waited for together. A launch that has not ended LAUNCH_TIMEOUT s after
    the wait began, or FAILED_LAUNCH_GRACE s after another launch failed (torchrun's agents wait up to 300 s for each
    other at exit), fails the test as a hang, with the output of every launch: a hang on one "machine" is often
    explained by the other's."""
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    while any(launch.process.poll() is None for launch in launches):
        if any(launch.process.poll() not in (None, 0) for launch in launches):
            deadline = min(deadline, time.monotonic() + FAILED_LAUNCH_GRACE)
        if time.monotonic() > deadline:
            pytest.fail("a launch did not end:\n" + "\n".join(stop_and_show(launches)))
        time.sleep(0.5)
    return [(launch.process.returncode, launch.log.read_text()) for launch in launches]


def stop_and_show(launches: Sequence[Launch]) -> list[str]:
    """Stop hung launches and return the end of each one's output. Every process of a launch (the launcher, and all
    its descendants: torchrun starts each worker in a session of its own) first gets SIGABRT, on which Python prints
    where each of its threads stood (PYTHONFAULTHANDLER, set by `start_logged`), then SIGKILL."""
    processes = []
    for launch in launches:  # all found before any is stopped: a stopped parent's children move to init
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(launch.process.pid)
            processes += [root, *root.children(recursive=True)]
    for process in processes:  # one at a time: processes of a launch write into the same log
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signal.SIGABRT)
            time.sleep(0.3)  # a traceback is written at once
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signal.SIGKILL)
    outputs = []
    for index, launch in enumerate(launches):
        code = launch.process.wait()
        outputs.append(f"--- launch {index}, exit code {code} ---\n{launch.log.read_text()[-6000:]}")
    return outputs


def test_a_failed_launch_ends_the_wait_for_the_others(tmp_path, monkeypatch):
    """What finish() does when one "machine" fails while the other waits (as torchrun's agent waits 300 s for its
    peer at exit): the test fails after the grace period, with both outputs and where the waiting one stood."""
    monkeypatch.setattr(sys.modules[__name__], "FAILED_LAUNCH_GRACE", 1)

    def start(name: str, code: str) -> Launch:
        return start_logged([sys.executable, "-c", code], tmp_path / f"{name}.log", dict(os.environ))

    # the waiting launch's child runs in a session of its own, as torchrun's workers do; it writes its pid when ready
    ready = tmp_path / "child.pid"
    child = f"import os, time\nprint('child waiting', flush=True)\nopen({str(ready)!r}, 'w').write(str(os.getpid()))"
    child += "\ntime.sleep(600)"
    parent = "import subprocess, sys, time\n"
    parent += f"subprocess.Popen([sys.executable, '-c', {child!r}], start_new_session=True)"
    waiting = start("waiting", parent + "\nprint('waiting', flush=True)\ntime.sleep(600)")
    deadline = time.monotonic() + 60
    while not (ready.exists() and ready.read_text()):
        assert time.monotonic() < deadline, "the child did not start"
        time.sleep(0.1)
    failed = start("failed", "import sys\nprint('failed', flush=True)\nsys.exit(3)")
    began = time.monotonic()
    with pytest.raises(pytest.fail.Exception) as info:
        finish(waiting, failed)
    assert time.monotonic() - began < 30
    message = str(info.value)
    assert "launch 1, exit code 3" in message and "failed" in message
    assert "waiting" in message and "child waiting" in message
    assert message.count('File "<string>", line 4') == 2  # where the waiting launch and its child stood (sleep)
    assert waiting.process.poll() is not None  # stopped, not left running
    with contextlib.suppress(psutil.NoSuchProcess):  # nor its child (at most a zombie, not yet reaped)
        assert psutil.Process(int(ready.read_text())).status() == psutil.STATUS_ZOMBIE


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("tokenizer"))
    train_tokenizer(iterate_texts(demo_corpus()["train"], "de", "en"), vocab_size=400).save_pretrained(path)
    return path


def demo_args(output_dir, tokenizer: str, *extra: str) -> list[str]:
    """The demo's defaults (small preset, 64 pairs of mixed length per process, dropout) for 12 steps."""
    return [
        *("--output_dir", str(output_dir), "--tokenizer_name", tokenizer, "--do_train", "--max_steps", "12"),
        *("--max_train_samples", "4000", "--logging_steps", "4", "--disable_tqdm", "true", "--report_to", "none"),
        *extra,
    ]


@pytest.mark.parametrize(
    "launch_flags, extra",
    [
        # FSDP2 through `accelerate launch --use_fsdp` (sentence batches under FSDP2, through transformers' flags:
        # test_sharding), and evaluation after training, whose translations every FSDP2 process decodes together
        pytest.param(FSDP_LAUNCH, [*TOKENS_ACCUMULATION, *EVALUATION], id="fsdp2-tokens-accumulation-evaluation"),
        pytest.param(DDP_LAUNCH, ["--gradient_accumulation_steps", "2"], id="ddp-sentence-batches-accumulation"),
    ],
)
@pytest.mark.distributed
def test_several_processes_train_the_demo_batches_on_the_defaults(tmp_path, tokenizer, launch_flags, extra):
    args = demo_args(tmp_path / "out", tokenizer, *extra)
    [(code, output)] = finish(accelerate_launch(tmp_path, launch_flags, args))
    assert code == 0, output[-3000:]
    assert "over 2 processes, gloo" in output
    # the loss, said when training starts: without logits under DDP; FSDP2's unit of lm_head has hooks it would bypass
    sharded = "--use_fsdp" in launch_flags
    if not sharded:  # the start-up summary, read from Accelerate after set-up
        assert "parallelism: DDP over 2 processes, gloo on cpu" in output and "FSDP" not in output
        assert "global batch 64 pairs per device x 2 processes x 2 accumulation steps = 256 pairs" in output
        # process 0 tokenises and says for how long the other waits (training/preparation.py)
        assert "train.py: tokenising 4,000 pairs; 1 other process waits for it up to 24 h" in output
    if sharded:
        loss = "model.loss_function on the logits (lm_head has forward hooks (an FSDP unit or another hook)"
    else:
        loss = "cross-entropy without logits (lm_head is a plain nn.Linear on cpu)"
    assert f"loss: label smoothing 0.1, {loss}" in output
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    assert state["global_step"] == 12
    if "--do_eval" in extra:  # translated and scored as translate.py does
        results = json.loads((tmp_path / "out" / "all_results.json").read_text())
        assert results["eval_samples"] == 8 and 0 <= results["eval_bleu"] <= 100 and results["eval_loss"] > 0
    # each process left its process group before exiting, and under DDP the group is gone with its threads
    # (workarounds.torch_gloo_group_teardown; under FSDP2 DTensor's caches keep it until the interpreter exits)
    groups = [json.loads((tmp_path / f"group-{rank}.json").read_text()) for rank in (0, 1)]
    assert [group["initialized"] for group in groups] == [False, False]
    if not sharded:
        assert [group["gloo worker threads"] for group in groups] == [0, 0]


@pytest.mark.distributed
def test_processes_that_disagree_fail_in_seconds_instead_of_hanging(tmp_path, tokenizer):
    """A process that runs a pass the other does not (as processes that batch differently would): FSDP2's gathers
    stop matching, and the process-group timeout (10 s here) turns what would be a silent hang into an error."""
    args = demo_args(tmp_path / "out", tokenizer)
    [(code, output)] = finish(accelerate_launch(tmp_path, FSDP_LAUNCH, args, timeout="10", MISMATCH="1"))
    assert code != 0
    assert "timed out" in output.lower() or "timeout" in output.lower(), output[-3000:]


def tiny_args(output_dir, per_device_batch: int) -> list[str]:
    """6 steps of a tiny model without dropout on demo pairs, the tokenizer trained by the run itself (rank 0)."""
    return [
        *("--output_dir", str(output_dir), "--do_train", "--seed", "7", "--vocab_size", "300"),
        *("--max_train_samples", "256", "--per_device_train_batch_size", str(per_device_batch), "--max_steps", "6"),
        *("--warmup_steps", "2", "--learning_rate", "1e-2", "--save_strategy", "no"),
        *("--config_overrides", TINY_OVERRIDES + ",dropout=0.0", "--disable_tqdm", "true", "--report_to", "none"),
    ]


@pytest.fixture(scope="module")
def single_process_run(tmp_path_factory) -> dict[str, torch.Tensor]:
    """The weights of one process trained on the global batch of the two-machine runs (2 x 16 pairs)."""
    out = tmp_path_factory.mktemp("single") / "out"
    recipe.main(tiny_args(out, 32) + ["--threads", "1"])
    return load_file(str(out / "model.safetensors"))


@pytest.mark.parametrize("launch_flags", [DDP_LAUNCH, FSDP_LAUNCH], ids=["ddp", "fsdp2"])
@pytest.mark.distributed
def test_two_machines_on_localhost_train_like_one_process(tmp_path, launch_flags, single_process_run):
    """`accelerate launch --num_machines 2 --machine_rank 0|1`, one process on each "machine", a shared output folder:
    the second machine waits for the tokenizer that global rank 0 trains, and the result equals one process trained
    on the same global batch."""
    port, out = free_port(), tmp_path / "out"
    machines = []
    for rank in (0, 1):
        folder = tmp_path / f"machine-{rank}"
        folder.mkdir()
        machines.append(accelerate_launch(folder, launch_flags, tiny_args(out, 16), 2, rank, port))
    results = finish(*machines)
    for code, output in results:
        assert code == 0, output[-3000:]
    assert "over 2 processes, gloo" in results[0][1]
    # each says what it prepares or waits for, and how long (training/preparation.py)
    assert "train.py: training the tokenizer on 256 pairs; 1 other process waits for it up to 24 h" in results[0][1]
    for what in ("training the tokenizer on 256 pairs", "tokenising 256 pairs"):
        assert f"process 1: waiting up to 24 h (--preparation_timeout) for process 0 to finish {what}" in results[1][1]
    saved = load_file(str(out / "model.safetensors"))
    assert saved.keys() == single_process_run.keys()
    # the gradients of the two halves are summed in another order than one process sums them (see test_sharding)
    for name, tensor in saved.items():
        torch.testing.assert_close(tensor, single_process_run[name], rtol=0.0, atol=1e-3, msg=name)
