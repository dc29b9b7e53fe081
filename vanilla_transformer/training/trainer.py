"""The trainer train.py uses, the one place it is built, and its metrics."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator, Sequence
from functools import partial

import datasets
import numpy as np
from torch.utils.data import Sampler
from transformers import (
    DataCollatorForSeq2Seq,
    EvalPrediction,
    PreTrainedModel,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    TrainerCallback,
)
from transformers.trainer_callback import ProgressCallback
from transformers.trainer_utils import EvalLoopOutput, PredictionOutput

from .batching import TokenBatchingSeq2SeqTrainer, sequence_lengths
from .cpu import CpuThreadsCallback
from .data import REFERENCE_COLUMN
from .sharding import ParallelismReportCallback, check_parallelism_can_run
from .time_budget import BudgetProgressCallback, TimeBudgetCallback, find_time_budget
from .workarounds import accelerate_fsdp_on_cpu, torch_gloo_group_teardown
from .workarounds.overrides import TrainerOverrides


def generated_lengths(predictions: np.ndarray, pad: int, eos: int | None, start: int | None) -> np.ndarray:
    """Tokens in each generated row up to and including its first eos; the decoder start token and padding (after a
    finished beam, pad or eos again) do not count."""
    is_eos = predictions == eos
    has_eos = is_eos.any(axis=1)
    first_eos = np.where(has_eos, is_eos.argmax(axis=1), predictions.shape[1])
    before = np.arange(predictions.shape[1])[None, :] < first_eos[:, None]
    return np.count_nonzero(before & (predictions != pad) & (predictions != start), axis=1) + has_eos


EXTRA_TOKENS = 50  # §6.1: outputs may be up to 50 tokens longer than their input


def make_compute_metrics(tokenizer) -> Callable:
    """compute_metrics for Seq2SeqTrainer with predict_with_generate: sacreBLEU and chrF (`sacrebleu.corpus_bleu`,
    `sacrebleu.corpus_chrf`), exact match (%, after stripping spaces) and the mean generated length in tokens
    (`generated_lengths`; the decoder starts from the tokenizer's bos, as `check_tokenizer_matches_config` checks)."""
    import sacrebleu

    pad, eos, start = tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id

    def compute_metrics(eval_prediction, references: Sequence[str] | None = None) -> dict[str, float]:
        # references: the target sentences as written, one per prediction (TranslationTrainer passes them); without
        # them, the labels decoded
        predictions, labels = eval_prediction.predictions, eval_prediction.label_ids
        if isinstance(predictions, tuple):
            predictions = predictions[0]
        # -100 marks padding that the Trainer added between batches; it is not a token
        predictions = np.where(predictions != -100, predictions, pad)
        hypotheses = [s.strip() for s in tokenizer.batch_decode(predictions, skip_special_tokens=True)]
        if references is None:
            labels = np.where(labels != -100, labels, pad)
            references = tokenizer.batch_decode(labels, skip_special_tokens=True)
        references = [s.strip() for s in references]
        return {
            "bleu": round(sacrebleu.corpus_bleu(hypotheses, [references]).score, 4),
            "chrf": round(sacrebleu.corpus_chrf(hypotheses, [references]).score, 4),
            "exact_match": round(100.0 * float(np.mean([h == r for h, r in zip(hypotheses, references)])), 4),
            "gen_len": round(float(np.mean(generated_lengths(predictions, pad, eos, start))), 4),
        }

    return compute_metrics


class LongestFirstSampler(Sampler[int]):
    """The rows of an evaluation split, longest source first (equal lengths in row order): generation then runs
    over batches of similar length, as translate.py batches, and a batch's beams finish together instead of waiting
    for its longest sentence. ``order`` is the sequence of rows drawn."""

    def __init__(self, source_lengths: Sequence[int]):
        self.order = sorted(range(len(source_lengths)), key=lambda i: -source_lengths[i])

    def __iter__(self) -> Iterator[int]:
        return iter(self.order)

    def __len__(self) -> int:
        return len(self.order)


def longest_first_order(dataloader) -> list[int] | None:
    """The ``order`` of the LongestFirstSampler an evaluation dataloader draws from, through the wrappers that
    accelerate adds (a BatchSampler, and a BatchSamplerShard with several processes); None when it has none."""
    nodes = [dataloader]
    for _ in range(4):
        found = [node for node in nodes if isinstance(node, LongestFirstSampler)]
        if found:
            return found[0].order
        nodes = [
            child for node in nodes for child in (getattr(node, "batch_sampler", None), getattr(node, "sampler", None))
        ]
        nodes = [node for node in nodes if node is not None]
    return None


def restore_order(rows: np.ndarray | tuple | None, order: Sequence[int]) -> np.ndarray | tuple | None:
    """Rows produced in ``order`` (an array, a tuple of arrays, or None), put back in row order. With several
    processes the Trainer's gathered rows end with repeats of the first ones (accelerate evens the last batches); only
    the first ``len(order)`` rows, one per row of the split, are kept."""
    if rows is None:
        return None
    if isinstance(rows, tuple):
        return tuple(restore_order(part, order) for part in rows)
    if len(rows) < len(order):
        raise ValueError(f"evaluation gave {len(rows)} rows for the split's {len(order)}; they cannot be put in order.")
    restored = np.empty_like(rows[: len(order)])
    restored[np.asarray(order)] = rows[: len(order)]
    return restored


def _first_rows(rows: np.ndarray | tuple | None, count: int) -> np.ndarray | tuple | None:
    if rows is None:
        return None
    if isinstance(rows, tuple):
        return tuple(_first_rows(part, count) for part in rows)
    if len(rows) < count:
        raise ValueError(f"evaluation gave {len(rows)} predictions for {count} references.")
    return rows[:count]


def _scored_against(compute_metrics: Callable, references: Sequence[str], eval_prediction: EvalPrediction) -> dict:
    """``compute_metrics(eval_prediction, references=references)``, the prediction cut to one row per reference (the
    gathered rows of several processes end with repeats)."""
    count = len(references)
    cut = EvalPrediction(
        predictions=_first_rows(eval_prediction.predictions, count),
        label_ids=_first_rows(eval_prediction.label_ids, count),
        inputs=_first_rows(eval_prediction.inputs, count),
        losses=_first_rows(eval_prediction.losses, count),
    )
    return compute_metrics(cut, references=references)


class TranslationTrainer(TrainerOverrides, TokenBatchingSeq2SeqTrainer):
    """The trainer train.py uses: token batching (TokenBatchingSeq2SeqTrainer), FSDP on CPU processes when the
    launch asked for it (`workarounds.accelerate_fsdp_on_cpu`: Accelerate alone would train them with plain data
    parallelism), and label smoothing computed by the model. The underscore methods it overrides each call a
    workaround for a limit of transformers or PyTorch; they sit in `workarounds.overrides.TrainerOverrides`.

    With ``label_smoothing_factor``, a model whose ``forward`` takes ``smoothing`` (ours) computes the smoothed
    training loss itself, with the same value as Trainer's ``LabelSmoother`` (which needs a log-softmax of the logits'
    size and its backward), and in training steps a model that takes ``skip_logits`` returns that loss without making
    the logits at all. (Evaluation keeps the logits; with generation it keeps ``LabelSmoother``: it has no backward.)

    Evaluation and prediction draw a split's rows longest source first (``LongestFirstSampler``) and return the
    predictions in row order, with one or several processes. A split with a ``reference`` column (the validation and
    test splits of ``tokenize_splits``) is scored against those sentences as written: ``compute_metrics`` gets them
    as ``references=`` when it takes that argument (``make_compute_metrics``'s does).
    """

    _references: list[str] | None = None  # the reference sentences of the split being evaluated, in row order

    @contextlib.contextmanager
    def _references_of(self, dataset) -> Iterator[None]:
        previous = self._references
        if isinstance(dataset, datasets.Dataset) and REFERENCE_COLUMN in dataset.column_names:
            self._references = list(dataset[REFERENCE_COLUMN])
        else:
            self._references = None
        try:
            yield
        finally:
            self._references = previous

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval", **gen_kwargs) -> dict:
        dataset = self.eval_dataset if eval_dataset is None else eval_dataset
        if isinstance(dataset, str):  # one of several named evaluation splits (Trainer.evaluate calls back with it)
            dataset = self.eval_dataset[dataset]
        with self._references_of(dataset):
            return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix, **gen_kwargs)

    def predict(
        self, test_dataset, ignore_keys=None, metric_key_prefix: str = "test", **gen_kwargs
    ) -> PredictionOutput:
        with self._references_of(test_dataset):
            return super().predict(test_dataset, ignore_keys, metric_key_prefix, **gen_kwargs)

    def end(self) -> None:
        """``Trainer.end()`` (destroy the process group), once every process has got here and the model wrapped for
        DDP is released (`workarounds.torch_gloo_group_teardown`: a gloo group can otherwise deadlock or abort the
        process). The trainer can neither train nor evaluate afterwards."""
        torch_gloo_group_teardown.before_leaving(self)
        super().end()

    def _remove_unused_columns(self, dataset, description: str | None = None):
        # the reference sentences are read by evaluate/predict, never by the collator (also with
        # --remove_unused_columns false)
        if isinstance(dataset, datasets.Dataset) and REFERENCE_COLUMN in dataset.column_names:
            dataset = dataset.remove_columns(REFERENCE_COLUMN)
        return super()._remove_unused_columns(dataset, description)

    def _get_eval_sampler(self, eval_dataset) -> Sampler | None:
        # longest first wherever the predictions can be put back in order: a map-style split of token ids, gathered
        # into one array (eval_do_concat_batches), none dropped (dataloader_drop_last). Also replaces
        # --train_sampling_strategy group_by_length's random length groups, whose order would not be restored.
        if (
            isinstance(eval_dataset, datasets.Dataset)
            and "input_ids" in eval_dataset.column_names
            and len(eval_dataset) > 0
            and self.args.eval_do_concat_batches
            and not self.args.dataloader_drop_last
        ):
            return LongestFirstSampler(sequence_lengths(eval_dataset)[0])
        return super()._get_eval_sampler(eval_dataset)

    def evaluation_loop(
        self, dataloader, description: str, prediction_loss_only=None, ignore_keys=None, metric_key_prefix="eval"
    ) -> EvalLoopOutput:
        order = longest_first_order(dataloader)
        compute_metrics, references = self.compute_metrics, self._references
        if (
            compute_metrics is not None
            and references is not None
            and len(references) == self.num_examples(dataloader)  # they belong to the split being evaluated
            and not self.args.batch_eval_metrics
            and "references" in inspect.signature(compute_metrics).parameters
        ):
            if order is not None:
                references = [references[i] for i in order]  # the order in which the predictions come
            self.compute_metrics = partial(_scored_against, compute_metrics, references)
        try:
            output = super().evaluation_loop(
                dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix
            )
        finally:
            self.compute_metrics = compute_metrics
        if order is None:
            return output
        return output._replace(
            predictions=restore_order(output.predictions, order), label_ids=restore_order(output.label_ids, order)
        )

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        # §6.1: "maximum output length to input length + 50", per batch, as translate.py decodes (a batch whose beams
        # never finish otherwise runs to generation_max_length); the configured length still caps it. Given as
        # max_length (the decoder start token + the new tokens): Seq2SeqTrainer drops a max_length of None, and
        # generate() then warns on every batch that max_new_tokens overrides the generation config's max_length.
        # generate() prefers a max_new_tokens to any max_length: where a loaded checkpoint's generation config has
        # one, --generation_max_length replaces it (the flag takes effect), and without the flag it stands
        gen_kwargs = gen_kwargs or dict(getattr(self, "_gen_kwargs", {}))
        decoding = self.args.predict_with_generate and not prediction_loss_only and "max_new_tokens" not in gen_kwargs
        configured_new_tokens = self.model.generation_config.max_new_tokens is not None
        if decoding and (self.args.generation_max_length is not None or not configured_new_tokens):
            limit = gen_kwargs.get("max_length") or self.model.generation_config.max_length
            if "input_ids" in inputs and limit is not None:
                gen_kwargs = {**gen_kwargs, "max_length": min(inputs["input_ids"].shape[1] + EXTRA_TOKENS + 1, limit)}
            if configured_new_tokens:
                gen_kwargs["max_new_tokens"] = None
        return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys, **gen_kwargs)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        forward = inspect.signature(self.accelerator.unwrap_model(model).forward).parameters
        smoother, extra = self.label_smoother, {}
        if smoother is not None and "smoothing" in forward:
            extra["smoothing"] = smoother.epsilon
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
        accelerate_fsdp_on_cpu.enable_in_trainer(self)


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
