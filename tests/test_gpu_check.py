"""benchmarks/gpu.sh and its driver benchmarks/gpu_check.py: the CPU dry run runs every stage that a CPU can (the
others say they need CUDA), the fsdp stage launches a save then a resume and checks what they left (on fake launches),
a stage cut off by its time limit loses only itself, the budget skips what no longer fits, and the wheel folder
carries what the package needs without torch.

What only a GPU can show (the figures, CUDA kernels, NCCL, compiled kernels) is what gpu.sh is for; nothing here
asserts a speed."""

import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from conftest import FSDP_LAUNCH, ROOT, load_script

gpu_check = load_script("gpu_check", folder="benchmarks")


@pytest.mark.parametrize(
    "name, tflops",
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA GeForce RTX 4090", None),
        (None, None),
    ],
)
def test_datasheet_peak_is_known_for_the_table_s_gpus_only(name, tflops):
    peak = gpu_check.datasheet_bf16_flops(name)
    assert peak == (tflops * 1e12 if tflops else None)


def test_requirements_come_from_setup_cfg_without_torch_and_missing_ones_are_found():
    wanted = gpu_check.requirements()
    names = [line.split(">")[0].split("=")[0].split("<")[0] for line in wanted]
    assert names[0] == "transformers" and {"datasets", "accelerate", "sacrebleu", "ctranslate2"} <= set(names)
    assert "torch" not in names and not any("[" in line for line in wanted)
    assert "transformers>=5.24,<6" in wanted
    installed = f"pytest>={pytest.__version__}"
    missing = ["surely-no-such-package-here>=1", "pytest>=999"]
    assert gpu_check.missing_requirements([installed, *missing]) == missing


def test_a_stage_past_its_limit_is_stopped_with_what_it_started(tmp_path):
    """The stage's process and a process it started in a session of its own (as torchrun starts its workers) end;
    what the stage printed before is kept."""
    pid_file = tmp_path / "grandchild.pid"
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "print('started', flush=True)\n"
        "time.sleep(60)\n"
    )
    log = tmp_path / "log.txt"
    start = time.monotonic()
    status, seconds, output = gpu_check.run_logged([sys.executable, "-c", code], dict(os.environ), 3, str(log), "t")
    assert status == "timeout: stopped after 3 s" and time.monotonic() - start < 20
    assert "started" in output and "===== t (at most 3 s) =====" in log.read_text()
    grandchild = int(pid_file.read_text())
    for _ in range(50):  # SIGKILLed; gone once reaped (it was reparented to init)
        if not os.path.exists(f"/proc/{grandchild}") or "Z" in open(f"/proc/{grandchild}/stat").read().split()[2]:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the stage's own child was left running")


def test_each_result_is_kept_when_a_later_stage_fails_or_runs_out_of_time(tmp_path, monkeypatch, capsys):
    """Rows a stage wrote before it was stopped stay; stages that need CUDA are skipped on a CPU, and so is a stage
    the budget no longer fits; the summary table and the JSON hold them all."""
    calls = []

    def fake_run(command, env, limit, log_path, title):
        calls.append(title)
        results = command[command.index("--output_dir") + 1] + "/" + gpu_check.RESULTS
        gpu_check.append_row(results, {"stage": title, "check": "first", "status": "ok", "value": 1.5})
        if title == "losses":
            return f"timeout: stopped after {limit:.0f} s", limit, "a stage cut off\n"
        time.sleep(0.3 if title == "train_bf16" else 0)
        return "ok", 0.1, ""

    monkeypatch.setattr(gpu_check, "run_logged", fake_run)
    monkeypatch.setattr(gpu_check, "MIN_STAGE_S", 1)
    out = tmp_path / "out"
    summary = gpu_check.main(
        ["--device", "cpu", "--output_dir", str(out), "--work_dir", str(tmp_path / "work"), "--budget_s", "1.2"]
        + ["--stages", "losses", "train_fp16", "train_bf16", "translate"]
    )
    assert calls == ["losses", "train_bf16"]  # train_fp16 needs CUDA; translate no longer fits the budget
    rows = [(row["stage"], row["check"], row["status"]) for row in summary["rows"]]
    assert rows == [
        ("losses", "first", "ok"),
        ("losses", "stage", "timeout: stopped after 1 s (a stage cut off)"),
        ("train_fp16", "stage", "skipped: needs CUDA (fp16 mixed precision with the GradScaler is for GPUs)"),
        ("train_bf16", "first", "ok"),
        ("train_bf16", "stage", "ok"),
        ("translate", "stage", rows[-1][2]),
    ]
    assert rows[-1][2].startswith("skipped: out of time")
    assert json.loads((out / gpu_check.SUMMARY).read_text())["rows"] == summary["rows"]
    assert len((out / gpu_check.RESULTS).read_text().splitlines()) == 6
    table = capsys.readouterr().out
    assert "| losses | first | ok | value=1.5 |" in table and "5 passed, 1 failed (of 6 results)" in table


