#!/usr/bin/env python
"""Training steps under `torch_compile=True`, ours against MarianMTModel at the same tiny size: the wall time of
`trainer.train()` (compilation included) over steps whose target lengths all differ, the graphs torch.compile made,
and whether it reached its recompile limit (after which it runs the rest eagerly, silently).

    python benchmarks/run.py compile_steps                      # Seq2SeqTrainer, then the project's trainer
    python benchmarks/run.py compile_steps --label_smoothing 0.1  # train.py's recipe
    python benchmarks/run.py compile_steps --trainers seq2seq --backend eager --rounds 3

Each side runs in a fresh subprocess with its own inductor cache folder, so that neither finds the other's (or an
earlier run's) compiled code. `seq2seq` is a stock `Seq2SeqTrainer`, as a transformers user runs it: the model
computes the loss, or with label smoothing Trainer's `LabelSmoother` smooths the logits outside it, for both
models. `project` is `train.py`'s trainer (`TranslationTrainer`): our model computes the loss, smoothed, without
logits on a CPU; Marian as under `Seq2SeqTrainer`. Prints a Markdown table and writes the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time

SIZE = dict(
    vocab_size=64,
    d_model=32,
    encoder_layers=1,
    decoder_layers=1,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
)


def build_model(name: str):
    if name == "marian":
        from transformers import MarianConfig, MarianMTModel

        return MarianMTModel(MarianConfig(**SIZE, max_position_embeddings=64, pad_token_id=0, decoder_start_token_id=1))
    from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

    return VanillaTransformerForConditionalGeneration(VanillaTransformerConfig(**SIZE))


def rows(steps: int, batch_size: int) -> list[dict]:
    """Batch i (in order) holds sources of 5-9 tokens and targets of at most 2 + i tokens, one of them that long."""
    import torch

    generator = torch.Generator().manual_seed(0)
    examples = []
    for step in range(steps):
        longest = 2 + step
        for row in range(batch_size):
            source = int(torch.randint(5, 10, (), generator=generator))
            target = longest if row == 0 else int(torch.randint(1, longest + 1, (), generator=generator))
            examples.append(
                {
                    "input_ids": torch.randint(4, 64, (source,), generator=generator).tolist() + [2],
                    "labels": torch.randint(4, 64, (target - 1,), generator=generator).tolist() + [2],
                }
            )
    return examples


def collate(model, examples: list[dict]) -> dict:
    """Pads sources with 0 (and an attention mask) and labels with -100, and shifts the labels into the decoder's
    input, as `DataCollatorForSeq2Seq` does with a tokenizer."""
    import torch

    def pad(key: str, value: int) -> torch.Tensor:
        longest = max(len(example[key]) for example in examples)
        return torch.tensor([example[key] + [value] * (longest - len(example[key])) for example in examples])

    input_ids, labels = pad("input_ids", 0), pad("labels", -100)
    return {
        "input_ids": input_ids,
        "attention_mask": (input_ids != 0).long(),
        "labels": labels,
        "decoder_input_ids": model.prepare_decoder_input_ids_from_labels(labels),
    }


class _RecompileLimit(logging.Handler):
    """Counts dynamo's "hit config.recompile_limit" warnings."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.hits = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.hits += "hit config." in record.getMessage()


def run_side(
    model_name: str, trainer_name: str, steps: int, batch_size: int, backend: str, label_smoothing: float
) -> dict:
    """One `trainer.train()` under torch_compile=True, in this process."""
    import torch
    import torch._dynamo
    from datasets import Dataset
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    from vanilla_transformer.training.trainer import TranslationTrainer

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = build_model(model_name)
    limit = _RecompileLimit()
    logging.getLogger("torch._dynamo").addHandler(limit)
    with tempfile.TemporaryDirectory() as output_dir:
        args = Seq2SeqTrainingArguments(
            output_dir=output_dir,
            max_steps=steps,
            per_device_train_batch_size=batch_size,
            train_sampling_strategy="sequential",
            label_smoothing_factor=label_smoothing,
            torch_compile=True,
            torch_compile_backend=backend,
            use_cpu=True,
            report_to=[],
            save_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
        )
        trainer_class = TranslationTrainer if trainer_name == "project" else Seq2SeqTrainer
        trainer = trainer_class(
            model=model,
            args=args,
            train_dataset=Dataset.from_list(rows(steps, batch_size)),
            data_collator=lambda examples: collate(model, examples),
        )
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
        loss = trainer.describe_loss() if trainer_name == "project" else "Seq2SeqTrainer's"
    return {
        "model": model_name,
        "trainer": trainer_name,
        "backend": backend,
        "label_smoothing": label_smoothing,
        "steps": steps,
        "batch_size": batch_size,
        "train_seconds": round(seconds, 2),
        "graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"],
        "recompile_limit_hits": limit.hits,
        "loss": loss,
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trainers", nargs="+", default=["seq2seq", "project"], choices=["seq2seq", "project"])
    parser.add_argument("--models", nargs="+", default=["vanilla", "marian"], choices=["vanilla", "marian"])
    parser.add_argument(
        "--steps", type=int, default=12, help="training steps; step i's longest target has 2 + i tokens"
    )
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--backend", default="inductor", help="torch_compile_backend (inductor, aot_eager, eager)")
    parser.add_argument(
        "--label_smoothing",
        type=float,
        default=0.0,
        help="label_smoothing_factor; with it a stock Seq2SeqTrainer smooths the logits outside the model",
    )
    parser.add_argument("--rounds", type=int, default=1, help="runs of each side, interleaved")
    parser.add_argument("--output_file", default="outputs/compile_steps.json")
    parser.add_argument("--side", nargs=2, metavar=("MODEL", "TRAINER"), help=argparse.SUPPRESS)  # a child's run
    args = parser.parse_args(argv)
    if args.side:
        print(json.dumps(run_side(*args.side, args.steps, args.batch_size, args.backend, args.label_smoothing)))
        return []

    results = []
    for _ in range(args.rounds):
        for trainer in args.trainers:
            for model in args.models:
                with tempfile.TemporaryDirectory() as cache:
                    command = [sys.executable, os.path.abspath(__file__), "--side", model, trainer]
                    command += ["--steps", str(args.steps), "--batch_size", str(args.batch_size)]
                    command += ["--backend", args.backend, "--label_smoothing", str(args.label_smoothing)]
                    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, OMP_NUM_THREADS="1")
                    done = subprocess.run(command, capture_output=True, text=True, env=env)
                if done.returncode != 0:
                    raise SystemExit(f"{model} / {trainer} failed:\n{done.stderr[-3000:]}")
                results.append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(f"{model} / {trainer}: {results[-1]}", file=sys.stderr, flush=True)
    os.makedirs(os.path.dirname(args.output_file) or ".", exist_ok=True)
    with open(args.output_file, "w") as file:
        json.dump(results, file, indent=2)
    print("| trainer | model | backend | label smoothing | train() s | graphs | recompile limit hit | loss |")
    print("|---|---|---|---:|---:|---:|---|---|")
    for row in results:
        hit = "yes" if row["recompile_limit_hits"] else "no"
        print(
            f"| {row['trainer']} | {row['model']} | {row['backend']} | {row['label_smoothing']:g} "
            f"| {row['train_seconds']:.1f} | {row['graphs']} | {hit} | {row['loss']} |"
        )
    return results


if __name__ == "__main__":
    main()
