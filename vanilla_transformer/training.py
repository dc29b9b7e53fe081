"""What scripts/train.py, translate.py and average_checkpoints.py share: model presets, the paper's training recipe as
`Seq2SeqTrainingArguments` defaults, building the model and the trainer, metrics, checkpoint averaging, translation.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch
from transformers import (
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    GenerationConfig,
    PreTrainedModel,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    TrainerCallback,
)
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_callback import ExportableState, ProgressCallback
from transformers.trainer_utils import SchedulerType

from .batching import TokenBatchingSeq2SeqTrainer
from .checkpointing import load_trained_model
from .configuration_vanilla_transformer import VanillaTransformerConfig
from .modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from .process_group import init_cpu_process_group
from .sharding import (
    ParallelismReportCallback,
    check_parallelism_can_run,
    enable_fsdp_on_cpu,
    load_full_state_dict_checkpoint,
    model_class_unwrapped,
    share_tied_tensors,
    tied_names,
)
from .time_budget import (
    BudgetProgressCallback,
    TimeBudgetCallback,
    check_minutes,
    check_scheduler,
    find_time_budget,
)

# --------------------------------------------------------------------------------------------------------------------
# Presets
# --------------------------------------------------------------------------------------------------------------------

# Each preset: the model (VanillaTransformerConfig fields), the tokenizer's vocabulary size when train.py trains one,
# the default longest source/target in tokens, and training defaults that replace TranslationTrainingArguments'
# defaults unless given on the command line.
# Learning rates follow the paper's schedule lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) (§5.3), whose
# peak, reached at the end of warmup, is d_model^-0.5 * warmup^-0.5: 7e-4 for base and 4.9e-4 for big (warmup 4000).
PRESETS: dict[str, dict] = {
    "small": {
        "description": "a small model for the built-in demo corpus; learns it in about two minutes on 2 CPU cores",
        "config": {
            "d_model": 128,
            "encoder_layers": 2,
            "decoder_layers": 2,
            "encoder_attention_heads": 4,
            "decoder_attention_heads": 4,
            "encoder_ffn_dim": 512,
            "decoder_ffn_dim": 512,
            "dropout": 0.1,
            "max_position_embeddings": 256,
        },
        # 400 entries leave ~140 merges after the 256 bytes: German numbers split into pieces like "drei", "tausend",
        # "ein", "undsiebzig", so that the model has to reorder units and tens itself
        "vocab_size": 400,
        "max_length": 64,
        "training": {
            # measured over 8 seeds on 2 CPU cores (2026-11): test BLEU 98.5-100 on every seed; 6 epochs at 2e-3
            # let one seed fall to 89.4 % exact match
            "learning_rate": 1e-3,
            "warmup_steps": 200,
            "num_train_epochs": 15,
            "per_device_train_batch_size": 64,
            "per_device_eval_batch_size": 128,
            "logging_steps": 50,
            "save_strategy": "epoch",
            "save_total_limit": 5,
            # sentences of 2-10 tokens in a 1M-parameter model: an extra pass costs more than the padding it saves
            # (the whole demo trained no faster with length chunks, docs/training.md)
            "length_chunks": False,
        },
    },
    "compact": {
        "description": "the default for your own data: d_model 256, 3+3 layers, 4 heads, d_ff 1024, an 8000-token "
        "vocabulary, token batches and a linear decay; trains a strong translator from tens of thousands of pairs on a "
        "CPU (docs/training.md)",
        "config": {
            "d_model": 256,
            "encoder_layers": 3,
            "decoder_layers": 3,
            "encoder_attention_heads": 4,
            "decoder_attention_heads": 4,
            "encoder_ffn_dim": 1024,
            "decoder_ffn_dim": 1024,
            "dropout": 0.1,
        },
        "vocab_size": 8000,
        "max_length": 256,
        # measured on a 57k-pair English-French corpus against Marian's recipe: see docs/training.md
        "training": {
            "learning_rate": 1e-3,
            "warmup_steps": 400,
            "lr_scheduler_type": "linear",
            "max_tokens_per_batch": 512,
            "per_device_eval_batch_size": 64,
            "save_steps": 1000,
            "save_total_limit": 3,
        },
    },
    "base": {
        "description": "the paper's base model (Table 3): d_model 512, 6+6 layers, 8 heads, d_ff 2048, dropout 0.1",
        "config": {},  # VanillaTransformerConfig's defaults are the base model
        "vocab_size": 37000,  # §5.1: a shared source-target vocabulary of about 37000 tokens (WMT En-De)
        "max_length": 256,
        "training": {"learning_rate": 7e-4, "warmup_steps": 4000, "per_device_train_batch_size": 64},
    },
    "big": {
        "description": "the paper's big model (Table 3): d_model 1024, 6+6 layers, 16 heads, d_ff 4096, dropout 0.3",
        "config": {
            "d_model": 1024,
            "encoder_attention_heads": 16,
            "decoder_attention_heads": 16,
            "encoder_ffn_dim": 4096,
            "decoder_ffn_dim": 4096,
            "dropout": 0.3,
        },
        "vocab_size": 37000,
        "max_length": 256,
        "training": {"learning_rate": 4.9e-4, "warmup_steps": 4000, "per_device_train_batch_size": 32},
    },
}


def parse_config_overrides(overrides: str | None) -> dict:
    """`"d_model=64,dropout=0.2,position_embedding_type=learned"` -> a dict; values are parsed as JSON when they can
    be (numbers, true/false, null), else kept as strings."""
    result = {}
    for item in (overrides or "").split(","):
        if not item.strip():
            continue
        if "=" not in item:
            raise ValueError(f"--config_overrides: {item!r} is not of the form key=value.")
        key, value = (part.strip() for part in item.split("=", 1))
        if key not in inspect.signature(VanillaTransformerConfig.__init__).parameters:
            raise ValueError(f"--config_overrides: {key!r} is not a VanillaTransformerConfig field.")
        try:
            result[key] = json.loads(value)
        except json.JSONDecodeError:
            result[key] = value
    return result


def build_config(
    preset: str | None = None,
    config_name: str | None = None,
    overrides: dict | None = None,
    vocab_size: int | None = None,
) -> VanillaTransformerConfig:
    """A fresh model's config: from a JSON file/folder (`config_name`) or a preset, then `overrides`; `vocab_size`
    (the tokenizer's) replaces the config's unless the config already holds that many entries."""
    if config_name is not None:
        if not os.path.exists(config_name):
            raise ValueError(f"--config_name {config_name!r} does not exist.")
        if os.path.isdir(config_name):
            config = VanillaTransformerConfig.from_pretrained(config_name)
        else:
            config = VanillaTransformerConfig.from_json_file(config_name)
        fields = config.to_dict()
    else:
        if preset not in PRESETS:
            raise ValueError(f"--preset {preset!r} is unknown; allowed: {', '.join(PRESETS)}.")
        fields = dict(PRESETS[preset]["config"])
    if config_name is None and vocab_size is not None:
        # a preset's vocabulary is the tokenizer's; a config file's is what the user wrote (checked against it later)
        fields["vocab_size"] = fields["decoder_vocab_size"] = vocab_size
    fields.update(overrides or {})
    fields.pop("model_type", None)
    fields.pop("transformers_version", None)
    return VanillaTransformerConfig(**fields)


def default_generation_config(config, num_beams: int = 4, max_length: int = 257) -> GenerationConfig:
    """Beam search as in the paper (§6.1: beam size 4); `max_length` counts the decoder start token. Beam search
    stops by transformers' default rule (`early_stopping=False`: when no running beam can still beat the finished
    ones), not at the first `num_beams` finished hypotheses (`True`), which can return a short, broken hypothesis
    while a running beam would have scored better: a demo training decoded 40 % of its test set exactly with `True`
    and 100 % with `False`."""
    return GenerationConfig(
        num_beams=num_beams,
        max_length=max_length,
        early_stopping=False,
        decoder_start_token_id=config.decoder_start_token_id,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )


# --------------------------------------------------------------------------------------------------------------------
# Training arguments: the paper's recipe as defaults
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class TranslationTrainingArguments(Seq2SeqTrainingArguments):
    """`Seq2SeqTrainingArguments` (every flag) with the paper's recipe (§5.3, §5.4, §6.1) as defaults: Adam with
    β1 = 0.9, β2 = 0.98, ε = 1e-9 (AdamW with weight decay 0 is Adam), linear warmup then inverse square root decay,
    label smoothing 0.1, evaluation by beam search with beam 4. (Dropout 0.1 is a model setting: see --preset.)"""

    learning_rate: float = field(
        default=7e-4,
        metadata={"help": "Peak learning rate, reached after warmup: d_model^-0.5 * warmup_steps^-0.5 in the paper."},
    )
    lr_scheduler_type: SchedulerType | str = field(
        default="inverse_sqrt",
        metadata={"help": "Learning rate schedule; the paper's is linear warmup then inverse square root decay."},
    )
    warmup_steps: float = field(default=4000, metadata={"help": "Linear warmup steps (the paper: 4000)."})
    adam_beta1: float = field(default=0.9, metadata={"help": "Adam β1 (the paper: 0.9)."})
    adam_beta2: float = field(default=0.98, metadata={"help": "Adam β2 (the paper: 0.98)."})
    adam_epsilon: float = field(default=1e-9, metadata={"help": "Adam ε (the paper: 1e-9)."})
    weight_decay: float = field(default=0.0, metadata={"help": "Weight decay; 0 makes AdamW the paper's Adam."})
    label_smoothing_factor: float = field(default=0.1, metadata={"help": "Label smoothing ε_ls (the paper: 0.1)."})
    predict_with_generate: bool = field(
        default=True, metadata={"help": "Evaluate and predict by generating translations (needed for BLEU/chrF)."}
    )
    generation_num_beams: int | None = field(
        default=4, metadata={"help": "Beam size for evaluation and prediction (the paper: 4)."}
    )
    generation_max_length: int | None = field(
        default=None,
        metadata={"help": "Longest generated output in tokens, start token included; defaults to max_target_length+1."},
    )
    resume_from_checkpoint: str | None = field(
        default=None,
        metadata={"help": "Resume training from this checkpoint folder, or from the newest one in output_dir: 'last'."},
    )
    max_tokens_per_batch: int | None = field(
        default=None,
        metadata={
            "help": "Token-based batching (fairseq's --max-tokens): batches of pairs of similar length holding at most "
            "this many padded tokens on the source side and on the target side each, per process and accumulation "
            "step, shuffled by batch each epoch; per_device_train_batch_size then no longer applies to training. "
            "The paper used about 25000."
        },
    )
    length_chunks: bool | None = field(
        default=None,
        metadata={
            "help": "Run a training batch whose sentences differ much in length in chunks of similar length (the same "
            "batch and gradient, less padding). Default: on CPU, where it was measured to pay on real corpora; off on "
            "GPUs (not measured there) and in the small preset (the demo's short sentences). Several processes agree "
            "on each batch's number of chunks."
        },
    )
    threads: int | None = field(
        default=None,
        metadata={
            "help": "CPU threads for PyTorch. Default: one per physical core that is idle when training starts (all "
            "of them on an idle machine), so that a machine shared with other work does not slow training down "
            "many-fold (only the CPUs this process may use count: affinity, cgroup quota); a run resumed from a "
            "checkpoint takes the count saved with it, so that its float sums stay the same; OMP_NUM_THREADS is "
            "respected too."
        },
    )
    max_train_minutes: float | None = field(
        default=None,
        metadata={
            "help": "Stop training after this many minutes of training time (fairseq's --stop-time-hours), counting "
            "the training steps and their data loading but not evaluation or checkpoint saving during training; "
            "the time spent is saved with each checkpoint, so a resumed run trains only for the rest. With neither "
            "--max_steps nor --num_train_epochs given, the budget alone ends training; otherwise whichever limit "
            "comes first. linear and cosine schedules decay over the budget; inverse_sqrt, constant and "
            "constant_with_warmup are unchanged; other schedules are refused."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        check_minutes(self.max_train_minutes)
        if self.max_train_minutes is not None:
            check_scheduler(self.lr_scheduler_type, self.lr_scheduler_kwargs)

    @cached_property
    def _setup_devices(self) -> torch.device:
        init_cpu_process_group(self)  # so that --ddp_timeout holds on CPU too (transformers 5.24 drops it there)
        return super()._setup_devices


def training_defaults(preset: str) -> dict:
    """The training-argument defaults a preset brings (applied unless the flag is given)."""
    if preset not in PRESETS:
        raise ValueError(f"--preset {preset!r} is unknown; allowed: {', '.join(PRESETS)}.")
    return dict(PRESETS[preset]["training"])


def implied_defaults(given: set[str], values: dict, accelerator_available: bool = True) -> dict:
    """The training-argument defaults that the flags the user gave imply, to apply on top of a preset's (so that they
    win over it), computed before TrainingArguments checks its values; a flag given always wins over these.

    `given` holds the names of the flags given; `values` every training argument's value as parsed so far (the
    preset's defaults in place). A step count without its strategy means that strategy by steps (--save_steps 20 saves
    every 20 steps, although the `small` preset saves every epoch; --eval_steps likewise). With
    --load_best_model_at_end and no flag about saving, checkpoints follow the evaluations, as transformers requires.
    Without an accelerator, --bf16 (or --bf16_full_eval) means bf16 on the CPU (--use_cpu), which transformers would
    otherwise refuse ("Your setup doesn't support bf16/gpu")."""
    implied: dict = {}
    for kind in ("save", "eval"):
        if f"{kind}_steps" in given and f"{kind}_strategy" not in given:
            implied[f"{kind}_strategy"] = "steps"
    if values.get("load_best_model_at_end") and not {"save_strategy", "save_steps"} & given:
        eval_strategy = implied.get("eval_strategy", values.get("eval_strategy"))
        eval_strategy = str(getattr(eval_strategy, "value", eval_strategy))
        implied["save_strategy"] = eval_strategy
        if eval_strategy == "steps":
            # transformers evaluates every logging_steps when eval_steps is not given
            implied["save_steps"] = values.get("eval_steps") or values.get("logging_steps")
    if not accelerator_available and "use_cpu" not in given and (values.get("bf16") or values.get("bf16_full_eval")):
        implied["use_cpu"] = True
    return implied


def use_cpu_if_no_accelerator() -> bool:
    """`accelerate launch --multi_gpu` on a machine without GPUs starts N processes, but unless they are told to use
    the CPU each of them trains alone (Accelerate finds no GPU backend). Tell them, so that they join a gloo group.
    Returns True when it did."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1 and not torch.accelerator.is_available():
        os.environ["ACCELERATE_USE_CPU"] = "true"
        return True
    return False


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
    the threads spin waiting for the one that shares it, and training slows down several-fold (docs/training.md). So
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


