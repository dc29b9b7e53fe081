"""Speed and memory of VanillaTransformer against transformers' MarianMTModel at identical sizes, in one run.

The code behind benchmarks/model_speed.py (its command line); not part of the installed package.

Both models are built from configs (random weights, nothing downloaded) with the same sizes, activation, embedding
scaling, tied embeddings, dropout, position range, attention implementation and special-token ids. Every timed row
runs the two models interleaved (A B A B ...) and reports the medians and the median of the per-pair ratios, which is
what to read on a shared, noisy machine. The model FLOPs utilisation (MFU) of the training step is measured against the
matrix-multiply peak that ``torch.matmul`` reaches in the same run.

Differences that remain between the two models, by design of MarianMTModel:
  * Marian adds ``final_logits_bias`` (a (1, vocab) buffer) to every logits tensor;
  * Marian reads its sinusoids from a frozen (max_position_embeddings, d_model) table; this model computes them;
  * Marian projects Q, K and V with three matrices; this model fuses QKV (self-attention) and KV (cross-attention);
  * the weight initialisations differ (irrelevant to speed: exactly ``new_tokens`` tokens are generated).
"""

import gc
import json
import math
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime

import torch
from transformers import CompileConfig, MarianConfig, MarianMTModel, PreTrainedModel
from transformers.trainer_pt_utils import LabelSmoother

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

MODELS = ("vanilla", "marian")
ROWS = ("train", "memory", "train_ls", "memory_ls", "greedy", "beam", "train_compiled", "greedy_static_compiled")
ROWS += ("train_bf16",)
QUICK_ROWS = ("train", "memory", "train_ls", "memory_ls", "greedy", "beam", "train_bf16")
# The "_ls" rows take train.py's path: label smoothing 0.1, computed by our model itself and, for Marian, by Trainer's
# LabelSmoother on the logits (Trainer pops the labels and calls the model without them)
LABEL_SMOOTHING = 0.1
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class ModelSize:
    d_model: int
    layers: int
    heads: int
    ffn_dim: int
    vocab_size: int

    def layout(self) -> dict[str, int]:
        """The sizes as config fields, named alike in VanillaTransformerConfig and MarianConfig."""
        return dict(
            d_model=self.d_model,
            encoder_layers=self.layers,
            decoder_layers=self.layers,
            encoder_attention_heads=self.heads,
            decoder_attention_heads=self.heads,
            encoder_ffn_dim=self.ffn_dim,
            decoder_ffn_dim=self.ffn_dim,
        )


SIZES = {
    "tiny": ModelSize(d_model=32, layers=2, heads=2, ffn_dim=64, vocab_size=128),  # for tests only
    "small": ModelSize(d_model=256, layers=3, heads=4, ffn_dim=1024, vocab_size=8000),
    "base": ModelSize(d_model=512, layers=6, heads=8, ffn_dim=2048, vocab_size=32000),  # the paper's base, Table 3
}