def test_recompiles_are_counted_from_torch_s_log():
    output = (
        "V1207 [0/1] [__recompiles] Recompiling function forward in modeling.py:604\n"
        "V1207 [0/1] [__recompiles]     triggered by the following guard failure(s):\n"
        "V1207 [0/1] [__recompiles]     - 0/0: tensor 'input_ids' size mismatch at index 1. expected 8, actual 16\n"
        "V1207 [0/2] [__recompiles] Recompiling function forward in modeling.py:604\n"
    )
    assert gpu_check.count_recompiles(output) == (
        2,
        "0/0: tensor 'input_ids' size mismatch at index 1. expected 8, actual 16",
    )
    assert gpu_check.count_recompiles("no compile here") == (0, None)


def test_the_wheel_folder_carries_what_the_package_needs_but_not_torch_and_what_only_torch_needs():
    prepare = load_script("prepare_gpu_wheels", folder="benchmarks")

    def item(name, requires=(), requested=False):
        return {"metadata": {"name": name, "version": "1", "requires_dist": list(requires)}, "requested": requested}

    items = [
        item("transformers", ["huggingface-hub>=2", "numpy"], requested=True),
        item("accelerate", ["torch>=2", "huggingface_hub"], requested=True),
        item("huggingface_hub", ["filelock", "hf-xet; platform_machine == 'x86_64'", "tomli; python_version < '3.11'"]),
        item("torch", ["filelock", "nvidia-cublas-cu12; platform_system == 'Linux'", "sympy"]),
        item("filelock"),
        item("hf-xet"),
        item("tomli"),
        item("numpy"),
        item("nvidia-cublas-cu12"),
        item("sympy"),
    ]
    kept = [entry["metadata"]["name"] for entry in prepare.needed(items, "3.12", {"torch", "numpy"})]
    assert kept == ["accelerate", "filelock", "hf-xet", "huggingface_hub", "transformers"]
    assert "tomli" in [entry["metadata"]["name"] for entry in prepare.needed(items, "3.10", {"torch", "numpy"})]


# what train.py says of it on one GPU
NCCL = "FSDP2 (full shard, wrapping EncoderLayer, DecoderLayer, FULL_STATE_DICT) over 1 process, nccl on cuda"


def last_value(command: list[str], flag: str) -> str:
    """A flag's value; of a flag given twice, the last one, as argparse takes it."""
    return command[len(command) - command[::-1].index(flag)]


