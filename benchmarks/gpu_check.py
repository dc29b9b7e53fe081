#!/usr/bin/env python
"""What ten minutes on a GPU machine can verify: the losses, train.py in bf16, fp16 and compiled, FSDP2 over NCCL with a
resume, static-cache generation under compile, flex attention, translate.py with both engines, and the base model's
training step against MarianMTModel. `benchmarks/gpu.sh` installs what the machine lacks, then runs this.

    bash benchmarks/gpu.sh                        # on the GPU machine; results in $OUT (or outputs/gpu-check)
    bash benchmarks/gpu.sh --device cpu           # the dry run: tiny sizes, the checks that need CUDA skipped
    python benchmarks/gpu_check.py --missing      # the requirements this Python lacks, one per line (gpu.sh's list)

Every stage runs in a process of its own under its own time limit, and writes each result to gpu_check.jsonl as soon as
it has it, so a stage cut off by its limit loses only itself; the stages also share one budget (--budget_s), and one
that no longer fits is skipped. At the end: one table on stdout, gpu_check.json (every result), and gpu_check.log
(the output of every stage). Scratch files (trained models, exports) go to --work_dir, not to the output folder.

The stages, in order (the first ones matter most when the time is short):
  environment    versions, the GPU, and that `vanilla_transformer` is this repository's
  losses         the loss with and without skip_logits (fused only where loss_path takes it), with gradients, in
                 fp32, bf16 and fp16 autocast against a float64 reference of the plain math; rows of -100 only,
                 lengths off every block
  train_bf16     scripts/train.py on the demo corpus, --bf16: the loss falls; speed, peak memory
  train_fp16     the same with --fp16: the loss falls, the GradScaler's scale stays sane, few skipped steps
  translate      scripts/translate.py with both engines (transformers, CTranslate2 export) on the device; CTranslate2's
                 --device auto and a compute type the device cannot run
  marian_speed   the base model's training step (train.py's loss) against MarianMTModel's: tokens/s, peak memory,
                 MFU against the measured bf16 matmul peak and against the datasheet peak
  fsdp           accelerate launch (1 process, FSDP2 over NCCL) with a checkpoint, then --resume_from_checkpoint last
  flex           a few training steps with attn_implementation="flex_attention" against sdpa, or "not supported"
  static_cache   greedy and beam search with the static cache (compiled by transformers on a GPU) against the
                 dynamic cache: the same tokens; the compile time; recompiles
  train_compile  scripts/train.py --torch_compile true --bf16: the loss falls; recompiles (TORCH_LOGS=recompiles)
"""

from __future__ import annotations

import argparse
import configparser
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS, SUMMARY, LOG = "gpu_check.jsonl", "gpu_check.json", "gpu_check.log"
MIN_STAGE_S = 20  # a stage is not started with less of the budget left
LABEL_SMOOTHING = 0.1  # train.py's default (§5.4)

# bf16 dense tensor-core peaks from NVIDIA's datasheets, TFLOP/s (the sparse figures are twice these); matched against
# torch.cuda.get_device_name() in order. Any other GPU: MFU against the measured matmul peak only.
DATASHEET_BF16_TFLOPS = (
    ("H200", 989.0),
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),  # SXM ("NVIDIA H100 80GB HBM3")
    ("A100", 312.0),
)


def datasheet_bf16_flops(gpu_name: str | None) -> float | None:
    """The datasheet's dense bf16 peak in FLOP/s for a GPU name, or None for a GPU not in the table."""
    for key, tflops in DATASHEET_BF16_TFLOPS:
        if gpu_name and key.lower() in gpu_name.lower():
            return tflops * 1e12
    return None


# --------------------------------------------------------------------------------------------------------------------
# What to install


def requirements(extras: tuple[str, ...] = ("train", "ctranslate2")) -> list[str]:
    """The package's requirements (setup.cfg's install_requires and `extras`) except torch, which a GPU machine brings
    built for its CUDA and which is never replaced."""
    parser = configparser.ConfigParser()
    parser.read(os.path.join(ROOT, "setup.cfg"))
    lines = parser["options"]["install_requires"].splitlines()
    for extra in extras:
        lines += parser["options.extras_require"][extra].splitlines()
    lines = [line.strip() for line in lines]
    return [line for line in lines if line and not line.startswith(("#", "torch")) and "[" not in line]


def missing_requirements(wanted: list[str]) -> list[str]:
    """Those of `wanted` that are not installed in a version they accept."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        from packaging.requirements import Requirement
    except ImportError:  # pip always carries it
        from pip._vendor.packaging.requirements import Requirement

    missing = []
    for line in wanted:
        requirement = Requirement(line)
        try:
            installed = version(requirement.name)
        except PackageNotFoundError:
            missing.append(line)
            continue
        if not requirement.specifier.contains(installed, prereleases=True):
            missing.append(line)
    return missing


# --------------------------------------------------------------------------------------------------------------------
# Results


@dataclass
class Context:
    """What a stage needs: where it runs, where its scratch files go, and where it writes its results."""

    stage: str
    device: str
    work_dir: str
    results: str
    quick: bool = field(init=False)

    def __post_init__(self):
        self.quick = self.device != "cuda"  # a dry run: tiny sizes

    def record(self, check: str, status: str, **figures) -> dict:
        """Append one result line and flush it to disk at once: a stage killed later keeps it."""
        row = {"stage": self.stage, "check": check, "status": status, **figures}
        append_row(self.results, row)
        print(f"{self.stage} · {check}: {status} {format_figures(row)}", flush=True)
        return row

    def scratch(self, name: str) -> str:
        path = os.path.join(self.work_dir, name)
        shutil.rmtree(path, ignore_errors=True)
        return path


def append_row(path: str, row: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_rows(path: str) -> list[dict]:
    if not os.path.isfile(path):
        return []
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut off by a kill
                continue
    return rows


def format_figures(row: dict) -> str:
    def show(value) -> str:
        if isinstance(value, float):
            return f"{value:.3g}" if math.isfinite(value) else str(value)
        return str(value)

    return " ".join(f"{key}={show(value)}" for key, value in row.items() if key not in ("stage", "check", "status"))


def verdict(failures: list[str]) -> str:
    return "ok" if not failures else "FAIL: " + "; ".join(failures)


def _first_line(text: str) -> str:
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    return lines[0] if lines else ""


def load_module(name: str, path: str):
    """Import a script (scripts/train.py, ...) as a module, to call its main() with callbacks."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses with postponed annotations look their module up there
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------------------------------------------------
# Stages


