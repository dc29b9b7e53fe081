#!/usr/bin/env python
"""The anchor recipe: transformers' MarianMTModel trained the way a transformers user would, on a parallel corpus.

A `run_translation.py`-style `Seq2SeqTrainer` run with OPUS-MT's architecture at d_model 256 (3+3 layers, 4 heads,
FFN 1024, swish, decoder start = pad, scaled embeddings), MarianConfig's default init (std 0.02), dropout 0.1
(OPUS-MT's; `--dropout`), a joint 8k byte-level BPE vocabulary (`--vocab_size`), AdamW (0.9, 0.98), lr 1e-3,
400 warmup steps then linear decay, label smoothing 0.1, batch 16 pairs, 4,500 steps, gradient clipping 1.0, then
beam-4 sacreBLEU on the test split:

    python benchmarks/build_mo_corpus.py --output_dir data/en-fr
    OMP_NUM_THREADS=1 python benchmarks/anchor.py --data_dir data/en-fr --output_dir outputs/anchor-marian

`--model vanilla` swaps MarianMTModel for this project's model at the same size (ReLU, as in the paper) and changes
nothing else: the drop-in comparison. Prints one result line and writes result.json and the test translations.

Tuning the anchor as a knowledgeable transformers user would, with the same effort as the project's recipe:
`--group_by_length` (Trainer's stock `train_sampling_strategy="group_by_length"`), `--batch_size`, `--learning_rate`,
`--seed`, and `--max_train_minutes`, which fits the number of steps to a CPU-time budget from a short calibration run
(`--calibration_steps` steps of the same settings, timed after the first 10; not counted in the budget), as a user
would. Choose on `validation_bleu` (beam search on the whole validation split); `test_bleu` is reported beside it, to
be read once, for the chosen settings:

    for bs in 16 32 64; do for lr in 1e-3 2e-3; do OMP_NUM_THREADS=1 python benchmarks/run.py anchor \
        --data_dir data/en-fr --output_dir outputs/anchor-g$bs-$lr --group_by_length --batch_size $bs \
        --learning_rate $lr --max_train_minutes 22; done; done
    python benchmarks/run.py summarize outputs/anchor-*   # mean ± sd over seeds per recipe, by validation BLEU
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from common import corpus_files, report, test_bleu  # noqa: E402
from datasets import load_dataset  # noqa: E402
from huggingface_hub.errors import StrictDataclassError  # noqa: E402
from transformers import (  # noqa: E402
    DataCollatorForSeq2Seq,
    MarianConfig,
    MarianMTModel,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    TrainerCallback,
)

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration  # noqa: E402
from vanilla_transformer.training.presets import PRESETS, apply_config_overrides  # noqa: E402
from vanilla_transformer.training.tokenizer import train_tokenizer  # noqa: E402

# the size of train.py's `compact` preset (the same field names in MarianConfig and VanillaTransformerConfig); dropout
# is the recipe's (--dropout: OPUS-MT's 0.1 unless given), not the preset's
SIZE = {key: value for key, value in PRESETS["compact"]["config"].items() if key != "dropout"}
SIZE["max_position_embeddings"] = 512


def marian_config(
    vocab_size: int, size: dict, pad: int = 0, eos: int = 2, decoder_start: int = 0, **extra
) -> MarianConfig:
    """OPUS-MT's architecture (swish, scaled embeddings, sinusoidal positions, init std 0.02) at ``size``; OPUS-MT
    starts the decoder from pad (``decoder_start`` = ``pad``)."""
    return MarianConfig(
        vocab_size=vocab_size,
        decoder_vocab_size=vocab_size,
        **size,
        activation_function="swish",
        scale_embedding=True,
        pad_token_id=pad,
        eos_token_id=eos,
        decoder_start_token_id=decoder_start,
        forced_eos_token_id=eos,
        **extra,
    )


def build_model(
    kind: str,
    vocab_size: int,
    overrides: str | None = None,
    dropout: float = 0.1,
    attn_implementation: str | None = None,
) -> torch.nn.Module:
    """MarianMTModel (OPUS-MT's architecture) or this project's model, at the anchor's size with `dropout`, with fresh
    weights, and `attn_implementation` (None: transformers' default)."""
    if kind == "marian":
        config = marian_config(vocab_size, SIZE, dropout=dropout)
        config._attn_implementation = attn_implementation
        return MarianMTModel(config)
    # ReLU, scaled embeddings and the bos start token are our defaults (the paper's)
    config = VanillaTransformerConfig(vocab_size=vocab_size, **SIZE, dropout=dropout)
    config = apply_config_overrides(config, overrides)
    config._attn_implementation = attn_implementation
    return VanillaTransformerForConditionalGeneration(config)


class StepClock(TrainerCallback):
    """Times the training steps of the calibration run (the first 10 steps, warming up, are left out)."""

    def __init__(self):
        self.times: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter())

    def seconds_per_step(self) -> float:
        timed = self.times[10:]
        return (timed[-1] - timed[0]) / (len(timed) - 1)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", required=True, help="train/validation/test.jsonl from build_mo_corpus.py")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--model", choices=("marian", "vanilla"), default="marian")
    parser.add_argument(
        "--config_overrides", default=None, help="Our model's config fields (--model vanilla), e.g. init_scheme=xavier."
    )
    parser.add_argument("--source_lang", default="en")
    parser.add_argument("--target_lang", default="fr")
    parser.add_argument("--max_steps", type=int, default=4500)
    parser.add_argument(
        "--max_train_minutes",
        type=float,
        default=None,
        help="Fit the number of steps to this many minutes of training, from a timed calibration run (replaces "
        "--max_steps).",
    )
    parser.add_argument("--calibration_steps", type=int, default=60, help="Steps of the calibration run.")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--group_by_length", action="store_true", help="train_sampling_strategy=group_by_length")
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--warmup_steps", type=int, default=400)
    parser.add_argument("--dropout", type=float, default=0.1, help="P_drop of both models (OPUS-MT's: 0.1)")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast on the CPU (Trainer's --bf16)")
    parser.add_argument(
        "--attn_implementation", default=None, help="eager, sdpa, ... (default: transformers' own, sdpa)"
    )
    parser.add_argument("--vocab_size", type=int, default=8000, help="Entries of the joint byte-level BPE.")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--num_beams", type=int, default=4)
    args = parser.parse_args(argv)
    if args.config_overrides and args.model != "vanilla":
        parser.error("--config_overrides changes our model's config: use it with --model vanilla")
    if args.max_train_minutes is not None and args.max_train_minutes <= 0:
        parser.error("--max_train_minutes must be positive")
    if not 0 <= args.dropout < 1:
        parser.error("--dropout must be in [0, 1)")
    if args.calibration_steps < 12:
        parser.error("--calibration_steps must be at least 12 (the first 10 steps are not timed)")
    try:  # before the tokenizer is trained: a bad override stops the run at once
        apply_config_overrides(VanillaTransformerConfig(vocab_size=8000, **SIZE), args.config_overrides)
    except (ValueError, StrictDataclassError) as error:
        parser.error(" ".join(str(error).split()))

    files = corpus_files(args.data_dir)
    raw = load_dataset("json", data_files=files)
    src, tgt = args.source_lang, args.target_lang
    texts = (t for ex in raw["train"]["translation"] for t in (ex[src], ex[tgt]))
    tokenizer = train_tokenizer(texts, vocab_size=args.vocab_size)
    os.makedirs(args.output_dir, exist_ok=True)
    tokenizer.save_pretrained(args.output_dir)

    def tokenize(batch):
        pairs = batch["translation"]
        return tokenizer([p[src] for p in pairs], text_target=[p[tgt] for p in pairs], max_length=256, truncation=True)

    data = raw.map(tokenize, batched=True, remove_columns=["translation"])

    def make_trainer(max_steps: int, output_dir: str, callbacks: list | None = None) -> Seq2SeqTrainer:
        torch.manual_seed(args.seed)  # the same initial weights for the calibration and the run
        model = build_model(args.model, len(tokenizer), args.config_overrides, args.dropout, args.attn_implementation)
        training_args = Seq2SeqTrainingArguments(
            output_dir=output_dir,
            max_steps=max_steps,
            per_device_train_batch_size=args.batch_size,
            per_device_eval_batch_size=64,
            train_sampling_strategy="group_by_length" if args.group_by_length else "random",
            learning_rate=args.learning_rate,
            lr_scheduler_type="linear",
            warmup_steps=min(args.warmup_steps, max_steps // 2),
            adam_beta1=0.9,
            adam_beta2=0.98,
            weight_decay=0.0,
            max_grad_norm=1.0,
            label_smoothing_factor=0.1,
            logging_steps=100,
            eval_strategy="no",
            save_strategy="no",
            predict_with_generate=False,
            report_to=[],
            seed=args.seed,
            use_cpu=True,
            bf16=args.bf16,
            disable_tqdm=True,
        )
        return Seq2SeqTrainer(
            model=model,
            args=training_args,
            train_dataset=data["train"],
            eval_dataset=data["validation"],
            data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
            processing_class=tokenizer,
            callbacks=callbacks,
        )

    max_steps, seconds_per_step = args.max_steps, None
    if args.max_train_minutes is not None:
        clock = StepClock()
        make_trainer(args.calibration_steps, os.path.join(args.output_dir, "calibration"), [clock]).train()
        seconds_per_step = clock.seconds_per_step()
        max_steps = max(1, round(args.max_train_minutes * 60 / seconds_per_step))
        print(f"calibration: {seconds_per_step:.3f} s per step -> {max_steps} steps in {args.max_train_minutes} min")
    trainer = make_trainer(max_steps, args.output_dir)
    model = trainer.model
    start = time.perf_counter()
    train_metrics = trainer.train().metrics
    train_minutes = (time.perf_counter() - start) / 60
    eval_loss = trainer.evaluate()["eval_loss"]
    validation_bleu, validation_chrf, _ = test_bleu(model, tokenizer, raw["validation"], src, tgt, args.num_beams)
    bleu, chrf, hypotheses = test_bleu(model, tokenizer, raw["test"], src, tgt, num_beams=args.num_beams)
    with open(os.path.join(args.output_dir, "test_predictions.txt"), "w") as f:
        f.write("\n".join(hypotheses) + "\n")
    grouping = "-grouped" if args.group_by_length else ""
    dropout = "" if args.dropout == 0.1 else f"-dropout{args.dropout:g}"
    precision = "-bf16" if args.bf16 else ""
    vocabulary = "" if args.vocab_size == 8000 else f"-vocab{args.vocab_size}"
    suffix = dropout + precision + (f"-{args.attn_implementation}" if args.attn_implementation else "") + vocabulary
    result = {
        "recipe": f"anchor-{args.model}{grouping}-bs{args.batch_size}-lr{args.learning_rate:g}{suffix}",
        "bf16": trainer.args.bf16,
        "attn_implementation": model.config._attn_implementation,
        "seed": args.seed,
        "dropout": args.dropout,
        "vocab_size": len(tokenizer),
        "steps": trainer.state.global_step,
        "train_sampling_strategy": trainer.args.train_sampling_strategy,
        "seconds_per_step_calibrated": seconds_per_step,  # unrounded: the steps were computed from it
        "train_minutes": round(train_minutes, 2),
        "train_samples_per_second": train_metrics.get("train_samples_per_second"),
        "eval_loss": round(eval_loss, 4),
        "validation_bleu": round(validation_bleu, 2),
        "validation_chrf": round(validation_chrf, 2),
        "test_bleu": round(bleu, 2),
        "test_chrf": round(chrf, 2),
        "log_history": trainer.state.log_history,
    }
    return report(result, args.output_dir)


if __name__ == "__main__":
    main()