@pytest.mark.parametrize(
    "launches, status",
    [
        (dict(), "ok"),
        (dict(ends_at=20), "FAIL: resumed run ended at step 20, not 30; no loss logged after the resume"),
        (dict(parallelism=NCCL.replace("nccl", "gloo")), "FAIL: not over NCCL"),
        (dict(saves=False), "FAIL: no checkpoint-20"),
    ],
    ids=["ok", "resumed run ends early", "over gloo", "no checkpoint"],
)
def test_fsdp_stage_launches_a_save_then_a_resume_and_checks_what_they_left(launches, status, tmp_path, monkeypatch):
    """The fsdp stage (CUDA only) on fake launches, without CUDA: two `accelerate launch`es of train.py with FSDP2
    over one process, the second resuming from the first's last checkpoint to a later step; its row says what went
    wrong in what the launches printed and left behind."""
    commands = []

    class Launch:  # `accelerate launch ... train.py`: the start-up line, checkpoints and trainer_state.json
        def __init__(self, command, **kwargs):
            commands.append(command)
            output_dir, every = last_value(command, "--output_dir"), int(last_value(command, "--save_steps"))
            steps = launches.get("ends_at") or int(last_value(command, "--max_steps"))
            for step in range(every, steps + 1, every) if launches.get("saves", True) else ():
                os.makedirs(os.path.join(output_dir, f"checkpoint-{step}"), exist_ok=True)
            os.makedirs(output_dir, exist_ok=True)
            state = {"global_step": steps, "log_history": [{"loss": 2.0, "step": s} for s in range(1, steps + 1)]}
            with open(os.path.join(output_dir, "trainer_state.json"), "w") as f:
                json.dump(state, f)
            parallelism = launches.get("parallelism", NCCL)
            self.stdout = [f"model: 1.2M parameters; parallelism: {parallelism}\n", "{'train_loss': 2.0}\n"]

        def wait(self):
            return 0

    fake = SimpleNamespace(Popen=Launch, PIPE=subprocess.PIPE, STDOUT=subprocess.STDOUT)
    monkeypatch.setattr(gpu_check, "subprocess", fake)
    ctx = gpu_check.Context("fsdp", "cuda", str(tmp_path / "work"), str(tmp_path / "results.jsonl"))
    gpu_check.stage_fsdp(ctx)

    train, resume = commands
    assert train[:3] == [sys.executable, "-m", "accelerate.commands.launch"]
    assert last_value(train, "--num_processes") == "1" and last_value(train, "--mixed_precision") == "bf16"
    start = train.index("--use_fsdp")
    assert train[start : start + len(FSDP_LAUNCH) + 1] == [*FSDP_LAUNCH, str(ROOT / "scripts" / "train.py")]
    assert last_value(train, "--max_steps") == "20" and "--resume_from_checkpoint" not in train
    assert last_value(train, "--bf16") == "true" and last_value(train, "--save_steps") == "10"
    assert resume == [*train, "--max_steps", "30", "--resume_from_checkpoint", "last"]
    [row] = gpu_check.read_rows(ctx.results)
    assert (row["check"], row["status"]) == ("FSDP2 save and --resume_from_checkpoint last", status)
    assert row["parallelism"] == launches.get("parallelism", NCCL) and row["steps"] == "20 then 21-30"


# What each stage's CPU dry run records beside its "stage" row (a stage added to gpu_check.STAGES must be added here)
DRY_RUN_CHECKS = {
    "environment": set(),
    "losses": {
        f"{path} loss, {dtype}" for path in ("logits", "fused") for dtype in ("fp32", "bf16 autocast", "fp16 autocast")
    },
    "train_bf16": {"train.py --bf16"},
    "train_fp16": set(),
    "translate": {"ctranslate2 --device auto"},
    "marian_speed": {"tiny training step against Marian"},
    "fsdp": set(),
    "flex": set(),
    "static_cache": {"greedy, static cache against dynamic"},
    "train_compile": {"train.py --torch_compile true"},
}


def dry_run_environment(tmp_path) -> dict[str, str]:
    return dict(
        os.environ,
        PYTHON=sys.executable,
        PYTHONPATH=str(ROOT),
        HF_DATASETS_CACHE=str(tmp_path / "datasets-cache"),
        OMP_NUM_THREADS="1",
    )


