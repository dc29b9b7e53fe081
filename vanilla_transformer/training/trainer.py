"""The trainer train.py uses, the one place it is built, and its metrics."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import numpy as np
from transformers import (
    DataCollatorForSeq2Seq,
    PreTrainedModel,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    TrainerCallback,
)
from transformers.trainer_callback import ProgressCallback

from .batching import TokenBatchingSeq2SeqTrainer
from .cpu import CpuThreadsCallback
from .sharding import ParallelismReportCallback, check_parallelism_can_run
from .time_budget import BudgetProgressCallback, TimeBudgetCallback, find_time_budget
from .workarounds import (
    accelerate_fsdp_on_cpu,
    torch_fsdp_aliased_module_load,
    torch_fsdp_class_swap,
    torch_fsdp_gathered_ties,
    transformers_resume_past_the_end,
    transformers_tied_names_missing_on_resume,
)


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
    launch asked for it (`workarounds.accelerate_fsdp_on_cpu`: Accelerate alone would train them with plain data
    parallelism), and label smoothing computed by the model. The underscore methods it overrides each call a
    workaround for a limit of transformers or PyTorch (`workarounds`).

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
        accelerate_fsdp_on_cpu.enable_in_trainer(self)

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        # under FSDP, `state_dict` is the gathered full one
        if state_dict is not None:
            state_dict = torch_fsdp_gathered_ties.share_tied_tensors(state_dict, self.model)
        with torch_fsdp_class_swap.model_class_unwrapped(self.model):
            super()._save(output_dir, state_dict=state_dict)

    def _run_epoch(self, *args, **kwargs):
        if transformers_resume_past_the_end.stop_if_finished(self):
            return
        return super()._run_epoch(*args, **kwargs)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        if not torch_fsdp_aliased_module_load.load_in_trainer(self, resume_from_checkpoint, model):
            super()._load_from_checkpoint(resume_from_checkpoint, model)

    def _issue_warnings_after_load(self, load_result) -> None:
        load_result = transformers_tied_names_missing_on_resume.drop_loaded_tied_names(load_result, self.model)
        super()._issue_warnings_after_load(load_result)


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
