#!/usr/bin/env python
"""Padding efficiency (real tokens / padded tokens) of token batching against plain sentence batching.

    python scripts/padding_efficiency.py                                   # the built-in demo corpus
    python scripts/padding_efficiency.py --max_tokens_per_batch 1024 4096 --batch_size 64
    python scripts/padding_efficiency.py --train_file data/train.jsonl --source_lang de --target_lang en \
        --tokenizer_name outputs/run

Sentence batching is what Trainer does by default: a random order cut into --batch_size pairs. Token batching is
what `train.py --max_tokens_per_batch N` does: pairs sorted by length, packed into batches of at most N padded tokens
on each side. Both pad each batch to its longest pair, like DataCollatorForSeq2Seq. Prints a Markdown table.
"""

import argparse
from dataclasses import dataclass, field

from transformers import AutoTokenizer, HfArgumentParser

from vanilla_transformer.training.batching import compare_batchings, sequence_lengths
from vanilla_transformer.training.data import DataArguments, DataError, select_samples, tokenize_splits
from vanilla_transformer.training.tokenizer import iterate_texts, train_tokenizer


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


@dataclass
class PaddingArguments:
    max_tokens_per_batch: list[int] = field(
        default_factory=lambda: [512, 1024, 2048],
        metadata={"help": "Token budgets to measure (padded tokens per side per batch).", "nargs": "+"},
    )
    batch_size: list[int] = field(
        default_factory=lambda: [32, 64, 128],
        metadata={"help": "Sentence batch sizes to compare with (pairs per batch).", "nargs": "+"},
    )
    split: str = field(default="train", metadata={"help": "Which split to measure."})
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "A saved tokenizer (default: BPE trained here)."}
    )
    vocab_size: int = field(default=400, metadata={"help": "Vocabulary of the BPE trained here (small preset: 400)."})
    max_source_length: int = field(default=64, metadata={"help": "As in train.py: longer training pairs dropped."})
    max_target_length: int = field(default=64, metadata={"help": "As in train.py: longer training pairs dropped."})
    pad_to_multiple_of: int | None = field(
        default=None, metadata={"help": "Round every padded length up to a multiple of this (train.py: 8 with fp16)."}
    )
    seed: int = field(default=42, metadata={"help": "Seed of the sentence order and of the tie-breaking."})


def main(argv: list[str] | None = None) -> list[dict]:
    parser = HfArgumentParser((PaddingArguments, DataArguments), description=__doc__, formatter_class=HelpFormatter)
    args, data_args = parser.parse_args_into_dataclasses(args=argv)
    for name in ("max_tokens_per_batch", "batch_size"):
        bad = [value for value in getattr(args, name) if value <= 0]
        if bad:
            parser.error(f"--{name} {bad[0]} is invalid; it must be a positive integer.")
    try:
        raw, source_lang, target_lang = data_args.load()
        if args.split not in raw:
            raise DataError(f"--split {args.split!r} is not in the data, which has {list(raw)}.")
        raw = select_samples(raw, data_args.max_samples())
        raw = {args.split: raw[args.split]}
        texts = iterate_texts(raw[args.split], source_lang, target_lang)
        tokenizer = (
            AutoTokenizer.from_pretrained(args.tokenizer_name)
            if args.tokenizer_name
            else train_tokenizer(texts, vocab_size=args.vocab_size)
        )
        tokenized = tokenize_splits(
            raw, tokenizer, source_lang, target_lang, args.max_source_length, args.max_target_length, print_fn=None
        )[args.split]
        source, target = sequence_lengths(tokenized)
        rows = compare_batchings(
            source, target, args.batch_size, args.max_tokens_per_batch, args.seed, args.pad_to_multiple_of
        )
    except (DataError, ValueError, OSError) as error:
        parser.error(str(error).strip().splitlines()[0])

    print(
        f"{args.split} split: {len(source)} pairs, {sum(source)} source + {sum(target)} target tokens "
        f"(source {min(source)}-{max(source)}, target {min(target)}-{max(target)} tokens per sentence)\n"
    )
    print(
        "| batching | batches | pairs / batch | padded tokens / batch (source + target) "
        "| efficiency: source | target | total |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['batching']} | {row['batches']} | {row['pairs']:.1f} | {row['padded']:.0f} | "
            f"{row['source']:.3f} | {row['target']:.3f} | {row['total']:.3f} |"
        )
    return rows


if __name__ == "__main__":
    main()