# --------------------------------------------------------------------------------------------------------------------
# Trainer and metrics
# --------------------------------------------------------------------------------------------------------------------


def make_compute_metrics(tokenizer) -> Callable:
    """compute_metrics for Seq2SeqTrainer with predict_with_generate: sacreBLEU, chrF (the package's own `evaluate`
    modules, offline), exact match (%, after stripping spaces) and the mean generated length in tokens."""
    from .metrics import load_metric

    bleu, chrf = load_metric("sacrebleu"), load_metric("chrf")
    pad = tokenizer.pad_token_id

    def compute_metrics(eval_prediction) -> dict[str, float]:
        predictions, labels = eval_prediction.predictions, eval_prediction.label_ids
        if isinstance(predictions, tuple):
            predictions = predictions[0]
        # -100 marks padding that the Trainer added between batches; it is not a token
        predictions = np.where(predictions != -100, predictions, pad)
        labels = np.where(labels != -100, labels, pad)
        hypotheses = [s.strip() for s in tokenizer.batch_decode(predictions, skip_special_tokens=True)]
        references = [s.strip() for s in tokenizer.batch_decode(labels, skip_special_tokens=True)]
        return {
            "bleu": round(bleu.compute(predictions=hypotheses, references=references)["score"], 4),
            "chrf": round(chrf.compute(predictions=hypotheses, references=references)["score"], 4),
            "exact_match": round(100.0 * float(np.mean([h == r for h, r in zip(hypotheses, references)])), 4),
            "gen_len": round(float(np.mean(np.count_nonzero(predictions != pad, axis=1))), 4),
        }

    return compute_metrics


