"""`TranslationTrainingArguments`: every `Seq2SeqTrainingArguments` flag with the paper's recipe as defaults, plus the
defaults that the flags a user gives imply."""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import Seq2SeqTrainingArguments
from transformers.trainer_utils import SchedulerType

from .time_budget import TimeBudgetArguments
from .workarounds.overrides import TrainingArgumentsOverrides


@dataclass
class TranslationTrainingArguments(TrainingArgumentsOverrides, TimeBudgetArguments, Seq2SeqTrainingArguments):
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