@dataclass
class BenchmarkSettings:
    """What to measure and how; every field is a command-line flag of benchmarks/model_speed.py."""

    sizes: list[str] = field(
        default_factory=lambda: ["small", "base"],
        metadata={"help": f"Model sizes to measure, among {', '.join(SIZES)} (tiny is for tests)."},
    )
    rows: list[str] = field(
        default_factory=lambda: list(ROWS),
        metadata={"help": f"Measurements to run, among {', '.join(ROWS)}."},
    )
    quick: bool = field(
        default=False,
        metadata={
            "help": "Quick run (under 2 minutes on CPU): small size only, 3 pairs, one memory round, no compiled rows."
        },
    )
    threads: int = field(default=1, metadata={"help": "torch.set_num_threads for the run and its subprocesses."})
    device: str = field(default="cpu", metadata={"help": "Device: cpu or cuda."})
    dtype: str = field(
        default="fp32",
        metadata={"help": "fp32, or bf16 (autocast with fp32 weights for every row, and a bf16 GEMM peak)."},
    )
    attn_implementation: str = field(default="sdpa", metadata={"help": "Attention implementation of both models."})
    train_batch_size: int = field(default=32, metadata={"help": "Sentences per training step."})
    train_src_len: int = field(default=64, metadata={"help": "Source tokens per sentence in the training step."})
    train_tgt_len: int = field(default=64, metadata={"help": "Target tokens per sentence in the training step."})
    gen_batch_size: int = field(default=16, metadata={"help": "Sentences per generate call."})
    gen_src_len: int = field(default=32, metadata={"help": "Source tokens per sentence for generation."})
    new_tokens: int = field(default=64, metadata={"help": "Exactly this many new tokens (min = max_new_tokens)."})
    num_beams: int = field(default=4, metadata={"help": "Beams of the beam-search row."})
    pairs: int = field(default=5, metadata={"help": "Timed A/B pairs per row; medians are taken over them."})
    warmup: int = field(default=1, metadata={"help": "Untimed calls of each model before a row's pairs."})
    compile_warmup: int = field(default=2, metadata={"help": "Untimed calls before the compiled rows (compilation)."})
    memory_rounds: int = field(default=2, metadata={"help": "Fresh subprocesses per model for the memory row."})
    memory_steps: int = field(default=2, metadata={"help": "Training steps per memory subprocess."})
    gemm_size: int = field(default=2048, metadata={"help": "n of the n×n×n torch.matmul that measures the peak."})
    seed: int = field(default=0, metadata={"help": "Seed of the random weights and inputs."})

    def resolved(self) -> "BenchmarkSettings":
        """The settings to run: ``quick`` replaces sizes, pairs, memory rounds and rows; values are checked."""
        settings = self
        if self.quick:
            rows = [row for row in self.rows if row in QUICK_ROWS]
            settings = replace(self, sizes=["small"], pairs=3, memory_rounds=1, rows=rows, quick=False)
        settings.check()
        return settings

    def check(self) -> None:
        for size in self.sizes:
            if size not in SIZES:
                raise ValueError(f"--sizes: {size!r} is not a size; allowed: {', '.join(SIZES)}.")
        for row in self.rows:
            if row not in ROWS:
                raise ValueError(f"--rows: {row!r} is not a measurement; allowed: {', '.join(ROWS)}.")
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype: {self.dtype!r} is not supported; allowed: {', '.join(DTYPES)}.")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"--device: {self.device!r} is not supported; allowed: cpu, cuda.")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device: 'cuda' was asked for but torch.cuda.is_available() is False.")
        positive = ("threads", "train_batch_size", "train_src_len", "train_tgt_len", "gen_batch_size", "gen_src_len")
        positive += ("new_tokens", "num_beams", "pairs", "memory_rounds", "memory_steps", "gemm_size")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"--{name}: {getattr(self, name)} must be a positive integer.")
        if self.warmup < 0 or self.compile_warmup < 0:
            raise ValueError("--warmup and --compile_warmup must be 0 or more.")


# --------------------------------------------------------------------------------------------------------------------
# The two models


def model_configs(size: str, attn_implementation: str = "sdpa") -> dict[str, VanillaTransformerConfig | MarianConfig]:
    """The configs of both models at one size, matched field by field."""
    s = SIZES[size]
    shared = dict(
        vocab_size=s.vocab_size,
        decoder_vocab_size=s.vocab_size,
        **s.layout(),
        activation_function="relu",
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
        max_position_embeddings=1024,
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
        attn_implementation=attn_implementation,
    )
    return {
        "vanilla": VanillaTransformerConfig(
            **shared, position_embedding_type="sinusoidal", normalize_before=False, layer_norm_eps=1e-5
        ),
        # Marian: post-norm with LayerNorm eps 1e-5 like ours; no layer drop; no eos forced at the last step
        "marian": MarianConfig(**shared, encoder_layerdrop=0.0, decoder_layerdrop=0.0, forced_eos_token_id=None),
    }


def build_model(name: str, size: str, settings: BenchmarkSettings) -> PreTrainedModel:
    config = model_configs(size, settings.attn_implementation)[name]
    torch.manual_seed(settings.seed)
    model_class = VanillaTransformerForConditionalGeneration if name == "vanilla" else MarianMTModel
    return model_class(config).to(settings.device)