def stage_rows(out) -> list[dict]:
    return json.loads((out / gpu_check.SUMMARY).read_text())["rows"]


def test_every_stage_has_its_dry_run_checks_listed():
    assert list(DRY_RUN_CHECKS) == list(gpu_check.STAGES)


@pytest.mark.parametrize("name", [name for name, stage in gpu_check.STAGES.items() if stage.needs_cuda])
def test_a_cuda_only_stage_run_alone_on_a_cpu_is_refused_with_the_reason(name, tmp_path, capsys):
    """The one-stage flag (what run_all starts each stage's process with) refuses a CUDA-only stage on a CPU too."""
    with pytest.raises(SystemExit) as exit_info:
        gpu_check.main(["--stage", name, "--device", "cpu", "--output_dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert f"stage {name} needs CUDA ({gpu_check.STAGES[name].needs_cuda})" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing ran, nothing written


@pytest.mark.slow
def test_gpu_sh_hands_its_flags_to_gpu_check_which_says_which_stages_need_cuda(tmp_path):
    """`bash benchmarks/gpu.sh --no-install --device cpu --stages ...`: the wrapper hands its flags to gpu_check.py,
    which skips each stage that needs CUDA with a line saying why; the table and the JSON hold them. (Two CUDA-only
    stages: no stage's process starts.)"""
    out = tmp_path / "out"
    completed = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu.sh"), "--no-install", "--device", "cpu", "--output_dir", str(out)]
        + ["--work_dir", str(tmp_path / "work"), "--stages", "train_fp16", "fsdp"],
        capture_output=True,
        text=True,
        env=dry_run_environment(tmp_path),
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    summary = json.loads((out / gpu_check.SUMMARY).read_text())
    assert summary["device"] == "cpu"
    rows = [(row["stage"], row["check"], row["status"]) for row in summary["rows"]]
    assert rows == [
        ("train_fp16", "stage", f"skipped: needs CUDA ({gpu_check.STAGES['train_fp16'].needs_cuda})"),
        ("fsdp", "stage", f"skipped: needs CUDA ({gpu_check.STAGES['fsdp'].needs_cuda})"),
    ]
    assert "] fsdp: skipped: needs CUDA (FSDP2 over NCCL" in completed.stdout
    assert "| train_fp16 | stage | skipped: needs CUDA" in completed.stdout
    assert not (out / gpu_check.LOG).read_text()  # no stage ran


@pytest.mark.slow
@pytest.mark.parametrize("stage", [name for name, stage in gpu_check.STAGES.items() if not stage.needs_cuda])
def test_cpu_dry_run_of_each_stage(stage, tmp_path, monkeypatch, capsys):
    """The dry run (`gpu.sh --device cpu`) of one stage: at tiny sizes, through the same code as on a GPU, in a
    process of its own; each check it records passes, is skipped for want of CUDA, or is not supported on a CPU."""
    for name, value in dry_run_environment(tmp_path).items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "out"
    gpu_check.main(
        ["--device", "cpu", "--output_dir", str(out), "--work_dir", str(tmp_path / "work"), "--budget_s", "900"]
        + ["--stages", stage]
    )
    rows = stage_rows(out)
    log = (out / gpu_check.LOG).read_text()
    bad = [row for row in rows if not row["status"].startswith(("ok", "skipped", "not supported"))]
    assert not bad, json.dumps(bad, indent=1) + log[-5000:]
    assert {row["stage"] for row in rows} == {stage}
    assert DRY_RUN_CHECKS[stage] <= {row["check"] for row in rows}, log[-5000:]
    if stage == "losses":
        assert "| losses | fused loss, bf16 autocast | ok |" in capsys.readouterr().out
    if stage == "train_compile":
        [row] = [row for row in rows if row["check"] == "stage"]
        assert row["recompiles"] >= 1  # TORCH_LOGS=recompiles reached the stage's log
