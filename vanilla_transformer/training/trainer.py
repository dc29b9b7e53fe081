"""The trainer train.py uses, and the one place it is built. It evaluates through `inference/`: the translations of a
split are decoded and scored as translate.py decodes and scores them."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial

import datasets
from accelerate.utils import gather_object
from transformers import (
    DataCollatorForSeq2Seq,
    PreTrainedModel,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    TrainerCallback,
)
from transformers.trainer_utils import EvalLoopOutput, PredictionOutput, unwrap_peft_model

from ..inference.score import make_compute_metrics, score  # noqa: F401  (make_compute_metrics: imported from here too)
from ..inference.translate import generate_in_batches
from .batching import TokenBatchingSeq2SeqTrainer
from .cpu import CpuThreadsCallback
from .data import sentence_pairs
from .device import pad_to_multiple_of
from .sharding import ParallelismReportCallback, check_parallelism_can_run
from .time_budget import BudgetSchedule, add_time_budget
from .workarounds import torch_gloo_group_teardown
from .workarounds.overrides import TrainerOverrides

TOKEN_COLUMNS = ("input_ids", "attention_mask", "labels")


@dataclass
class TranslationCollator(DataCollatorForSeq2Seq):
    """`DataCollatorForSeq2Seq` on the token columns alone: an evaluation split's sentences, which evaluation reads
    from the split, stay out of the batches also with ``--remove_unused_columns false``."""

    def __call__(self, features, return_tensors=None):
        features = [{key: value for key, value in row.items() if key in TOKEN_COLUMNS} for row in features]
        return super().__call__(features, return_tensors)


class TranslationTrainer(TrainerOverrides, BudgetSchedule, TokenBatchingSeq2SeqTrainer):
    """The trainer train.py uses: token batching (TokenBatchingSeq2SeqTrainer), a time budget
    (time_budget.BudgetSchedule), sharding that cannot run where it was asked for refused in one line, and the loss,
    label smoothing included, computed inside the model's forward. It overrides public hooks only; the private methods
    that workarounds of transformers' and PyTorch's limits override sit in `workarounds.overrides.TrainerOverrides`.

    A model with a ``loss_path`` (ours) takes the loss's documented keyword arguments: ``compute_loss`` passes
    ``label_smoothing=args.label_smoothing_factor`` (so Trainer's ``LabelSmoother``, which would smooth the logits
    outside the forward, is off) and, in training steps, ``skip_logits=True``: only the loss is used, and on a CPU the
    model then computes it without making the logits. The loss stays in the forward that DDP and FSDP wrap, and the
    model decides its path itself, on the module, also under ``torch_compile``. Any other model (MarianMTModel), or
    ours with a ``compute_loss_func``, trains as under Seq2SeqTrainer. ``describe_loss`` says which loss the training
    steps compute and why; it is printed when training starts.

    Evaluation and prediction of a split that holds its sentences (the validation and test splits of
    ``data.tokenize_splits``; ``languages`` names the source and target) go the way translate.py goes: the Trainer's
    loop computes the loss, then the split's source ids are translated in length-sorted batches
    (``inference.translate.generate_in_batches``, within the paper's output limit) and the translations are scored
    against the target sentences as written (``inference.score.score``: ``bleu``, ``chrf``, ``exact_match``), beside
    ``gen_len``, their mean length in generated tokens.
    ``predict`` returns the translations, in row order, as its predictions. With several processes each translates
    its share of the sentences and the translations are gathered (under FSDP, whose every forward pass needs all
    processes, each translates them all). A split without its sentences is evaluated as by ``Seq2SeqTrainer``.
    """

    def __init__(self, *args, languages: tuple[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.languages = languages
        self._translating: tuple[datasets.Dataset, dict] | None = None  # the split evaluated now, generate() options
        model = None if self.model is None else unwrap_peft_model(self.model)
        # whether the model computes the loss, label smoothing included, from the keyword arguments compute_loss adds;
        # decided once, on the model itself (not on a DDP, FSDP or torch.compile wrapper)
        self.model_computes_loss = hasattr(model, "loss_path") and self.compute_loss_func is None
        if self.model_computes_loss:
            self.label_smoother = None  # the model smooths, inside its forward
        self.add_callback(LossReportCallback(self.describe_loss))

    def describe_loss(self) -> str:
        """One line: the loss the training steps compute, and why (for a model with a ``loss_path``, its decision
        for the model as prepared when training starts: FSDP, an adapter, the device)."""
        epsilon = self.args.label_smoothing_factor
        if self.compute_loss_func is not None:
            return "loss: compute_loss_func on the model's outputs"
        if not self.model_computes_loss:
            if self.label_smoother is not None:
                return f"loss: Trainer's LabelSmoother (label smoothing {epsilon:g}) on the model's logits"
            return "loss: the model's own"
        smoothing = f"label smoothing {epsilon:g}, " if epsilon else ""
        return f"loss: {smoothing}{unwrap_peft_model(self.model).loss_path(skip_logits=True)}, in the model's forward"

    @contextlib.contextmanager
    def _translation_of(self, dataset, gen_kwargs: dict) -> Iterator[None]:
        previous = self._translating
        columns = set(dataset.column_names) if isinstance(dataset, datasets.Dataset) else set()
        has_sentences = (
            self.languages is not None
            and "input_ids" in columns
            and ("translation" in columns or set(self.languages) <= columns)  # data.sentence_pairs' two layouts
        )
        self._translating = (dataset, gen_kwargs) if has_sentences else None
        try:
            yield
        finally:
            self._translating = previous

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval", **gen_kwargs) -> dict:
        dataset = self.eval_dataset if eval_dataset is None else eval_dataset
        if isinstance(dataset, str):  # one of several named evaluation splits (Trainer.evaluate calls back with it)
            dataset = self.eval_dataset[dataset]
        with self._translation_of(dataset, gen_kwargs):
            return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix, **gen_kwargs)

    def predict(
        self, test_dataset, ignore_keys=None, metric_key_prefix: str = "test", **gen_kwargs
    ) -> PredictionOutput:
        with self._translation_of(test_dataset, gen_kwargs):
            return super().predict(test_dataset, ignore_keys, metric_key_prefix, **gen_kwargs)

    def evaluation_loop(
        self, dataloader, description: str, prediction_loss_only=None, ignore_keys=None, metric_key_prefix="eval"
    ) -> EvalLoopOutput:
        # Trainer.evaluate asks for the loss alone when there is no compute_metrics; the translations are the
        # metrics here, so only the arguments' prediction_loss_only turns them off
        if self._translating is None or self.args.prediction_loss_only or not self.args.predict_with_generate:
            return super().evaluation_loop(
                dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix
            )
        output = super().evaluation_loop(dataloader, description, True, ignore_keys, metric_key_prefix)  # the loss
        dataset, gen_kwargs = self._translating
        sentences = dataset.select_columns([c for c in dataset.column_names if c not in TOKEN_COLUMNS])[:]
        sources, references = sentence_pairs(sentences, *self.languages)
        translations, gen_len = self.translate_sources(dataset["input_ids"], sources, **gen_kwargs)
        scores = {**score(translations, references), "gen_len": gen_len}
        scores = {f"{metric_key_prefix}_{name}": value for name, value in scores.items()}
        return output._replace(predictions=translations, metrics={**output.metrics, **scores})

    def translate_sources(
        self, input_ids: Sequence[Sequence[int]], sources: Sequence[str], **gen_kwargs
    ) -> tuple[list[str], float]:
        """The translations of a split's source ids (`sources`: the sentences, whose empty ones translate to empty
        lines, as in translate.py), in row order, on every process, and their mean length in generated tokens up to
        and including the eos (``gen_len``, as Seq2SeqTrainer reports it; an empty line counts 0), rounded to 4
        decimals. Beam size and length limit: the arguments' ``generation_num_beams`` and ``generation_max_length``
        unless `gen_kwargs` (evaluate's, predict's) say otherwise."""
        encoded = [ids if source.strip() else None for ids, source in zip(input_ids, sources)]
        processes, sharded = self.args.world_size, self.is_fsdp_enabled
        shared = processes > 1 and not sharded
        options = {"num_beams": self.args.generation_num_beams, "max_length": self.args.generation_max_length}
        options.update(gen_kwargs, synced_gpus=sharded)
        self.model.eval()
        mine = encoded[self.args.process_index :: processes] if shared else encoded
        counts = []
        translations = generate_in_batches(
            self.model,
            self.processing_class,
            mine,
            batch_size=self.args.per_device_eval_batch_size,
            progress=False if self.args.disable_tqdm or not self.is_world_process_zero() else None,
            token_counts=counts,
            **options,
        )
        tokens = sum(counts)
        if shared:
            shares = gather_object([(translations, tokens)])  # one per process, in process order
            translations = [""] * len(encoded)
            for index, (share, _) in enumerate(shares):
                translations[index::processes] = share
            tokens = sum(share_tokens for _, share_tokens in shares)
        return translations, round(tokens / max(len(encoded), 1), 4)

    def end(self) -> None:
        """``Trainer.end()`` (destroy the process group), once every process has got here and the model wrapped for
        DDP is released (`workarounds.torch_gloo_group_teardown`: a gloo group can otherwise deadlock or abort the
        process). The trainer can neither train nor evaluate afterwards."""
        torch_gloo_group_teardown.before_leaving(self)
        super().end()

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.model_computes_loss and "labels" in inputs:
            epsilon = self.args.label_smoothing_factor
            inputs = {**inputs, **({"label_smoothing": epsilon} if epsilon else {})}
            if not return_outputs:  # a training step: only the loss is used
                inputs["skip_logits"] = True
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        generates = self.args.predict_with_generate and not prediction_loss_only
        if generates and self.model_computes_loss and self.args.label_smoothing_factor:
            # Seq2SeqTrainer takes the loss of `model(**inputs)` beside generate(): the same smoothed loss as training
            model = partial(model, label_smoothing=self.args.label_smoothing_factor)
        return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys, **gen_kwargs)

    def create_accelerator_and_postprocess(self) -> None:
        check_parallelism_can_run(self.args)  # FSDP and DeepSpeed on CPU processes: one line, before any set-up
        super().create_accelerator_and_postprocess()


class LossReportCallback(TrainerCallback):
    """Prints, on the main process when training starts (the model wrapped by then), the trainer's ``describe_loss``."""

    def __init__(self, describe: Callable[[], str], print_fn: Callable[[str], None] = print):
        self.describe, self.print_fn = describe, print_fn

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.print_fn(self.describe())