def stage_environment(ctx: Context) -> None:
    import platform
    from importlib.metadata import PackageNotFoundError, version

    import torch

    import vanilla_transformer

    packages = ["torch", "transformers", "accelerate", "datasets", "tokenizers", "huggingface_hub", "safetensors"]
    packages += ["kernels", "sacrebleu", "ctranslate2"]
    versions = {}
    for name in packages:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = "not installed"
    cuda = torch.cuda.is_available()
    figures = dict(python=platform.python_version(), cuda_available=cuda, torch_cuda=torch.version.cuda, **versions)
    if cuda:
        properties = torch.cuda.get_device_properties(0)
        figures.update(
            gpu=torch.cuda.get_device_name(0),
            gpu_memory_gib=round(properties.total_memory / 2**30, 1),
            capability=".".join(map(str, torch.cuda.get_device_capability(0))),
            bf16=torch.cuda.is_bf16_supported(),
            datasheet_bf16_tflops=(datasheet_bf16_flops(torch.cuda.get_device_name(0)) or math.nan) / 1e12,
        )
    package_dir = os.path.dirname(os.path.realpath(vanilla_transformer.__file__))
    failures = []
    if os.path.dirname(package_dir) != os.path.realpath(ROOT):
        failures.append(f"vanilla_transformer is imported from {package_dir}, not from this repository")
    if ctx.device == "cuda" and not cuda:
        failures.append("torch.cuda.is_available() is False")
    ctx.record("versions", verdict(failures), **figures)


def plain_loss(logits, labels, label_smoothing: float):
    """The mean over labelled positions of (1-ε)·(-log p(label)) + ε·mean_v(-log p(v)), in the logits' dtype: what
    F.cross_entropy(label_smoothing=ε, ignore_index=-100) computes; 0 (attached to the graph) without labels."""
    log_probs = logits.log_softmax(-1)
    labelled = labels != -100
    nll = -log_probs.gather(-1, labels.clamp(min=0)[..., None]).squeeze(-1)
    per_position = (1 - label_smoothing) * nll - label_smoothing * log_probs.mean(-1)
    return (per_position * labelled).sum() / labelled.sum().clamp(min=1)