class TranslationTrainer(TokenBatchingSeq2SeqTrainer):
    """The trainer train.py uses: token batching (TokenBatchingSeq2SeqTrainer), FSDP on CPU processes when the
    launch asked for it (`enable_fsdp_on_cpu`: Accelerate alone would train them with plain data parallelism), and
    label smoothing computed by the model.

    With ``label_smoothing_factor``, a model whose ``forward`` takes ``label_smoothing`` (ours) computes the smoothed
    training loss itself, with the same value as Trainer's ``LabelSmoother`` (which needs a log-softmax of the logits'
    size and its backward), and in training steps a model that takes ``skip_logits`` returns that loss without making
    the logits at all. (Evaluation keeps the logits; with generation it keeps ``LabelSmoother``: it has no backward.)
    """

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        forward = inspect.signature(self.accelerator.unwrap_model(model).forward).parameters
        smoother, extra = self.label_smoother, {}
        if smoother is not None and "label_smoothing" in forward:
            extra["label_smoothing"] = smoother.epsilon
        if not return_outputs and "skip_logits" in forward and (smoother is None or extra):
            extra["skip_logits"] = True  # a training step: only the loss is used
        if not extra or "labels" not in inputs or self.compute_loss_func is not None:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        # Trainer would pop the labels and smooth the logits itself; hand the labels and ε to the model instead
        self.label_smoother = None
        try:
            return super().compute_loss(model, {**inputs, **extra}, return_outputs, num_items_in_batch)
        finally:
            self.label_smoother = smoother

    def create_accelerator_and_postprocess(self) -> None:
        check_parallelism_can_run(self.args)
        super().create_accelerator_and_postprocess()
        if enable_fsdp_on_cpu(self.accelerator, self.args):
            self.is_fsdp_enabled = True
            # the check transformers makes when Accelerate keeps the plugin itself
            if self.accelerator.state.fsdp_plugin.activation_checkpointing and self.args.activation_checkpointing:
                raise ValueError(
                    "FSDP's activation checkpointing (fsdp_activation_checkpointing) and --gradient_checkpointing "
                    "(--activation_checkpointing) both checkpoint the layers; choose one."
                )

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        # under FSDP, `state_dict` is the gathered full one: tied names become one tensor again, and the model saves
        # as its own class
        if state_dict is not None:
            state_dict = share_tied_tensors(state_dict, self.model)
        with model_class_unwrapped(self.model):
            super()._save(output_dir, state_dict=state_dict)

    def _run_epoch(self, *args, **kwargs):
        # transformers 5.24's _inner_training_loop enters the epoch loop before it checks max_steps or a stop: resumed
        # from a run's final checkpoint (global step = max_steps, not at an epoch's end, or a spent time budget), it
        # would train one step more. A finished run trains nothing. (tests/test_resume_kill.py fails without this.)
        if self.state.global_step >= self.state.max_steps or self.control.should_training_stop:
            self.control.should_training_stop = True
            return
        return super()._run_epoch(*args, **kwargs)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        full = os.path.join(resume_from_checkpoint, "pytorch_model_fsdp.bin")  # FSDP's FULL_STATE_DICT checkpoint
        if self.is_fsdp_enabled and self.accelerator.is_fsdp2 and os.path.isfile(full):
            load_full_state_dict_checkpoint(self.accelerator, model if model is not None else self.model, full)
            return
        super()._load_from_checkpoint(resume_from_checkpoint, model)

    def _issue_warnings_after_load(self, load_result) -> None:
        # transformers 5.24's Trainer resumes with torch's load_state_dict, which reports missing every name that the
        # checkpoint stores once: the shared embedding's names under the stacks and the tied lm_head. They are loaded
        # with the name they alias; only a name whose tensor was not loaded under any name is missing.
        aliases, missing = tied_names(self.model), set(load_result.missing_keys)
        missing = [name for name in load_result.missing_keys if aliases.get(name, name) in missing]
        super()._issue_warnings_after_load(load_result._replace(missing_keys=missing))


