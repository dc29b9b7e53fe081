#!/usr/bin/env python
"""Translate one sentence and draw the encoder-decoder attention behind it, and the positional-encoding table.

    python scripts/plot_attention.py --model_dir outputs/demo --text "dreihundertzweiundvierzig"
    python scripts/plot_attention.py --model_dir outputs/demo --text "siebentausendeins" --layer 0 --head 2

Writes, in --output_dir:
    cross_attention_layer{L}.png         (heads averaged; cross_attention_layer{L}_head{H}.png with --head)
    cross_attention_layer{L}_heads.png   (one panel per head)
    positional_encoding.png              (position x dimension, and a few dimensions as curves)
Needs matplotlib: pip install 'vanilla-transformer[plot]'.
"""

import argparse
import os
from dataclasses import dataclass, field

from transformers import AutoTokenizer, HfArgumentParser

import vanilla_transformer  # noqa: F401  (registers the model with the Auto classes)
from vanilla_transformer.inference.ctranslate2 import position_table
from vanilla_transformer.inference.loading import load_trained_model
from vanilla_transformer.plots.plotting import (
    plot_cross_attention,
    plot_cross_attention_heads,
    plot_positional_encoding,
    translate_with_attention,
)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


@dataclass
class PlotAttentionArguments:
    model_dir: str = field(metadata={"help": "A trained model folder (from scripts/train.py): weights and tokenizer."})
    text: str = field(metadata={"help": "The source sentence to translate."})
    layer: int = field(default=-1, metadata={"help": "Decoder layer whose cross-attention is drawn (-1: last)."})
    head: int | None = field(default=None, metadata={"help": "Draw this head instead of the mean over heads."})
    output_dir: str = field(default="outputs/plots", metadata={"help": "Where to write the PNG files."})
    num_beams: int = field(default=1, metadata={"help": "1: greedy decoding; more: beam search."})
    max_new_tokens: int | None = field(
        default=None, metadata={"help": "Longest translation in tokens (default: the model's generation config)."}
    )
    positions: int = field(default=100, metadata={"help": "Positions (rows) of the positional-encoding picture."})


def main(argv: list[str] | None = None) -> dict[str, str]:
    parser = HfArgumentParser(PlotAttentionArguments, description=__doc__, formatter_class=HelpFormatter)
    (args,) = parser.parse_args_into_dataclasses(args=argv)
    if not os.path.isdir(args.model_dir):
        parser.error(f"--model_dir {args.model_dir!r} is not a folder; give the output folder of scripts/train.py.")
    if args.num_beams < 1:
        parser.error(f"--num_beams {args.num_beams} is invalid; it must be at least 1.")
    if args.positions < 1:
        parser.error(f"--positions {args.positions} is invalid; it must be at least 1.")

    # eager attention: the only implementation that returns the attention weights
    model = load_trained_model(args.model_dir, attn_implementation="eager")
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    config = model.config
    for name, value, size in (
        ("--layer", args.layer, config.decoder_layers),
        ("--head", args.head, config.decoder_attention_heads),
    ):
        if value is not None and not -size <= value < size:
            parser.error(
                f"{name} {value} is out of range; the model has {size} (use 0..{size - 1}, or -1 for the last)."
            )
    try:
        table = position_table(model, "encoder", args.positions)  # what the encoder adds to its input
    except ValueError as error:  # more positions than a learned table has
        parser.error(f"--positions {args.positions}: {error}")

    attention = translate_with_attention(
        model, tokenizer, args.text, num_beams=args.num_beams, max_new_tokens=args.max_new_tokens
    )
    layer = args.layer % config.decoder_layers
    suffix = "" if args.head is None else f"_head{args.head % config.decoder_attention_heads}"
    paths = {
        "attention": os.path.join(args.output_dir, f"cross_attention_layer{layer}{suffix}.png"),
        "heads": os.path.join(args.output_dir, f"cross_attention_layer{layer}_heads.png"),
        "positional encoding": os.path.join(args.output_dir, "positional_encoding.png"),
    }
    plot_cross_attention(attention, paths["attention"], layer=layer, head=args.head)
    plot_cross_attention_heads(attention, paths["heads"], layer=layer)
    plot_positional_encoding(paths["positional encoding"], table, config.position_embedding_type)

    print(f"source:      {args.text}")
    print(f"translation: {attention.translation}")
    print(f"tokens:      {len(attention.source_tokens)} source x {len(attention.target_tokens)} generated")
    width = max(map(len, paths))
    for what, path in paths.items():
        print(f"{what:<{width}}  {path}")
    return paths


if __name__ == "__main__":
    main()