def stage_losses(ctx: Context) -> None:
    import copy

    import torch

    from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

    device = ctx.device
    # lengths that are multiples of none of the losses' blocks (512 rows, 16 blocks, rows padded to 8)
    if ctx.quick:
        vocab, d_model, layers, batch, src_len, tgt_len = 1003, 32, 1, 7, 11, 83  # 581 positions
    else:
        vocab, d_model, layers, batch, src_len, tgt_len = 32000, 256, 2, 13, 61, 97  # 1261 positions
    config = VanillaTransformerConfig(
        vocab_size=vocab,
        d_model=d_model,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=4 * d_model,
        decoder_ffn_dim=4 * d_model,
        dropout=0.0,
        # wide weights: peaked distributions, so that the smoothing term differs from the label's term
        init_std=0.2,
    )
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(config).to(device)
    reference = copy.deepcopy(model).double().train()
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(4, vocab, (batch, src_len), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, src_len // 2 :] = 0
    inputs = {"input_ids": input_ids.to(device), "attention_mask": attention_mask.to(device)}
    # the model's own greedy translations as labels: each label is likely, unlike a random token, so that the
    # smoothed loss differs from the plain one and a wrong label smoothing cannot pass
    labels = model.eval().generate(**inputs, do_sample=False, max_new_tokens=tgt_len, min_new_tokens=tgt_len)[:, 1:]
    model.train()
    labels[torch.rand(labels.shape, generator=generator).to(device) < 0.1] = -100
    labels[1] = -100  # a row with no labelled position
    labels[-1, tgt_len // 3 :] = -100  # a short target, padded

    def reference_run(labels):
        reference.zero_grad(set_to_none=True)
        decoder_input_ids = reference.prepare_decoder_input_ids_from_labels(labels)
        logits = reference(**inputs, decoder_input_ids=decoder_input_ids).logits
        loss = plain_loss(logits, labels, LABEL_SMOOTHING)
        loss.backward()
        return loss.detach(), torch.cat([p.grad.flatten() for p in reference.parameters()])

    expected_loss, expected_grad = reference_run(labels)
    without_smoothing = plain_loss(
        reference(**inputs, decoder_input_ids=reference.prepare_decoder_input_ids_from_labels(labels)).logits,
        labels,
        0.0,
    ).detach()
    smoothing_effect = abs(float(expected_loss - without_smoothing)) / float(expected_loss)

    # relative error bounds of the loss and of the gradient (L2 over all parameters) against float64
    tolerances = {"fp32": (1e-4, 1e-3), "fp16": (2e-3, 2e-2), "bf16": (1e-2, 1e-1)}
    dtypes = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
    nothing = torch.full_like(labels, -100)
    for name, dtype in dtypes.items():
        for skip_logits in (False, True):
            # the path model.loss_path() takes on this device: "fused" (without logits) only where it is the default
            loss_path = model.loss_path(skip_logits)
            path = "fused" if loss_path.logit_free else "logits, skip_logits" if skip_logits else "logits"
            check = f"{path} loss, {name}" + (" autocast" if dtype else "")
            loss_kwargs = {"label_smoothing": LABEL_SMOOTHING, "skip_logits": skip_logits}
            try:
                model.zero_grad(set_to_none=True)
                with torch.autocast(device, dtype=dtype or torch.float32, enabled=dtype is not None):
                    loss = model(**inputs, labels=labels, **loss_kwargs).loss
                loss.backward()
                grad = torch.cat([p.grad.flatten() for p in model.parameters()]).double()
                loss_error = abs(float(loss) - float(expected_loss)) / abs(float(expected_loss))
                grad_error = float((grad - expected_grad).norm() / expected_grad.norm())
                # a batch without a single label: loss 0 and zero gradients, not NaN
                model.zero_grad(set_to_none=True)
                with torch.autocast(device, dtype=dtype or torch.float32, enabled=dtype is not None):
                    empty = model(**inputs, labels=nothing, **loss_kwargs).loss
                empty.backward()
                empty_grads = [p.grad for p in model.parameters() if p.grad is not None]
                empty_ok = float(empty) == 0.0 and all(bool((g == 0).all()) for g in empty_grads)
            except (RuntimeError, TypeError, ValueError) as error:  # e.g. a dtype this device's autocast lacks
                ctx.record(check, f"FAIL: {type(error).__name__}: {_first_line(error)}")
                continue
            loss_bound, grad_bound = tolerances[name]
            failures = []
            if not (loss_error <= loss_bound):
                failures.append(f"loss off by {loss_error:.2e} (bound {loss_bound:g})")
            if not (grad_error <= grad_bound):
                failures.append(f"gradient off by {grad_error:.2e} (bound {grad_bound:g})")
            if not empty_ok:
                failures.append(f"all -100: loss {float(empty)} or non-zero gradients")
            ctx.record(
                check,
                verdict(failures),
                loss=float(loss),
                loss_rel_err=loss_error,
                grad_rel_err=grad_error,
                positions=int((labels != -100).sum()),
                smoothing_effect=smoothing_effect,
                loss_path=str(loss_path),
            )


def _train_watcher(cuda: bool):
    """A TrainerCallback that keeps the logged losses, the GradScaler's scale, skipped steps and the peak memory."""
    import torch
    from transformers import TrainerCallback

    class Watch(TrainerCallback):
        def __init__(self):
            self.losses, self.scales, self.skipped, self.steps, self.setup, self.peak_mib = [], [], 0, 0, {}, None

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            precision = "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"
            self.setup = dict(precision=precision, attention=model.config._attn_implementation, device=str(args.device))
            if cuda:
                torch.cuda.reset_peak_memory_stats()

        def on_step_end(self, args, state, control, optimizer=None, **kwargs):
            self.steps += 1
            self.skipped += bool(getattr(optimizer, "step_was_skipped", False))  # fp16: the scaler found inf/NaN

        def on_log(self, args, state, control, logs=None, optimizer=None, **kwargs):
            if logs and "loss" in logs:
                self.losses.append(float(logs["loss"]))
            scaler = getattr(optimizer, "scaler", None)  # accelerate's AcceleratedOptimizer holds the GradScaler
            if scaler is not None and scaler.is_enabled():
                self.scales.append(float(scaler.get_scale()))

        def on_train_end(self, args, state, control, **kwargs):
            if cuda:
                self.peak_mib = torch.cuda.max_memory_allocated() / 2**20

    return Watch()


def demo_training_args(ctx: Context, output_dir: str, steps: int) -> list[str]:
    """train.py's flags for a short run on the demo corpus: training only, no checkpoints, a loss every tenth."""
    args = ["--output_dir", output_dir, "--do_train", "--max_steps", str(steps), "--eval_strategy", "no"]
    args += ["--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true", "--seed", "0"]
    args += ["--logging_steps", str(max(1, steps // 10))]
    if ctx.quick:  # the dry run: a 1+1-layer model on 512 pairs, warmed up at once so that its 10 steps learn
        args += ["--config_overrides", TINY_OVERRIDES, "--max_train_samples", "512", "--warmup_steps", "2"]
        args += ["--per_device_train_batch_size", "32"]
    return args


TINY_OVERRIDES = (
    "d_model=32,encoder_layers=1,decoder_layers=1,encoder_attention_heads=2,decoder_attention_heads=2,"
    "encoder_ffn_dim=64,decoder_ffn_dim=64"
)


def train_demo(ctx: Context, flags: list[str], steps: int, check: str) -> None:
    import torch

    cuda = ctx.device == "cuda"
    output_dir = ctx.scratch(ctx.stage)
    watch = _train_watcher(cuda)
    train = load_module("train_script", os.path.join(ROOT, "scripts", "train.py"))
    metrics = train.main(demo_training_args(ctx, output_dir, steps) + flags, callbacks=[watch])
    losses = watch.losses
    failures = []
    if not losses or not all(math.isfinite(loss) for loss in losses):
        failures.append(f"logged losses {losses}")
    elif not losses[-1] < losses[0]:
        failures.append(f"the loss did not fall ({losses[0]:.3f} -> {losses[-1]:.3f})")
    if "--fp16" in flags:
        if not watch.scales or not all(1.0 <= s <= 2.0**24 for s in watch.scales):
            failures.append(f"GradScaler scales {watch.scales}")
        if watch.skipped > max(5, watch.steps // 10):
            failures.append(f"{watch.skipped} of {watch.steps} steps skipped")
    figures = dict(
        watch.setup,
        steps=watch.steps,
        first_loss=losses[0] if losses else None,
        last_loss=losses[-1] if losses else None,
        samples_per_s=metrics.get("train_samples_per_second"),
        runtime_s=metrics.get("train_runtime"),
        peak_memory_mib=watch.peak_mib,
    )
    if "--fp16" in flags:
        figures.update(skipped_steps=watch.skipped, scale_first=watch.scales[:1], scale_last=watch.scales[-1:])
    if "--torch_compile" in flags:
        counters = torch._dynamo.utils.counters["stats"]
        figures.update(unique_graphs=counters.get("unique_graphs"))
    ctx.record(check, verdict(failures), **figures)


def stage_train_bf16(ctx: Context) -> None:
    train_demo(ctx, ["--bf16", "true"], 10 if ctx.quick else 200, "train.py --bf16")


def stage_train_fp16(ctx: Context) -> None:
    train_demo(ctx, ["--fp16", "true"], 200, "train.py --fp16")


def stage_train_compile(ctx: Context) -> None:
    # on a CPU, dynamo's eager backend: the same tracing, guards and recompiles, without inductor's long C++ builds
    backend = ["--torch_compile_backend", "eager"] if ctx.quick else []
    steps = 10 if ctx.quick else 200
    train_demo(ctx, ["--bf16", "true", "--torch_compile", "true", *backend], steps, "train.py --torch_compile true")


FSDP_FLAGS = [
    *("--use_fsdp", "--fsdp_version", "2", "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP"),
    *("--fsdp_transformer_layer_cls_to_wrap", "EncoderLayer,DecoderLayer", "--fsdp_state_dict_type", "FULL_STATE_DICT"),
    *("--fsdp_reshard_after_forward", "true"),
]  # docs/training.md's "Sharded: FSDP2"


def stage_fsdp(ctx: Context) -> None:
    import socket

    output_dir = ctx.scratch("fsdp")
    first, total = 20, 30
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # one process on the one GPU
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1"]
    launch += ["--main_process_port", str(port), "--mixed_precision", "bf16"]
    launch += ["--dynamo_backend", "no", *FSDP_FLAGS, os.path.join(ROOT, "scripts", "train.py")]
    common = demo_training_args(ctx, output_dir, first)
    common[common.index("--save_strategy") + 1] = "steps"
    common += ["--save_steps", str(first // 2), "--logging_steps", "1", "--ddp_timeout", "120", "--bf16", "true"]
    runs = {}
    for name, extra in (("train", []), ("resume", ["--max_steps", str(total), "--resume_from_checkpoint", "last"])):
        start = time.perf_counter()
        # its output goes on to the stage's log as it comes, so that a launch cut off by the limit still shows it
        process = subprocess.Popen(launch + common + extra, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines = []
        for line in process.stdout:
            sys.stdout.write(line)
            lines.append(line)
        code, output = process.wait(), "".join(lines)
        parallelism = re.search(r"parallelism: ([^\n]+)", output)
        runs[name] = dict(seconds=time.perf_counter() - start, parallelism=parallelism and parallelism[1])
        if code != 0:
            ctx.record(f"accelerate launch ({name})", f"FAIL: exit {code}: {_last_error(output)}")
            return
    with open(os.path.join(output_dir, "trainer_state.json")) as f:
        state = json.load(f)
    failures = []
    parallelism = runs["train"]["parallelism"] or ""
    if not parallelism.startswith("FSDP2"):
        failures.append(f"parallelism: {parallelism!r}")
    if "nccl" not in parallelism:
        failures.append("not over NCCL")
    if not os.path.isdir(os.path.join(output_dir, f"checkpoint-{first}")):
        failures.append(f"no checkpoint-{first}")
    if state.get("global_step") != total:
        failures.append(f"resumed run ended at step {state.get('global_step')}, not {total}")
    resumed = [entry["step"] for entry in state.get("log_history", []) if "loss" in entry and entry["step"] > first]
    if not resumed:
        failures.append("no loss logged after the resume")
    ctx.record(
        "FSDP2 save and --resume_from_checkpoint last",
        verdict(failures),
        parallelism=parallelism,
        train_s=runs["train"]["seconds"],
        resume_s=runs["resume"]["seconds"],
        steps=f"{first} then {first + 1}-{total}",
    )


def _last_error(output: str) -> str:
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error:" in line]
    return (errors or lines or [""])[-1][:300]


def _small_config(ctx: Context, **overrides):
    from vanilla_transformer import VanillaTransformerConfig

    sizes = (
        dict(d_model=32, layers=1, ffn=64, vocab=101)
        if ctx.quick
        else dict(d_model=256, layers=3, ffn=1024, vocab=8000)
    )
    values = dict(
        vocab_size=sizes["vocab"],
        d_model=sizes["d_model"],
        encoder_layers=sizes["layers"],
        decoder_layers=sizes["layers"],
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=sizes["ffn"],
        decoder_ffn_dim=sizes["ffn"],
        max_position_embeddings=256,
    )
    return VanillaTransformerConfig(**{**values, **overrides})


def stage_flex(ctx: Context) -> None:
    import copy

    import torch

    from vanilla_transformer import VanillaTransformerForConditionalGeneration

    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(_small_config(ctx, dropout=0.0)).to(ctx.device).train()
    reference = copy.deepcopy(model)
    try:
        model.set_attn_implementation("flex_attention")  # what train.py --attn_implementation flex_attention does
    except (ValueError, ImportError, NotImplementedError) as error:
        ctx.record("attn_implementation=flex_attention", "not supported", reason=_first_line(error)[:200])
        return
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(1)
    batch = {
        "input_ids": torch.randint(4, vocab, (8, 29), generator=generator),
        "attention_mask": torch.ones(8, 29, dtype=torch.long),
        "labels": torch.randint(4, vocab, (8, 23), generator=generator),
    }
    batch["attention_mask"][0, 20:] = 0
    batch["labels"][1, 15:] = -100
    batch = {key: value.to(ctx.device) for key, value in batch.items()}
    results = {}
    for name, candidate in (("sdpa", reference), ("flex", model)):
        candidate.zero_grad(set_to_none=True)
        start = time.perf_counter()
        loss = candidate(**batch).loss
        loss.backward()
        results[name] = (loss.detach(), time.perf_counter() - start)
    loss_error = abs(float(results["flex"][0] - results["sdpa"][0])) / abs(float(results["sdpa"][0]))
    failures = [] if loss_error < 1e-4 else [f"loss differs from sdpa's by {loss_error:.2e}"]
    figures = dict(loss_rel_err=loss_error, first_call_s=results["flex"][1])
    grad = {
        name: torch.cat([p.grad.flatten() for p in candidate.parameters() if p.grad is not None])
        for name, candidate in (("sdpa", reference), ("flex", model))
    }
    grad_error = float((grad["flex"] - grad["sdpa"]).norm() / grad["sdpa"].norm())
    if not grad_error < 1e-3:
        failures.append(f"gradient differs from sdpa's by {grad_error:.2e}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(5):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(ctx.device, dtype=torch.bfloat16):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    if not (all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]):
        failures.append(f"bf16 steps: losses {losses}")
    ctx.record("flex_attention training steps", verdict(failures), **figures, grad_rel_err=grad_error, losses=losses)


def stage_static_cache(ctx: Context) -> None:
    import torch

    from vanilla_transformer import VanillaTransformerForConditionalGeneration

    torch.manual_seed(0)
    # wide weights: peaked next-token distributions, so that kernel differences change no greedy or beam choice
    model = VanillaTransformerForConditionalGeneration(_small_config(ctx, init_std=0.3)).to(ctx.device).eval()
    generator = torch.Generator().manual_seed(2)
    batch, length, new = (3, 7, 6) if ctx.quick else (8, 19, 32)
    input_ids = torch.randint(4, model.config.vocab_size, (batch, length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, length - 3 :] = 0
    inputs = {"input_ids": input_ids.to(ctx.device), "attention_mask": attention_mask.to(ctx.device)}

    def timed(**options) -> tuple[torch.Tensor, float]:
        if ctx.device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = model.generate(**inputs, do_sample=False, max_new_tokens=new, min_new_tokens=new, **options)
        if ctx.device == "cuda":
            torch.cuda.synchronize()
        return out, time.perf_counter() - start

    for beams in (1, 4):
        check = "greedy" if beams == 1 else f"beam {beams}"
        timed(num_beams=beams)  # warm-up
        dynamic, dynamic_s = timed(num_beams=beams)
        try:
            static, first_s = timed(num_beams=beams, cache_implementation="static")
            static, static_s = timed(num_beams=beams, cache_implementation="static")
        except Exception as error:  # noqa: BLE001 -- whatever generate raises is the finding
            ctx.record(f"{check}, static cache", f"FAIL: {type(error).__name__}: {_first_line(error)[:200]}")
            continue
        same = int((static == dynamic).all(dim=1).sum()) if static.shape == dynamic.shape else 0
        failures = [] if same == batch else [f"{batch - same} of {batch} sequences differ from the dynamic cache's"]
        ctx.record(
            f"{check}, static cache against dynamic",
            verdict(failures),
            identical=f"{same}/{batch}",
            # transformers compiles the decoding step for a static cache on a GPU (generate's auto-compile)
            compiled=hasattr(model, "_compiled_call"),
            static_first_call_s=first_s,
            static_s=static_s,
            dynamic_s=dynamic_s,
        )


def _demo_sentences(count: int) -> tuple[list[str], list[str]]:
    from vanilla_transformer.training.data import english_number, german_number

    numbers = [1 + (i * 7919) % 9999 for i in range(count)]
    return [german_number(n) for n in numbers], [english_number(n) for n in numbers]


def _translation_model(ctx: Context) -> tuple[str, str]:
    """The model train_bf16 trained, or a fresh one with a tokenizer trained on demo sentences."""
    import torch

    from vanilla_transformer import VanillaTransformerForConditionalGeneration
    from vanilla_transformer.training.presets import default_generation_config
    from vanilla_transformer.training.tokenizer import train_tokenizer

    trained = os.path.join(ctx.work_dir, "train_bf16")
    if os.path.isfile(os.path.join(trained, "config.json")) and os.path.isfile(os.path.join(trained, "tokenizer.json")):
        return trained, "train_bf16's model"
    model_dir = ctx.scratch("translate-model")
    sources, targets = _demo_sentences(2000)
    tokenizer = train_tokenizer(sources + targets, vocab_size=400)
    torch.manual_seed(0)
    config = _small_config(ctx, vocab_size=len(tokenizer), decoder_vocab_size=len(tokenizer), init_std=0.3)
    model = VanillaTransformerForConditionalGeneration(config)
    model.generation_config = default_generation_config(config, num_beams=4, max_length=64)
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return model_dir, "a fresh model"


def run_script(name: str, argv: list[str]) -> tuple[int, str, str, float]:
    """scripts/<name>.py's main(argv) in this process: (exit code, stdout, stderr, seconds)."""
    import contextlib
    import io

    module = load_module(f"{name}_script", os.path.join(ROOT, "scripts", f"{name}.py"))
    out, err = io.StringIO(), io.StringIO()
    code = 0
    start = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            module.main(argv)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
            if not isinstance(exit_.code, int) and exit_.code is not None:
                print(exit_.code, file=sys.stderr)
    seconds = time.perf_counter() - start
    sys.stdout.write(out.getvalue()[-5000:] + err.getvalue()[-5000:])
    return code, out.getvalue(), err.getvalue(), seconds


def stage_translate(ctx: Context) -> None:
    from vanilla_transformer.inference.loading import read_lines

    model_dir, which = _translation_model(ctx)
    sources, references = _demo_sentences(16 if ctx.quick else 200)
    folder = ctx.scratch("translate")
    os.makedirs(folder)
    src, ref = os.path.join(folder, "src.de"), os.path.join(folder, "ref.en")
    for path, lines in ((src, sources), (ref, references)):
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    device = ctx.device
    common = ["--input_file", src, "--references", ref, "--batch_size", "32", "--num_beams", "4"]

    def translate(engine: str, model: str, device_flag: str, *extra: str):
        output = os.path.join(folder, f"{engine}-{device_flag}.txt")
        code, _, err, seconds = run_script(
            "translate",
            ["--model_dir", model, "--engine", engine, "--device", device_flag, "--output_file", output]
            + common
            + list(extra),
        )
        lines = read_lines("--output_file", output) if code == 0 and os.path.isfile(output) else None
        bleu = re.search(r"sacreBLEU\s+([\d.]+)", err)
        return code, err, seconds, lines, bleu and float(bleu[1])

    code, err, seconds, expected, bleu = translate("transformers", model_dir, device)
    status = "ok" if code == 0 and expected and len(expected) == len(sources) else f"FAIL: {_last_error(err)}"
    ctx.record(
        f"transformers --device {device}", status, model=which, sentences=len(sources), seconds=seconds, bleu=bleu
    )

    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        ctx.record("ctranslate2", "skipped: ctranslate2 is not installed")
        return
    exported = os.path.join(folder, "ct2")
    code, _, err, seconds = run_script(
        "export_ctranslate2", ["--model_dir", model_dir, "--output_dir", exported, "--quantization", "float32"]
    )
    if code != 0:
        ctx.record("export_ctranslate2", f"FAIL: {_last_error(err)}")
        return
    ctx.record("export_ctranslate2", "ok", seconds=seconds)

    def one_line_error(err: str) -> bool:
        lines = [line for line in err.strip().splitlines() if line.strip()]
        return bool(lines) and lines[-1].startswith("translate.py: error:") and "Traceback" not in err

    code, err, seconds, lines, bleu = translate("ctranslate2", exported, device)
    if code == 0:
        same = sum(a == b for a, b in zip(lines, expected or []))
        ctx.record(f"ctranslate2 --device {device}", "ok", seconds=seconds, bleu=bleu, same_as_transformers=same)
    elif device == "cuda" and one_line_error(err):  # e.g. a wheel built for another CUDA: refused in one line
        ctx.record(f"ctranslate2 --device {device}", "not supported", error=err.strip().splitlines()[-1][:300])
    else:
        ctx.record(f"ctranslate2 --device {device}", f"FAIL: {_last_error(err)}")

    code, err, seconds, lines, _ = translate("ctranslate2", exported, "auto")
    fallback = [line for line in err.splitlines() if line.startswith("CTranslate2: CUDA libraries did not load")]
    status = "ok" if code == 0 and lines and len(fallback) <= 1 else f"FAIL: {_last_error(err)}"
    used = "cpu, after: " + fallback[0] if fallback else ("cuda or cpu, silently" if device == "cuda" else "cpu")
    ctx.record("ctranslate2 --device auto", status, seconds=seconds, device_used=used)

    invalid = "int16" if device == "cuda" else "float16"  # no int16 kernels on CUDA, no float16 ones on a CPU
    code, err, _, _, _ = translate("ctranslate2", exported, device, "--compute_type", invalid)
    message = err.strip().splitlines()[-1] if err.strip() else ""
    clear = code != 0 and one_line_error(err) and ("supported there" in message or "cannot translate on" in message)
    status = "ok" if clear else f"FAIL: exit {code}: {message[:200]}"
    ctx.record(f"ctranslate2 --compute_type {invalid} on {device}", status, error=message[:300])


def stage_marian_speed(ctx: Context) -> None:
    import gc
    import statistics

    import torch

    sys.path.insert(0, HERE)
    import speed

    cuda = ctx.device == "cuda"
    if cuda:  # model_speed's GPU row: the paper's base size, 256 pairs of 128 + 128 tokens, bf16 autocast
        shape = dict(sizes=["base"], train_batch_size=256, train_src_len=128, train_tgt_len=128)
        settings = speed.BenchmarkSettings(device="cuda", dtype="bf16", gemm_size=8192, pairs=10, warmup=3, **shape)
    else:
        shape = dict(sizes=["tiny"], train_batch_size=8, train_src_len=16, train_tgt_len=16)
        settings = speed.BenchmarkSettings(gemm_size=256, pairs=2, warmup=1, **shape)
    size = settings.sizes[0]
    peak = speed.matmul_peak_flops(settings, settings.dtype)
    gpu = torch.cuda.get_device_name() if cuda else None
    datasheet = datasheet_bf16_flops(gpu) if cuda else None
    batch = speed.training_batch(size, settings)
    calls, memory = {}, {}
    for name in speed.MODELS:
        model = speed.build_model(name, size, settings).train()
        step = speed.training_step(
            model, speed.trainer_optimizer(model), batch, settings, label_smoothing=LABEL_SMOOTHING
        )
        gc.collect()
        if cuda:
            torch.cuda.synchronize()
            baseline = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        for _ in range(max(1, settings.warmup)):  # the first steps also allocate the optimizer's state
            step()
        if cuda:
            torch.cuda.synchronize()
            memory[name] = (torch.cuda.max_memory_allocated() - baseline) / 2**20
        calls[name] = step
    times = speed.interleaved_times(calls, settings.pairs, 0, settings.device)
    tokens = settings.train_batch_size * settings.train_tgt_len
    row = speed.throughput_row("train_ls", size, "tgt tok/s", tokens, times)
    flops = speed.training_flops(size, settings.train_batch_size, settings.train_src_len, settings.train_tgt_len)
    figures = dict(
        size=size,
        dtype=settings.dtype,
        batch=f"{settings.train_batch_size}x{settings.train_src_len}/{settings.train_tgt_len}",
        vanilla_tok_s=row["vanilla"],
        marian_tok_s=row["marian"],
        ratio=row["ratio"],
        matmul_peak_tflops=peak / 1e12,
    )
    for name in speed.MODELS:
        seconds = statistics.median(times[name])
        figures[f"{name}_mfu_measured"] = flops / seconds / peak
        if datasheet:
            figures[f"{name}_mfu_datasheet"] = flops / seconds / datasheet
        if cuda:
            figures[f"{name}_peak_increase_mib"] = memory[name]
    if cuda and not datasheet:
        figures["datasheet"] = f"{gpu} is not in the datasheet table: MFU against the measured peak only"
    finite = all(math.isfinite(v) and v > 0 for v in (row["vanilla"], row["marian"], peak))
    check = f"{size} training step against Marian"
    ctx.record(check, verdict([] if finite else ["a rate or the peak is not a positive number"]), **figures)


@dataclass(frozen=True)
class Stage:
    function: Callable[[Context], None]
    limit_s: int  # on a GPU
    cpu_limit_s: int  # in the dry run
    needs_cuda: str | None = None  # why it cannot run without CUDA
    env: dict = field(default_factory=dict)


RECOMPILES = {"TORCH_LOGS": "recompiles"}
STAGES = {
    "environment": Stage(stage_environment, 45, 60),
    "losses": Stage(stage_losses, 60, 120),
    "train_bf16": Stage(stage_train_bf16, 75, 180),
    "train_fp16": Stage(stage_train_fp16, 60, 0, needs_cuda="fp16 mixed precision with the GradScaler is for GPUs"),
    "translate": Stage(stage_translate, 75, 180),
    "marian_speed": Stage(stage_marian_speed, 75, 120),
    # on CPU processes, tests/test_sharding.py runs the same launch through the test setup
    "fsdp": Stage(stage_fsdp, 100, 0, needs_cuda="FSDP2 over NCCL: Accelerate runs FSDP on accelerators only"),
    # the stage trains with flex attention; its CPU forward is tested in tests/test_clients.py
    "flex": Stage(stage_flex, 60, 0, needs_cuda="torch 2.13 has no CPU backward for flex attention", env=RECOMPILES),
    "static_cache": Stage(stage_static_cache, 100, 120, env=RECOMPILES),
    "train_compile": Stage(stage_train_compile, 150, 300, env=RECOMPILES),
}


# --------------------------------------------------------------------------------------------------------------------
# The run


def stage_command(name: str, args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The command and environment that run one stage in a process of its own."""
    command = [sys.executable, os.path.abspath(__file__), "--stage", name, "--device", args.device]
    command += ["--output_dir", args.output_dir, "--work_dir", args.work_dir]
    # the stages import this repository's package, whatever the interpreter has installed
    python_path = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    return command, dict(os.environ, PYTHONPATH=python_path, PYTHONUNBUFFERED="1", **STAGES[name].env)


def run_logged(command: list[str], env: dict, limit: float, log_path: str, title: str) -> tuple[str, float, str]:
    """Run `command` with its output appended to `log_path`, for at most `limit` seconds (then it is stopped, with
    all it started); returns (status, seconds, its output)."""
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"\n===== {title} (at most {limit:.0f} s) =====\n")
        log.flush()
        start_offset = log.tell()
        start = time.monotonic()
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            code = process.wait(timeout=limit)
            status = "ok" if code == 0 else f"error: exit {code}"
        except subprocess.TimeoutExpired:
            stop(process)
            status = f"timeout: stopped after {limit:.0f} s"
        seconds = time.monotonic() - start
    with open(log_path, encoding="utf-8", errors="replace") as log:
        log.seek(start_offset)
        output = log.read()
    return status, seconds, output


def stop(process: subprocess.Popen) -> None:
    """End a stage's process group and every process it started (torchrun starts its workers in sessions of their
    own): SIGTERM, five seconds, then SIGKILL."""
    try:
        import psutil

        descendants = [child.pid for child in psutil.Process(process.pid).children(recursive=True)]
    except Exception:  # noqa: BLE001 -- psutil missing, or the process already gone: its group still goes
        descendants = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for kill, pid in [(os.killpg, process.pid)] + [(os.kill, pid) for pid in descendants]:
            try:
                kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        if sig == signal.SIGTERM:
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
    process.wait()


def count_recompiles(output: str) -> tuple[int, str | None]:
    """Recompilations TORCH_LOGS=recompiles reported in a stage's output, and the first one's first reason."""
    count = output.count("Recompiling function")
    reason = re.search(r"Recompiling function[^\n]*\n[^\n]*triggered by[^\n]*\n[^\n]*?- ([^\n]+)", output)
    return count, reason and reason[1].strip()[:200]


def summary_table(rows: list[dict]) -> str:
    lines = ["| stage | check | status | result |", "|---|---|---|---|"]
    for row in rows:
        status = str(row["status"]).replace("|", "/")
        lines.append(f"| {row['stage']} | {row['check']} | {status} | {format_figures(row).replace('|', '/')} |")
    return "\n".join(lines)


def run_all(args: argparse.Namespace) -> dict:
    started, deadline = time.monotonic(), time.monotonic() + args.budget_s
    os.makedirs(args.output_dir, exist_ok=True)
    results, log_path = os.path.join(args.output_dir, RESULTS), os.path.join(args.output_dir, LOG)
    for path in (results, log_path):
        open(path, "w").close()
    shutil.rmtree(args.work_dir, ignore_errors=True)
    os.makedirs(args.work_dir)
    names = args.stages or list(STAGES)
    cuda_missing = False
    for name in names:
        stage = STAGES[name]
        elapsed = time.monotonic() - started
        remaining = deadline - time.monotonic()
        skip = None
        if stage.needs_cuda and args.device != "cuda":
            skip = f"skipped: needs CUDA ({stage.needs_cuda})"
        elif cuda_missing:
            skip = "skipped: CUDA is not available (see environment)"
        elif remaining < MIN_STAGE_S:
            skip = f"skipped: out of time ({remaining:.0f} s of the budget left)"
        if skip:
            append_row(results, {"stage": name, "check": "stage", "status": skip})
            print(f"[{elapsed:5.0f} s] {name}: {skip}", flush=True)
            continue
        limit = min(stage.limit_s if args.device == "cuda" else stage.cpu_limit_s, remaining)
        print(f"[{elapsed:5.0f} s] {name} (at most {limit:.0f} s) ...", flush=True)
        command, env = stage_command(name, args)
        status, seconds, output = run_logged(command, env, limit, log_path, name)
        if status != "ok":
            last = _last_error(output)
            status += f" ({last})" if last else ""
        figures = {"seconds": round(seconds, 1)}
        if "TORCH_LOGS" in stage.env:
            figures["recompiles"], figures["first_recompile"] = count_recompiles(output)
        append_row(results, {"stage": name, "check": "stage", "status": status, **figures})
        print(f"[{time.monotonic() - started:5.0f} s] {name}: {status} in {seconds:.0f} s", flush=True)
        if name == "environment" and args.device == "cuda":
            versions = [row for row in read_rows(results) if row["stage"] == "environment" and "cuda_available" in row]
            cuda_missing = not versions or not versions[-1]["cuda_available"]
    rows = read_rows(results)
    environment = next((row for row in rows if row["stage"] == "environment" and "torch" in row), {})
    summary = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "device": args.device,
        "gpu": environment.get("gpu"),
        "seconds": round(time.monotonic() - started, 1),
        "budget_s": args.budget_s,
        "rows": rows,
    }
    with open(os.path.join(args.output_dir, SUMMARY), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1, default=str)
    head = f"GPU check · {summary['date']} · {args.device}"
    for key in ("gpu", "torch", "transformers"):
        head += f" · {key} {environment[key]}" if environment.get(key) else ""
    head += f" · {summary['seconds']:.0f} s"
    print(f"\n{head}\n\n{summary_table(rows)}\n")
    failed = [row for row in rows if not str(row["status"]).startswith(("ok", "skipped", "not supported"))]
    print(f"{len(rows) - len(failed)} passed, {len(failed)} failed (of {len(rows)} results)")
    print(f"results: {os.path.join(args.output_dir, SUMMARY)}; every stage's output: {log_path}")
    return summary


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the dry run (tiny sizes).")
    parser.add_argument(
        "--output_dir",
        default=os.environ.get("OUT") or os.path.join(ROOT, "outputs", "gpu-check"),
        help="Where the results go (default: $OUT, else outputs/gpu-check).",
    )
    parser.add_argument(
        "--work_dir",
        default=os.path.join(tempfile.gettempdir(), "vanilla-transformer-gpu-check"),
        help="Scratch folder for the trained models and exports (emptied first).",
    )
    parser.add_argument("--stages", nargs="+", choices=list(STAGES), help="Run only these stages (default: all).")
    parser.add_argument("--budget_s", type=float, default=510, help="Seconds for all the stages together.")
    parser.add_argument("--missing", action="store_true", help="Print the requirements not installed, and exit.")
    parser.add_argument("--stage", choices=list(STAGES), help=argparse.SUPPRESS)  # one stage, in this process
    args = parser.parse_args(argv)
    if args.stage and STAGES[args.stage].needs_cuda and args.device != "cuda":
        parser.error(f"stage {args.stage} needs CUDA ({STAGES[args.stage].needs_cuda})")
    args.output_dir, args.work_dir = os.path.abspath(args.output_dir), os.path.abspath(args.work_dir)
    return args


def main(argv: list[str] | None = None) -> dict | list[str] | None:
    args = parse_arguments(argv)
    if args.missing:
        missing = missing_requirements(requirements())
        print("\n".join(missing))
        return missing
    if args.stage:
        ctx = Context(args.stage, args.device, args.work_dir, os.path.join(args.output_dir, RESULTS))
        STAGES[args.stage].function(ctx)
        return None
    return run_all(args)


if __name__ == "__main__":
    main()