def build_trainer(
    model: PreTrainedModel,
    args: Seq2SeqTrainingArguments,
    tokenizer,
    train_dataset=None,
    eval_dataset=None,
    compute_metrics: Callable | None = None,
    callbacks: Sequence[TrainerCallback] | None = None,
) -> Seq2SeqTrainer:
    """The one place the trainer is built. The collator pads each batch to its longest pair and builds
    decoder_input_ids from the labels (the model's shift right), which label smoothing needs. With
    `args.max_train_minutes`, a TimeBudgetCallback stops training and drives the learning-rate schedule; a
    CpuThreadsCallback saves the CPU thread count with each checkpoint, for a resumed run to reuse."""
    collator = DataCollatorForSeq2Seq(
        tokenizer,
        model=model,
        label_pad_token_id=-100,  # padded label positions are left out of the loss
        pad_to_multiple_of=8 if args.fp16 or args.bf16 else None,
    )
    minutes = getattr(args, "max_train_minutes", None)
    trainer = TranslationTrainer(
        model=model,
        args=args,
        data_collator=collator,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        compute_metrics=compute_metrics if args.predict_with_generate else None,
        callbacks=[ParallelismReportCallback(), CpuThreadsCallback(), *(callbacks or [])]
        + ([TimeBudgetCallback(minutes)] if minutes is not None else []),
        max_tokens_per_batch=getattr(args, "max_tokens_per_batch", None),
    )
    budget = find_time_budget(trainer.callback_handler.callbacks)
    if budget is not None and trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(BudgetProgressCallback(budget))  # minutes of the budget rather than steps
    return trainer


