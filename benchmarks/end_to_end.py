#!/usr/bin/env python
"""End-to-end training speed: `scripts/train.py` training our model against a `run_translation.py`-style
Seq2SeqTrainer run of transformers' MarianMTModel, the two processes taking turns (M P M P ...).

Both train on the same corpus, with the same joint tokenizer (trained once here), at the same size, batch, steps,
learning rate and label smoothing 0.1, with ReLU, one thread, no evaluation and no checkpoints. Our side is the
command a user runs; the Marian side is what `run_translation.py` does in training (AutoModelForSeq2SeqLM built from a
config, `DataCollatorForSeq2Seq`, `Seq2SeqTrainer` with `label_smoothing_factor`, so Trainer's `LabelSmoother`), run
in this file's own child process. With `--run_translation PATH` (transformers' own
examples/pytorch/translation/run_translation.py, in the version of the installed transformers) the Marian side is that
script, unmodified: it fine-tunes a randomly initialised MarianMTModel saved here with the tokenizer, from a working
directory that holds the `evaluate` metric module `benchmarks/metrics/sacrebleu.py` as `sacrebleu/sacrebleu.py` (the
script calls `evaluate.load("sacrebleu")`, which then needs no Hub; `evaluate` is a benchmark-only need). Reported:
`train_samples_per_second` as Trainer computes it, non-padding target tokens per second (samples/s times the corpus's
mean target length in tokens, eos included: both sides draw their batches from the whole corpus), the median of the
per-round ratios against each Marian side, and each process's peak resident memory (from `wait4`).

Five sides by default (`--sides`), run in turn in each round: `marian` (run_translation.py's defaults: random batches),
`marian-grouped` (the same with transformers' stock `--train_sampling_strategy group_by_length`, what a knowledgeable
user turns on), `vanilla` (train.py, batches of `--batch_size` pairs), `vanilla-token-batches` (train.py's own
batching, as its `compact` default trains: length-grouped batches of at most `--max_tokens_per_batch` padded tokens
per side), and `vanilla-grouped` (train.py on marian-grouped's batching: the training step against Marian's, on the
same batches); on request, the last two with the other attention implementation: `marian-grouped-eager` (Marian with
`attn_implementation="eager"`, what train.py picks for bf16 on a CPU) and `vanilla-grouped-sdpa` (train.py with
`--attn_implementation sdpa`), and `marian-token-batches` (MarianMTModel under the project's trainer: train.py with
vanilla-token-batches' arguments and the Marian side's model in place of ours, as `benchmarks/marian_train.py` trains
it: against vanilla-token-batches, the model against the model; against marian-grouped, what the trainer and its
batching give). `--bf16` puts every side in bf16 autocast (Trainer's
`--bf16` on the CPU). A token batch holds a varying number of pairs, so Trainer's samples/s (steps times the batch size)
does not describe it: every side also counts the non-padding source tokens it trained on (Trainer's stock
`include_num_input_tokens_seen="non_padding"`), and source tokens per second over Trainer's train_runtime is the figure
that compares them all. (With `--run_translation`, whose command line cannot ask for that count, the Marian sides'
figure is samples/s times the corpus's mean source length, as for target tokens.)

    python benchmarks/build_mo_corpus.py --output_dir data/en-fr
    python benchmarks/end_to_end.py --data_dir data/en-fr --size small --max_steps 100 --pairs 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import provenance  # noqa: E402
from speed import SIZES  # noqa: E402  (d_model, layers, heads, FFN of each size)

MAX_LENGTH = 256  # source and target truncation on both sides (train.py's presets)
DEFAULT_SIDES = ("marian", "marian-grouped", "vanilla", "vanilla-token-batches", "vanilla-grouped")
# on request: the same batches as marian-grouped / vanilla-grouped with the other attention implementation (Marian with
# the eager attention train.py picks for bf16 on a CPU, ours with transformers' default SDPA), and Marian trained by
# train.py on vanilla-token-batches' batches (the same trainer and batches: the model against the model)
SIDES = (*DEFAULT_SIDES, "marian-grouped-eager", "vanilla-grouped-sdpa", "marian-token-batches")
# the `evaluate` metric module run_translation.py loads by name (evaluate.load("sacrebleu")), offline: the only use of
# `evaluate` in the project (the test extra installs it)
SACREBLEU_METRIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "metrics", "sacrebleu.py")


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", required=True, help="train.jsonl (run_translation.py's format), e.g. from "
                        "build_mo_corpus.py")  # fmt: skip
    parser.add_argument("--output_dir", default="outputs/end-to-end")
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--source_lang", default="en")
    parser.add_argument("--target_lang", default="fr")
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--max_steps", type=int, default=100)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--max_tokens_per_batch", type=int, default=512, help="vanilla-token-batches' batches "
                        "(train.py's compact default: 512, or 1,024 where the CPU multiplies bf16 in "
                        "hardware)")  # fmt: skip
    parser.add_argument("--learning_rate", type=float, default=5e-4)
    parser.add_argument("--dropout", type=float, default=0.1, help="every side's P_drop: 0.1 is Marian's stock "
                        "value; 0 is train.py's compact default and the strongest anchor's tuned value")  # fmt: skip
    parser.add_argument("--pairs", type=int, default=2, help="Marian/ours runs, interleaved")
    parser.add_argument("--run_translation", help="transformers' run_translation.py: run it for the Marian side")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--bf16", action="store_true", help="every side in bf16 autocast (Trainer's --bf16 on the CPU)")
    parser.add_argument("--sides", default=",".join(DEFAULT_SIDES), help=f"Comma-separated, of: {', '.join(SIDES)}")
    children = ("marian", "marian-grouped", "marian-grouped-eager", "marian-token-batches")
    parser.add_argument("--child", choices=children, help=argparse.SUPPRESS)
    parser.add_argument("--run_dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_translation and not os.path.isfile(args.run_translation):
        parser.error(f"--run_translation {args.run_translation!r} is not a file")
    for name in ("max_steps", "batch_size", "max_tokens_per_batch", "pairs", "vocab_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be a positive integer")
    if not 0.0 <= args.dropout < 1.0:
        parser.error(f"--dropout {args.dropout} must be in [0, 1)")
    args.sides = [side.strip() for side in args.sides.split(",") if side.strip()]
    unknown = [side for side in args.sides if side not in SIDES]
    if unknown or not args.sides:
        parser.error(f"--sides {unknown or args.sides}: choose among {', '.join(SIDES)}")
    if args.run_translation and "marian-grouped-eager" in args.sides:
        parser.error("--sides marian-grouped-eager: run_translation.py cannot be given an attention implementation")
    return args


def marian_config(args: argparse.Namespace, tokenizer):
    """The Marian side's model: the size asked for, ReLU, --dropout, the tokenizer's vocabulary and special ids."""
    from transformers import MarianConfig

    vocab = len(tokenizer)
    return MarianConfig(
        vocab_size=vocab,
        decoder_vocab_size=vocab,
        **SIZES[args.size].layout(),
        activation_function="relu",
        dropout=args.dropout,
        max_position_embeddings=MAX_LENGTH + 2,
        scale_embedding=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )


def train_marian(
    args: argparse.Namespace, group_by_length: bool = False, attn_implementation: str | None = None
) -> None:
    """The child process: MarianMTModel trained as run_translation.py trains it (with `group_by_length`, Trainer's
    stock length-grouped sampler; `attn_implementation`, else transformers' default); writes all_results.json."""
    import torch
    from datasets import load_dataset
    from transformers import (
        AutoModelForSeq2SeqLM,
        AutoTokenizer,
        DataCollatorForSeq2Seq,
        Seq2SeqTrainer,
        Seq2SeqTrainingArguments,
        set_seed,
    )

    torch.set_num_threads(1)
    set_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(args.output_dir, "tokenizer"))
    model = AutoModelForSeq2SeqLM.from_config(marian_config(args, tokenizer), attn_implementation=attn_implementation)
    src, tgt = args.source_lang, args.target_lang

    def tokenize(batch):
        pairs = batch["translation"]
        sources, targets = [p[src] for p in pairs], [p[tgt] for p in pairs]
        return tokenizer(sources, text_target=targets, max_length=MAX_LENGTH, truncation=True)

    raw = load_dataset("json", data_files={"train": os.path.join(args.data_dir, "train.jsonl")})["train"]
    train = raw.map(tokenize, batched=True, remove_columns=raw.column_names)
    training_args = Seq2SeqTrainingArguments(
        output_dir=args.run_dir, max_steps=args.max_steps, per_device_train_batch_size=args.batch_size,
        learning_rate=args.learning_rate, label_smoothing_factor=0.1, save_strategy="no", eval_strategy="no",
        report_to=[], seed=args.seed, use_cpu=True, disable_tqdm=True, logging_steps=args.max_steps,
        train_sampling_strategy="group_by_length" if group_by_length else "random",
        include_num_input_tokens_seen="non_padding", bf16=args.bf16,
    )  # fmt: skip
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    trainer = Seq2SeqTrainer(
        model=model, args=training_args, train_dataset=train, data_collator=collator, processing_class=tokenizer
    )
    metrics = trainer.train().metrics
    trainer.save_metrics("all", metrics)
    trainer.save_state()