def training_batch(size: str, settings: BenchmarkSettings) -> dict[str, torch.Tensor]:
    """Unpadded random sentences; the decoder input is the labels shifted right, inside each model."""
    generator = torch.Generator().manual_seed(settings.seed)
    vocab = SIZES[size].vocab_size
    shape_src = (settings.train_batch_size, settings.train_src_len)
    shape_tgt = (settings.train_batch_size, settings.train_tgt_len)
    input_ids = torch.randint(3, vocab, shape_src, generator=generator)
    labels = torch.randint(3, vocab, shape_tgt, generator=generator)
    batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels}
    return {key: value.to(settings.device) for key, value in batch.items()}


def generation_inputs(size: str, settings: BenchmarkSettings) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(settings.seed + 1)
    input_ids = torch.randint(
        3, SIZES[size].vocab_size, (settings.gen_batch_size, settings.gen_src_len), generator=generator
    )
    return {
        "input_ids": input_ids.to(settings.device),
        "attention_mask": torch.ones_like(input_ids).to(settings.device),
    }


def _autocast(settings: BenchmarkSettings, dtype: str | None = None):
    dtype = dtype or settings.dtype
    return torch.autocast(settings.device, dtype=DTYPES[dtype], enabled=dtype != "fp32")


def trainer_optimizer(model: torch.nn.Module) -> torch.optim.AdamW:
    """Trainer's default optimizer (``optim="adamw_torch_fused"``): AdamW as one fused kernel per step."""
    return torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)


def training_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: dict,
    settings: BenchmarkSettings,
    dtype=None,
    label_smoothing: float = 0.0,
) -> Callable[[], float]:
    """forward + backward + AdamW step; returns the loss so that nothing is optimised away. With label smoothing,
    each model's loss is computed as Seq2SeqTrainer (train.py's trainer for ours) computes it."""
    smoother = None
    if label_smoothing and isinstance(model, MarianMTModel):
        smoother = LabelSmoother(epsilon=label_smoothing)
        labels = batch["labels"]
        batch = {key: value for key, value in batch.items() if key != "labels"}
        batch["decoder_input_ids"] = model.prepare_decoder_input_ids_from_labels(labels)
    elif label_smoothing:  # train.py's trainer: the model smooths, and returns the loss without making logits
        batch = {**batch, "label_smoothing": label_smoothing, "skip_logits": True}

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        with _autocast(settings, dtype):
            loss = model(**batch).loss if smoother is None else smoother(model(**batch), labels)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step


def generation_call(model: PreTrainedModel, inputs: dict, settings: BenchmarkSettings, **kwargs) -> Callable:
    def generate():
        with _autocast(settings):
            return model.generate(
                **inputs,
                do_sample=False,
                min_new_tokens=settings.new_tokens,
                max_new_tokens=settings.new_tokens,
                **kwargs,
            )

    return generate


# --------------------------------------------------------------------------------------------------------------------
# FLOPs and the machine's peak


def forward_matmul_flops(size: str, batch: int, src_len: int, tgt_len: int) -> int:
    """Exact multiply-add count × 2 of every matrix product in one forward pass (elementwise ops are not counted).

    A (m×k)·(k×n) product is 2·m·k·n FLOPs. With d = d_model, f = ffn_dim, V = vocab, S/T = source/target length,
    B = batch, tokens Ns = B·S and Nt = B·T:
      encoder layer: 2·Ns·d·3d (QKV) + 2·Ns·d·d (output) + 2·2·Ns·d·f (FFN) + 2·2·B·S·S·d (QKᵀ and AV, all heads);
      decoder layer: 2·Nt·d·3d + 2·Nt·d·d + 2·2·B·T·T·d (masked self-attention, counted in full as the kernels compute
        it) + 2·Nt·d·d (cross Q) + 2·Ns·d·2d (cross K, V) + 2·Nt·d·d (cross output) + 2·2·B·T·S·d + 2·2·Nt·d·f;
      pre-softmax projection: 2·Nt·d·V.
    """
    s = SIZES[size]
    d, f = s.d_model, s.ffn_dim
    ns, nt = batch * src_len, batch * tgt_len
    encoder_layer = 2 * ns * d * 3 * d + 2 * ns * d * d + 4 * ns * d * f + 4 * batch * src_len * src_len * d
    decoder_layer = (
        2 * nt * d * 3 * d
        + 2 * nt * d * d
        + 4 * batch * tgt_len * tgt_len * d
        + 2 * nt * d * d
        + 2 * ns * d * 2 * d
        + 2 * nt * d * d
        + 4 * batch * tgt_len * src_len * d
        + 4 * nt * d * f
    )
    return s.layers * (encoder_layer + decoder_layer) + 2 * nt * d * s.vocab_size