# --------------------------------------------------------------------------------------------------------------------
# Checkpoint averaging
# --------------------------------------------------------------------------------------------------------------------


def load_weights(checkpoint: str) -> dict[str, torch.Tensor]:
    """The tensors of a saved model (one safetensors file or a sharded set), as stored: tied copies appear once."""
    from safetensors.torch import load_file

    single = os.path.join(checkpoint, "model.safetensors")
    index = os.path.join(checkpoint, "model.safetensors.index.json")
    if os.path.isfile(single):
        return load_file(single)
    if os.path.isfile(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        weights = {}
        for shard in shards:
            weights.update(load_file(os.path.join(checkpoint, shard)))
        return weights
    raise ValueError(f"{checkpoint!r} holds no model.safetensors (or sharded index); is it a saved model?")


def average_weights(checkpoints: Sequence[str]) -> dict[str, torch.Tensor]:
    """The element-wise mean of the checkpoints' floating-point tensors, summed in float64 and rounded once to each
    tensor's dtype; other tensors (integer buffers) must be equal in all checkpoints and are kept."""
    if not checkpoints:
        raise ValueError("no checkpoints to average.")
    total: dict[str, torch.Tensor] = {}
    for i, checkpoint in enumerate(checkpoints):
        weights = load_weights(checkpoint)
        if i == 0:
            dtypes = {name: tensor.dtype for name, tensor in weights.items()}
            total = {
                name: tensor.to(torch.float64) if tensor.is_floating_point() else tensor
                for name, tensor in weights.items()
            }
            continue
        if weights.keys() != total.keys():
            raise ValueError(f"{checkpoint!r} has different tensors from {checkpoints[0]!r}; is it the same model?")
        for name, tensor in weights.items():
            if tensor.shape != total[name].shape:
                raise ValueError(
                    f"{checkpoint!r}: {name} has shape {tuple(tensor.shape)}, expected {tuple(total[name].shape)}."
                )
            if tensor.is_floating_point():
                total[name] += tensor.to(torch.float64)
            elif not torch.equal(tensor, total[name]):
                raise ValueError(f"{checkpoint!r}: the non-float tensor {name} differs between checkpoints.")
    return {
        name: (tensor / len(checkpoints)).to(dtypes[name]) if dtypes[name].is_floating_point else tensor
        for name, tensor in total.items()
    }


def save_averaged_model(checkpoints: Sequence[str], output_dir: str) -> PreTrainedModel:
    """Average `checkpoints` into a model saved in `output_dir` with the last checkpoint's config, generation config
    and tokenizer, loadable with `AutoModelForSeq2SeqLM.from_pretrained(output_dir)`."""
    averaged = average_weights(checkpoints)
    model = load_trained_model(checkpoints[-1])
    missing, unexpected = model.load_state_dict(averaged, strict=False)
    if unexpected:
        raise ValueError(f"the checkpoints hold tensors the model does not have: {unexpected[:5]}")
    # tied weights (lm_head = the shared embedding) are stored once, so their other names are the only ones missing
    untied = set(missing) - tied_names(model).keys()
    if untied:
        raise ValueError(f"the checkpoints lack tensors of the model: {sorted(untied)[:5]}")
    os.makedirs(output_dir, exist_ok=True)
    model.save_pretrained(output_dir)
    try:
        AutoTokenizer.from_pretrained(checkpoints[-1]).save_pretrained(output_dir)
    except (OSError, ValueError):
        pass  # a checkpoint saved without its tokenizer: the model is still usable with the original one
    return model


# --------------------------------------------------------------------------------------------------------------------
# Translation
# --------------------------------------------------------------------------------------------------------------------


def load_translator(model_dir: str, device: str | None = None):
    """(model, tokenizer) from a saved model folder, in eval mode, on `device` (default: GPU if there is one)."""
    if not os.path.isdir(model_dir):
        raise ValueError(f"--model_dir {model_dir!r} is not a folder.")
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise ValueError(f"--model_dir {model_dir!r} holds no config.json; is it a saved model?")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = load_trained_model(model_dir)
    if device is None:
        device = torch.accelerator.current_accelerator().type if torch.accelerator.is_available() else "cpu"
    return model.to(device).eval(), tokenizer


def translate_in_batches(
    encoded: Sequence[Sequence | None],
    run_batch: Callable[[list], list[str] | Callable[[], list[str]]],
    *,
    batch_size: int = 32,
    progress: bool | None = None,
    lookahead: int = 0,
) -> list[str]:
    """The batching of `translate`, whatever the engine: `encoded` holds each sentence's tokens (None for an empty
    line, which translates to an empty line); sentences of similar length go through `run_batch` together (less
    padding), and the translations come back in input order. `progress`: a tqdm bar (default: when there is more than
    one batch).

    An engine that translates several batches at once returns from `run_batch` a function that waits for the
    translations; `lookahead` batches are then submitted ahead of the one being waited for."""
    from tqdm.auto import tqdm

    if batch_size <= 0:
        raise ValueError(f"batch_size={batch_size} must be positive.")
    todo = sorted((i for i, ids in enumerate(encoded) if ids is not None), key=lambda i: len(encoded[i]))
    batches = [todo[start : start + batch_size] for start in range(0, len(todo), batch_size)]
    translations = [""] * len(encoded)
    bar = tqdm(total=len(todo), unit="sent", disable=not (len(batches) > 1 if progress is None else progress))
    submitted = []
    for index, batch in enumerate(batches):
        while len(submitted) <= min(index + lookahead, len(batches) - 1):
            submitted.append(run_batch([encoded[i] for i in batches[len(submitted)]]))
        texts, submitted[index] = submitted[index], None
        for i, text in zip(batch, texts() if callable(texts) else texts):
            translations[i] = text.strip()
        bar.update(len(batch))
    bar.close()
    return translations


@torch.inference_mode()
def translate(
    model: PreTrainedModel,
    tokenizer,
    sentences: Sequence[str],
    *,
    batch_size: int = 32,
    num_beams: int | None = None,
    length_penalty: float | None = None,
    max_new_tokens: int | None = None,
    extra_tokens: int = 50,
    progress: bool | None = None,
) -> list[str]:
    """Translate `sentences` with beam search, in batches of similar length (less padding), returning the
    translations in input order. Without `max_new_tokens`, each batch may produce its longest input + `extra_tokens`
    tokens (§6.1: "maximum output length to input length + 50"). `num_beams` and `length_penalty` default to the
    model's generation config. `progress`: a tqdm bar (default: when there is more than one batch). Empty lines
    translate to empty lines."""
    encoded = [tokenizer(s)["input_ids"] if s.strip() else None for s in sentences]
    device = next(model.parameters()).device

    def run_batch(batch: list[list[int]]) -> list[str]:
        inputs = tokenizer.pad({"input_ids": batch}, return_tensors="pt").to(device)
        limit = max_new_tokens if max_new_tokens is not None else inputs["input_ids"].shape[1] + extra_tokens
        kwargs = {"max_new_tokens": limit, "max_length": None}  # the generation config's max_length yields to it
        if num_beams is not None:
            kwargs["num_beams"] = num_beams
        if length_penalty is not None:
            kwargs["length_penalty"] = length_penalty
        outputs = model.generate(**inputs, **kwargs)
        return tokenizer.batch_decode(outputs, skip_special_tokens=True)

    return translate_in_batches(encoded, run_batch, batch_size=batch_size, progress=progress)


__all__ = [
    "CpuThreadsCallback",
    "PRESETS",
    "TranslationTrainingArguments",
    "VanillaTransformerForConditionalGeneration",
    "average_weights",
    "build_config",
    "build_trainer",
    "default_generation_config",
    "load_translator",
    "make_compute_metrics",
    "recorded_threads",
    "save_averaged_model",
    "set_cpu_threads",
    "translate",
    "translate_in_batches",
]