def train_marian_with_train_py(args: argparse.Namespace) -> None:
    """The child process of `marian-token-batches`: train.py with vanilla-token-batches' arguments (written to
    `args.run_dir/args.json` by `ours_command`), training the Marian side's model in place of ours, as
    `benchmarks/marian_train.py` does; train.py writes all_results.json."""
    from marian_train import train_marian as train_py_with_marian

    train_py_with_marian(
        [ours_command(args, args.run_dir, token_batches=True)[2]], lambda _, tokenizer: marian_config(args, tokenizer)
    )


def ours_command(
    args: argparse.Namespace,
    run_dir: str,
    token_batches: bool = False,
    grouped: bool = False,
    attn_implementation: str | None = None,
) -> list[str]:
    """train.py with the Marian side's settings; `token_batches` replaces the batches of `--batch_size` pairs by
    train.py's token batches; `grouped` draws them with Trainer's stock `--train_sampling_strategy group_by_length`,
    as the marian-grouped side does; `attn_implementation` sets --attn_implementation (None: train.py's choice).

    The arguments go to train.py as its one JSON file (`run_dir/args.json`, written here): transformers 5.24's
    HfArgumentParser reads a `str | bool` field such as `include_num_input_tokens_seen` as a boolean on the command
    line, so `non_padding` can only be given that way."""
    overrides = ",".join(f"{key}={value}" for key, value in SIZES[args.size].layout().items())
    overrides += f",dropout={args.dropout},max_position_embeddings={MAX_LENGTH}"
    values = {
        "preset": "base", "config_overrides": overrides,
        "train_file": os.path.join(args.data_dir, "train.jsonl"), "source_lang": args.source_lang,
        "target_lang": args.target_lang, "tokenizer_name": os.path.join(args.output_dir, "tokenizer"),
        "max_source_length": MAX_LENGTH, "max_target_length": MAX_LENGTH, "do_train": True, "output_dir": run_dir,
        "max_steps": args.max_steps, "per_device_train_batch_size": args.batch_size,
        "learning_rate": args.learning_rate, "label_smoothing_factor": 0.1, "save_strategy": "no",
        "eval_strategy": "no", "seed": args.seed, "threads": 1, "report_to": "none", "disable_tqdm": True,
        "logging_steps": args.max_steps, "include_num_input_tokens_seen": "non_padding",
    }  # fmt: skip
    if token_batches:
        values["max_tokens_per_batch"] = args.max_tokens_per_batch
    if grouped:
        values["train_sampling_strategy"] = "group_by_length"
    if attn_implementation is not None:
        values["attn_implementation"] = attn_implementation
    if args.bf16:
        values["bf16"] = True
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, "args.json")
    with open(path, "w") as f:
        json.dump(values, f, indent=1)
    return [sys.executable, os.path.join(ROOT, "scripts", "train.py"), path]