def build_trainer(
    model: PreTrainedModel,
    args: Seq2SeqTrainingArguments,
    tokenizer,
    train_dataset=None,
    eval_dataset=None,
    compute_metrics: Callable | None = None,
    callbacks: Sequence[TrainerCallback] | None = None,
    languages: tuple[str, str] | None = None,
) -> Seq2SeqTrainer:
    """The one place the trainer is built. The collator pads each batch to its longest pair and builds
    decoder_input_ids from the labels (the model's shift right), which label smoothing needs. `languages` (source,
    target) lets evaluation translate and score the splits that hold their sentences (see TranslationTrainer);
    `compute_metrics` serves splits without them. With
    `args.max_train_minutes`, a TimeBudgetCallback stops training and drives the learning-rate schedule; a
    CpuThreadsCallback saves the CPU thread count with each checkpoint, for a resumed run to reuse."""
    collator = TranslationCollator(
        tokenizer,
        model=model,
        label_pad_token_id=-100,  # padded label positions are left out of the loss
        pad_to_multiple_of=pad_to_multiple_of(args),  # 8 under bf16/fp16, also from `accelerate launch`
    )
    trainer = TranslationTrainer(
        model=model,
        args=args,
        data_collator=collator,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        compute_metrics=compute_metrics if args.predict_with_generate else None,
        callbacks=[ParallelismReportCallback(), CpuThreadsCallback(), *(callbacks or [])],
        max_tokens_per_batch=getattr(args, "max_tokens_per_batch", None),
        languages=languages,
    )
    add_time_budget(trainer)  # --max_train_minutes: its clock, and a progress bar in minutes
    return trainer
