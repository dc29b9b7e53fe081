#!/usr/bin/env python
"""Export a saved model to CTranslate2, for fast CPU (int8) or GPU translation with translate.py --engine ctranslate2.

    python scripts/export_ctranslate2.py --model_dir outputs/demo --output_dir outputs/demo-ct2 --quantization int8
    python scripts/translate.py --model_dir outputs/demo-ct2 --engine ctranslate2 --text "dreihundertzweiundvierzig"

The exported folder holds CTranslate2's model and vocabulary, the tokenizer and the generation config: it translates
on its own. Needs the ctranslate2 extra: pip install 'vanilla-transformer[ctranslate2]'. What is exported and how it
is checked: docs/deployment.md.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from transformers import HfArgumentParser

from vanilla_transformer.inference.ctranslate2 import QUANTIZATIONS, export_ctranslate2


@dataclass
class ExportArguments:
    model_dir: str = field(metadata={"help": "A saved model folder (scripts/train.py's --output_dir)."})
    output_dir: str = field(metadata={"help": "Where to write the CTranslate2 folder."})
    quantization: str = field(
        default="int8",
        metadata={"help": f"Type of the exported weights: {', '.join(QUANTIZATIONS)} (int8: fastest on CPU)."},
    )
    max_positions: int | None = field(
        default=None,
        metadata={
            "help": "Longest source (and translation) in tokens: rows of the exported position table (default: the "
            "config's max_position_embeddings). Longer sources are refused."
        },
    )
    force: bool = field(default=False, metadata={"help": "Replace --output_dir if it exists."})


def main(argv: list[str] | None = None) -> None:
    (args,) = HfArgumentParser(ExportArguments).parse_args_into_dataclasses(argv)
    try:
        output_dir = export_ctranslate2(
            args.model_dir,
            args.output_dir,
            quantization=args.quantization,
            max_positions=args.max_positions,
            force=args.force,
        )
    except (ValueError, OSError, ImportError, RuntimeError) as error:
        raise SystemExit(f"export_ctranslate2.py: error: {str(error).strip().splitlines()[0]}") from None
    print(f"exported {args.model_dir} to {output_dir} ({args.quantization})")


if __name__ == "__main__":
    main(sys.argv[1:])