def mean_target_tokens(args: argparse.Namespace, pairs: list[dict], side: str = "target") -> float:
    """The corpus's mean target (or, with `side="source"`, source) length in tokens as both sides train on it
    (truncated to MAX_LENGTH, eos included)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(os.path.join(args.output_dir, "tokenizer"))
    if side == "source":
        ids = tokenizer([pair[args.source_lang] for pair in pairs], max_length=MAX_LENGTH, truncation=True)
    else:
        ids = tokenizer(text_target=[pair[args.target_lang] for pair in pairs], max_length=MAX_LENGTH, truncation=True)
    return sum(map(len, ids["input_ids"])) / len(ids["input_ids"])


def prepare_run_translation(args: argparse.Namespace) -> str:
    """For the official script: a randomly initialised MarianMTModel and the tokenizer saved in one folder (the
    script fine-tunes ``--model_name_or_path``), a JSON-lines training file named ``.json`` (the extension it
    accepts), and a working directory holding the offline sacrebleu module. Returns the working directory."""
    import torch
    from transformers import AutoTokenizer, MarianMTModel

    tokenizer = AutoTokenizer.from_pretrained(os.path.join(args.output_dir, "tokenizer"))
    torch.manual_seed(args.seed)
    marian = os.path.join(args.output_dir, "marian-init")
    MarianMTModel(marian_config(args, tokenizer)).save_pretrained(marian)
    tokenizer.save_pretrained(marian)
    shutil.copy(os.path.join(args.data_dir, "train.jsonl"), os.path.join(args.output_dir, "train.json"))
    workdir = os.path.join(args.output_dir, "run_translation_workdir")
    os.makedirs(os.path.join(workdir, "sacrebleu"), exist_ok=True)
    shutil.copy(SACREBLEU_METRIC, os.path.join(workdir, "sacrebleu", "sacrebleu.py"))
    return workdir


def run_translation_command(args: argparse.Namespace, run_dir: str, group_by_length: bool = False) -> list[str]:
    """transformers' run_translation.py, unmodified, with the settings of ours_command (and with `group_by_length`,
    its stock --train_sampling_strategy group_by_length)."""
    output_dir = os.path.abspath(args.output_dir)
    grouping = ["--train_sampling_strategy", "group_by_length"] if group_by_length else []
    return [
        sys.executable, os.path.abspath(args.run_translation),
        "--model_name_or_path", os.path.join(output_dir, "marian-init"), "--do_train",
        "--train_file", os.path.join(output_dir, "train.json"), "--source_lang", args.source_lang,
        "--target_lang", args.target_lang, "--max_source_length", str(MAX_LENGTH), "--max_target_length",
        str(MAX_LENGTH), "--output_dir", os.path.join(os.path.abspath(run_dir), "output"), "--max_steps",
        str(args.max_steps), "--per_device_train_batch_size", str(args.batch_size), "--learning_rate",
        str(args.learning_rate), "--label_smoothing_factor", "0.1", "--save_strategy", "no", "--seed", str(args.seed),
        "--use_cpu", "--report_to", "none", "--disable_tqdm", "true", "--logging_steps", str(args.max_steps),
        *grouping, *(["--bf16", "true"] if args.bf16 else []),
    ]  # fmt: skip


def source_tokens_seen(results_dir: str) -> int | None:
    """The non-padding source tokens a run trained on: the last `num_input_tokens_seen` in its trainer_state.json
    (None when it has none: transformers' run_translation.py cannot be asked to count them on its command line)."""
    path = os.path.join(results_dir, "trainer_state.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        logs = [entry for entry in json.load(f)["log_history"] if "num_input_tokens_seen" in entry]
    return logs[-1]["num_input_tokens_seen"] if logs else None


def run(command: list[str], run_dir: str, results_dir: str | None = None, cwd: str | None = None) -> dict:
    """Run one training process (from ``cwd``); its samples/s (Trainer's metric, from ``results_dir``, by default
    ``run_dir``), the non-padding source tokens it trained on per second of Trainer's train_runtime (from the
    trainer state's log), and its peak resident memory."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    start = time.perf_counter()
    with open(os.path.join(run_dir, "log.txt"), "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        _, status, usage = os.wait4(process.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(command[:3])} ... failed; see {run_dir}/log.txt")
    with open(os.path.join(results_dir or run_dir, "all_results.json")) as f:
        metrics = json.load(f)
    return {
        "train_samples_per_second": metrics["train_samples_per_second"],
        "source_tokens_seen": source_tokens_seen(results_dir or run_dir),
        "train_runtime": metrics["train_runtime"],
        "peak_rss_mib": usage.ru_maxrss / 1024,  # KiB on Linux
        "wall_s": time.perf_counter() - start,
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_arguments(argv)
    if args.child == "marian-token-batches":
        train_marian_with_train_py(args)
        return {}
    if args.child is not None:
        attention = "eager" if args.child.endswith("-eager") else None
        train_marian(args, group_by_length=args.child.startswith("marian-grouped"), attn_implementation=attention)
        return {}
    from vanilla_transformer.training.tokenizer import train_tokenizer

    train_file = os.path.join(args.data_dir, "train.jsonl")
    if not os.path.isfile(train_file):
        raise SystemExit(f"missing {train_file}: build the corpus first (benchmarks/build_mo_corpus.py)")
    with open(train_file) as f:
        pairs = [json.loads(line)["translation"] for line in f]
    texts = (text for pair in pairs for text in (pair[args.source_lang], pair[args.target_lang]))
    train_tokenizer(texts, vocab_size=args.vocab_size).save_pretrained(os.path.join(args.output_dir, "tokenizer"))
    target_tokens = mean_target_tokens(args, pairs)
    source_tokens = mean_target_tokens(args, pairs, side="source")
    workdir = prepare_run_translation(args) if args.run_translation else None

    runs: dict[str, list[dict]] = {side: [] for side in args.sides}
    for index in range(args.pairs):
        for side in args.sides:
            run_dir = os.path.join(args.output_dir, f"{side}-{index}")
            os.makedirs(run_dir, exist_ok=True)
            if side.startswith("vanilla"):
                token_batches, grouped = side == "vanilla-token-batches", side.startswith("vanilla-grouped")
                attention = "sdpa" if side.endswith("-sdpa") else None
                command = ours_command(args, run_dir, token_batches, grouped, attention)
                result = run(command, run_dir)
            elif args.run_translation and side != "marian-token-batches":
                command = run_translation_command(args, run_dir, group_by_length=side == "marian-grouped")
                result = run(command, run_dir, os.path.join(run_dir, "output"), cwd=workdir)
            else:
                command = [sys.executable, os.path.abspath(__file__), *(argv or sys.argv[1:]), "--child", side]
                result = run(command + ["--run_dir", run_dir], run_dir)
            result["target_tokens_per_second"] = result["train_samples_per_second"] * target_tokens
            # counted where the run counted them; else from samples/s (batches of --batch_size pairs drawn from the
            # whole corpus: the corpus's mean length on average)
            counted = result["source_tokens_seen"]
            result["source_tokens_counted"] = counted is not None
            result["source_tokens_per_second"] = (
                counted / result["train_runtime"]
                if counted is not None
                else result["train_samples_per_second"] * source_tokens
            )
            runs[side].append(result)
            print(f"{side} run {index + 1}/{args.pairs}: {result}", flush=True)
    speed = {side: [r["train_samples_per_second"] for r in rs] for side, rs in runs.items()}
    source_speed = {side: [r["source_tokens_per_second"] for r in rs] for side, rs in runs.items()}
    memory = {side: [r["peak_rss_mib"] for r in rs] for side, rs in runs.items()}
    ours = [side for side in args.sides if side.startswith("vanilla")]
    theirs = [side for side in args.sides if side.startswith("marian")]
    ratios = {  # per round, then the median: what to read on a shared machine
        f"{a}/{b}": {
            "speed": statistics.median(x / y for x, y in zip(speed[a], speed[b])),
            "source_tokens": statistics.median(x / y for x, y in zip(source_speed[a], source_speed[b])),
            "memory": statistics.median(x / y for x, y in zip(memory[a], memory[b])),
        }
        for a in ours
        for b in theirs
    }
    result = {
        "size": args.size,
        "max_steps": args.max_steps,
        "batch_size": args.batch_size,
        "max_tokens_per_batch": args.max_tokens_per_batch,
        "marian_side": args.run_translation or "this file's Seq2SeqTrainer run",
        "mean_target_tokens": round(target_tokens, 2),
        "mean_source_tokens": round(source_tokens, 2),
        "samples_per_second": {side: statistics.median(values) for side, values in speed.items()},
        "target_tokens_per_second": {side: statistics.median(values) * target_tokens for side, values in speed.items()},
        "source_tokens_per_second": {side: statistics.median(values) for side, values in source_speed.items()},
        "peak_rss_mib": {side: statistics.median(values) for side, values in memory.items()},
        "ratios": ratios,
        "runs": runs,
        "provenance": provenance(),
    }
    with open(os.path.join(args.output_dir, "result.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"result: size={args.size} steps={args.max_steps} batch={args.batch_size}")
    for side in args.sides:
        print(
            f"  {side:<21} samples/s {result['samples_per_second'][side]:7.2f}  source tokens/s "
            f"{result['source_tokens_per_second'][side]:8.1f}  peak RSS {result['peak_rss_mib'][side]:6.0f} MiB"
        )
    for pair, ratio in ratios.items():
        print(
            f"  {pair:<40} samples/s {ratio['speed']:.2f}x  source tokens/s {ratio['source_tokens']:.2f}x  "
            f"peak RSS {ratio['memory']:.2f}x"
        )
    return result


if __name__ == "__main__":
    main()