def training_flops(size: str, batch: int, src_len: int, tgt_len: int) -> int:
    """Forward + backward: the backward pass does two products per forward product (input and weight gradients)."""
    return 3 * forward_matmul_flops(size, batch, src_len, tgt_len)


def matmul_peak_flops(settings: BenchmarkSettings, dtype: str, repeats: int = 10) -> float:
    """The best FLOP/s of an n×n×n torch.matmul with operands in ``dtype`` (fp32 or bf16)."""
    n = settings.gemm_size
    a = torch.randn(n, n, device=settings.device, dtype=DTYPES[dtype])
    b = torch.randn(n, n, device=settings.device, dtype=DTYPES[dtype])
    torch.matmul(a, b)
    best = math.inf
    for _ in range(repeats):
        _sync(settings.device)
        start = time.perf_counter()
        torch.matmul(a, b)
        _sync(settings.device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


# --------------------------------------------------------------------------------------------------------------------
# Timing


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def interleaved_times(calls: dict[str, Callable], pairs: int, warmup: int, device: str) -> dict[str, list[float]]:
    """Seconds per call, the models taking turns (A B A B ...) so that both see the same machine load."""
    for _ in range(warmup):
        for call in calls.values():
            call()
    times = {name: [] for name in calls}
    for _ in range(pairs):
        for name, call in calls.items():
            _sync(device)
            start = time.perf_counter()
            call()
            _sync(device)
            times[name].append(time.perf_counter() - start)
    return times


def throughput_row(row: str, size: str, unit: str, work: float, times: dict[str, list[float]]) -> dict:
    """Medians of ``work / seconds`` per model, and the median of the per-pair ratios vanilla / Marian."""
    rates = {name: [work / t for t in ts] for name, ts in times.items()}
    ratios = [v / m for v, m in zip(rates["vanilla"], rates["marian"])]
    return {
        "row": row,
        "size": size,
        "unit": unit,
        "higher_is_better": True,
        "vanilla": statistics.median(rates["vanilla"]),
        "marian": statistics.median(rates["marian"]),
        "ratio": statistics.median(ratios),
        # the fastest call of each model is the least disturbed by other processes: a second, robust estimate
        "best_ratio": max(rates["vanilla"]) / max(rates["marian"]),
        "vanilla_seconds": times["vanilla"],
        "marian_seconds": times["marian"],
    }


# --------------------------------------------------------------------------------------------------------------------
# Peak memory of a training step, each model in a fresh subprocess


def _rss_kib(field_name: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            match = re.search(rf"^{field_name}:\s+(\d+) kB", status.read(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) if match else None


def _reset_peak_rss() -> bool:
    """Linux (4.0+) resets the process's resident high-water mark (VmHWM) when "5" is written to clear_refs."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


def memory_child(arguments: str) -> None:
    """Entry point of the subprocess: build one model, run training steps, print the peak memory as JSON."""
    arguments = json.loads(arguments)
    settings = BenchmarkSettings(**arguments["settings"])
    torch.set_num_threads(settings.threads)
    size, name = arguments["size"], arguments["model"]
    model = build_model(name, size, settings).train()
    optimizer = trainer_optimizer(model)
    batch = training_batch(size, settings)
    step = training_step(model, optimizer, batch, settings, label_smoothing=arguments["label_smoothing"])
    gc.collect()
    result = {"model": name, "size": size}
    if settings.device == "cuda":
        torch.cuda.synchronize()
        baseline = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        for _ in range(settings.memory_steps):
            step()
        torch.cuda.synchronize()
        result.update(method="torch.cuda.max_memory_allocated", peak_mib=torch.cuda.max_memory_allocated() / 2**20)
    else:
        baseline = _rss_kib("VmRSS") * 1024
        if _reset_peak_rss():
            method = "VmHWM after reset"
        else:  # the high-water mark then includes the setup, so the increase can be underestimated
            method = "ru_maxrss"
        for _ in range(settings.memory_steps):
            step()
        peak = _rss_kib("VmHWM") * 1024 if method == "VmHWM after reset" else _ru_maxrss_bytes()
        result.update(method=method, peak_mib=peak / 2**20)
    result["baseline_mib"] = baseline / 2**20
    result["increase_mib"] = result["peak_mib"] - result["baseline_mib"]
    print("MEMORY_RESULT " + json.dumps(result), flush=True)


def _ru_maxrss_bytes() -> int:
    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def measure_memory(size: str, name: str, settings: BenchmarkSettings, label_smoothing: float = 0.0) -> dict:
    arguments = {"size": size, "model": name, "settings": asdict(settings), "label_smoothing": label_smoothing}
    arguments = json.dumps(arguments)
    # this file is not in the installed package: the subprocess imports it from its folder
    code = "import sys; sys.path.insert(0, sys.argv[1]); from speed import memory_child; memory_child(sys.argv[2])"
    env = dict(os.environ, OMP_NUM_THREADS=str(settings.threads))
    completed = subprocess.run(
        [sys.executable, "-c", code, os.path.dirname(os.path.abspath(__file__)), arguments],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    for line in completed.stdout.splitlines():
        if line.startswith("MEMORY_RESULT "):
            return json.loads(line[len("MEMORY_RESULT ") :])
    raise RuntimeError(f"memory subprocess for {name} ({size}) failed:\n{completed.stderr[-3000:]}")


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else math.nan


def memory_row(size: str, settings: BenchmarkSettings, label_smoothing: float = 0.0) -> dict:
    """Peak resident memory of training steps above the process's state just before them (model, optimizer and batch
    built), medians over rounds; the models take turns, each in a fresh interpreter."""
    runs = {name: [] for name in MODELS}
    for _ in range(settings.memory_rounds):
        for name in MODELS:
            runs[name].append(measure_memory(size, name, settings, label_smoothing))
    increase = {name: [run["increase_mib"] for run in runs[name]] for name in MODELS}
    peak = {name: [run["peak_mib"] for run in runs[name]] for name in MODELS}
    return {
        "row": "memory_ls" if label_smoothing else "memory",
        "size": size,
        "unit": "MiB",
        "higher_is_better": False,
        "vanilla": statistics.median(increase["vanilla"]),
        "marian": statistics.median(increase["marian"]),
        "ratio": statistics.median(_ratio(v, m) for v, m in zip(increase["vanilla"], increase["marian"])),
        "best_ratio": _ratio(min(increase["vanilla"]), min(increase["marian"])),
        "vanilla_peak_mib": statistics.median(peak["vanilla"]),
        "marian_peak_mib": statistics.median(peak["marian"]),
        "peak_ratio": statistics.median(_ratio(v, m) for v, m in zip(peak["vanilla"], peak["marian"])),
        "method": runs["vanilla"][0]["method"],
        "runs": runs,
    }


# --------------------------------------------------------------------------------------------------------------------
# The run


def machine_description(settings: BenchmarkSettings) -> dict:
    import transformers

    description = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "threads": settings.threads,
    }
    if settings.device == "cuda":
        description["gpu"] = torch.cuda.get_device_name()
    return description


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            match = re.search(r"^model name\s*:\s*(.+)$", cpuinfo.read(), re.MULTILINE)
            return match.group(1) if match else platform.processor()
    except OSError:
        return platform.processor()


def run_benchmark(
    settings: BenchmarkSettings,
    progress: Callable[[str], None] | None = None,
    on_row: Callable[[dict], None] | None = None,
) -> dict:
    """Run every asked row at every asked size; returns a JSON-ready dict (see ``format_table``).

    ``on_row`` receives the results so far after every row, so that a run cut short still leaves its measurements.
    """
    settings = settings.resolved()
    progress = progress or (lambda message: None)
    torch.set_num_threads(settings.threads)
    peak_dtypes = sorted({settings.dtype} | ({"bf16"} if "train_bf16" in settings.rows else set()))
    # The peak is measured before and after each size and the best is kept: a busy machine only ever lowers it.
    peaks = {dtype: [] for dtype in peak_dtypes}

    def measure_peaks() -> None:
        progress("matmul peak")
        for dtype in peak_dtypes:
            peaks[dtype].append(matmul_peak_flops(settings, dtype))

    measure_peaks()
    results = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_description(settings),
        "settings": asdict(settings),
        "matmul_peak_samples": peaks,
        "rows": [],
    }
    for size in settings.sizes:
        for row in settings.rows:
            progress(f"{size} {row}")
            gc.collect()
            results["rows"].extend(_measure(row, size, settings))
            if on_row is not None:
                on_row(_summarise(results))
        measure_peaks()
    return _summarise(results)


def _summarise(results: dict) -> dict:
    """Add the best matmul peak so far and the MFU of the training rows."""
    results["matmul_peak_flops"] = {dtype: max(values) for dtype, values in results["matmul_peak_samples"].items()}
    for entry in results["rows"]:
        if "flops_per_step" in entry:
            peak = results["matmul_peak_flops"][entry["dtype"]]
            for name in MODELS:
                entry[f"{name}_mfu"] = entry["flops_per_step"] / statistics.median(entry[f"{name}_seconds"]) / peak
    return results


def _measure(row: str, size: str, settings: BenchmarkSettings) -> list[dict]:
    if row.startswith("memory"):
        return [memory_row(size, settings, LABEL_SMOOTHING if row == "memory_ls" else 0.0)]
    models = {name: build_model(name, size, settings) for name in MODELS}
    if row.startswith("train"):
        batch = training_batch(size, settings)
        dtype = "bf16" if row == "train_bf16" else settings.dtype
        calls, warmup = {}, settings.warmup
        for name, model in models.items():
            model.train()
            optimizer = trainer_optimizer(model)
            if row == "train_compiled":
                model, warmup = torch.compile(model), settings.compile_warmup
            smoothing = LABEL_SMOOTHING if row == "train_ls" else 0.0
            calls[name] = training_step(model, optimizer, batch, settings, dtype, smoothing)
        times = interleaved_times(calls, settings.pairs, warmup, settings.device)
        tokens = settings.train_batch_size * settings.train_tgt_len
        entry = throughput_row(row, size, "tgt tok/s", tokens, times)
        flops = training_flops(size, settings.train_batch_size, settings.train_src_len, settings.train_tgt_len)
        entry["flops_per_step"] = flops
        entry["dtype"] = dtype
        return [entry]

    inputs = generation_inputs(size, settings)
    calls, warmup = {}, settings.warmup
    for name, model in models.items():
        model.eval()
        if row == "greedy":
            calls[name] = generation_call(model, inputs, settings, num_beams=1)
        elif row == "beam":
            calls[name] = generation_call(model, inputs, settings, num_beams=settings.num_beams)
        else:  # greedy_static_compiled: transformers compiles the decoding forward for the static cache
            compile_config = CompileConfig(fullgraph=True, dynamic=False, mode="default")
            compile_config._compile_all_devices = True  # transformers otherwise compiles on accelerators only
            calls[name] = generation_call(
                model, inputs, settings, num_beams=1, cache_implementation="static", compile_config=compile_config
            )
            warmup = settings.compile_warmup
    times = interleaved_times(calls, settings.pairs, warmup, settings.device)
    return [throughput_row(row, size, "new tok/s", settings.gen_batch_size * settings.new_tokens, times)]


ROW_LABELS = {
    "train": "train step",
    "train_compiled": "train step, torch.compile",
    "train_bf16": "train step, bf16 autocast",
    "train_ls": "train step, label smoothing 0.1",
    "memory": "train peak memory (increase)",
    "memory_ls": "train peak memory (increase), label smoothing 0.1",
    "greedy": "greedy generate",
    "beam": "beam generate",
    "greedy_static_compiled": "greedy, static cache + compile",
}


def format_table(results: dict) -> str:
    """A Markdown table: one line per (size, measurement), with the MFU of every training row."""
    settings = results["settings"]
    lines = [
        f"{results['date']} · {results['machine']['cpu']}"
        + (f" · {results['machine']['gpu']}" if "gpu" in results["machine"] else "")
        + f" · {settings['device']} {settings['dtype']} · {settings['threads']} thread(s) · torch "
        + f"{results['machine']['torch']} · transformers {results['machine']['transformers']}",
        "matmul peak (best n×n×n torch.matmul, n = "
        + f"{settings['gemm_size']}): "
        + ", ".join(f"{dtype} {flops / 1e9:,.1f} GFLOP/s" for dtype, flops in results["matmul_peak_flops"].items()),
        "",
        "| size | measurement | unit | vanilla | Marian | ratio V/M | best-call ratio |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for entry in results["rows"]:
        label = ROW_LABELS[entry["row"]]
        if entry["row"] == "beam":
            label = f"beam-{settings['num_beams']} generate"
        lines.append(
            f"| {entry['size']} | {label} | {entry['unit']} | {entry['vanilla']:,.1f} | {entry['marian']:,.1f} "
            f"| {entry['ratio']:.2f}× | {entry['best_ratio']:.2f}× |"
        )
        if "vanilla_mfu" in entry:
            lines.append(
                f"| {entry['size']} | {label}: MFU | % of {entry['dtype']} matmul peak "
                f"| {100 * entry['vanilla_mfu']:.1f} | {100 * entry['marian_mfu']:.1f} | | |"
            )
        if entry["row"].startswith("memory"):
            lines.append(
                f"| {entry['size']} | train peak memory (whole process) | MiB | {entry['vanilla_peak_mib']:,.0f} "
                f"| {entry['marian_peak_mib']:,.0f} | {entry['peak_ratio']:.2f}× | |"
            )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------------------------
# Profiles


def profile_models(settings: BenchmarkSettings, steps: int = 2, row_limit: int = 20) -> dict[str, dict]:
    """torch.profiler tables of a training step and of greedy generation, for both models at every size.

    Besides the top operators it reports how much of the wall time is spent inside ATen operators at all: the rest
    is Python and framework overhead (module calls, mask and cache bookkeeping, generate's logits processing).
    """
    from torch.profiler import ProfilerActivity, profile

    settings = settings.resolved()
    torch.set_num_threads(settings.threads)
    reports = {}
    for size in settings.sizes:
        for name in MODELS:
            model = build_model(name, size, settings)
            optimizer = trainer_optimizer(model)
            workloads = {
                # train.py's path: label smoothing 0.1 (by the model itself for ours, LabelSmoother for Marian)
                "train": training_step(
                    model.train(), optimizer, training_batch(size, settings), settings, label_smoothing=LABEL_SMOOTHING
                ),
                "greedy": generation_call(model, generation_inputs(size, settings), settings, num_beams=1),
            }
            for workload, call in workloads.items():
                model.train(workload == "train")
                call()  # warm-up
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    start = time.perf_counter()
                    for _ in range(steps):
                        call()
                    wall = time.perf_counter() - start
                events = prof.key_averages()
                # top-level ATen time: the self time of every aten:: op adds up to the time spent in kernels
                aten_us = sum(event.self_cpu_time_total for event in events if event.key.startswith("aten::"))
                reports[f"{size}/{name}/{workload}"] = {
                    "wall_s": wall / steps,
                    "aten_self_s": aten_us / 1e6 / steps,
                    "outside_aten_fraction": max(0.0, 1 - aten_us / 1e6 / wall),
                    "table": events.table(sort_by="self_cpu_time_total", row_limit=row_limit),
                }
    return reports
