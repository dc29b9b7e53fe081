#!/usr/bin/env python
"""Average the weights of the last K checkpoints of a training run into one model (§6.1: the base models average the
last 5 checkpoints, written at 10-minute intervals; the big models the last 20).

    python scripts/average_checkpoints.py --checkpoint_dir outputs/wmt16 --num_checkpoints 5 \
        --output_dir outputs/wmt16-avg5

The result is a saved model (config, generation config, tokenizer of the last checkpoint) that
`AutoModelForSeq2SeqLM.from_pretrained` and scripts/translate.py load.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from huggingface_hub.errors import StrictDataclassError
from transformers import HfArgumentParser
from transformers.trainer_utils import sort_checkpoints

import vanilla_transformer  # noqa: F401  (registers the model with the Auto classes)
from vanilla_transformer.training.checkpoints import save_averaged_model


@dataclass
class AverageArguments:
    output_dir: str = field(metadata={"help": "Where to save the averaged model."})
    checkpoint_dir: str | None = field(
        default=None, metadata={"help": "A training run's --output_dir, holding checkpoint-<step> folders."}
    )
    num_checkpoints: int = field(
        default=5, metadata={"help": "Average the last K checkpoints (the paper: 5 for base, 20 for big)."}
    )
    checkpoints: list[str] | None = field(
        default=None, metadata={"help": "Explicit checkpoint folders to average instead of the last K.", "nargs": "+"}
    )


def main(argv: list[str] | None = None) -> None:
    (args,) = HfArgumentParser(AverageArguments).parse_args_into_dataclasses(argv)
    try:
        if args.checkpoints:
            chosen = args.checkpoints
            for path in chosen:
                if not os.path.isdir(path):
                    raise ValueError(f"--checkpoints: {path!r} is not a folder.")
        else:
            if args.checkpoint_dir is None:
                raise ValueError("pass --checkpoint_dir (a training run's output folder) or --checkpoints.")
            if args.num_checkpoints < 1:
                raise ValueError(f"--num_checkpoints={args.num_checkpoints} must be at least 1.")
            if not os.path.isdir(args.checkpoint_dir):
                raise ValueError(f"--checkpoint_dir {args.checkpoint_dir!r} is not a folder.")
            found = sort_checkpoints(args.checkpoint_dir)  # oldest first, by step
            if len(found) < args.num_checkpoints:
                raise ValueError(
                    f"--num_checkpoints={args.num_checkpoints} but {args.checkpoint_dir!r} holds {len(found)} "
                    "checkpoint-* folders (raise --save_total_limit when training to keep more)."
                )
            chosen = found[-args.num_checkpoints :]
        print(f"averaging {len(chosen)} checkpoints:")
        for path in chosen:
            print(f"  {path}")
        model = save_averaged_model(chosen, args.output_dir)
    except StrictDataclassError as error:  # a config value that @strict refuses: the field and why, on one line
        raise SystemExit(f"average_checkpoints.py: error: {' '.join(str(error).split())}") from None
    except (ValueError, OSError) as error:
        raise SystemExit(f"average_checkpoints.py: error: {str(error).strip().splitlines()[0]}") from None
    parameters = sum(p.numel() for p in model.parameters())
    print(f"saved the average ({parameters / 1e6:.2f}M parameters) in {args.output_dir}")


if __name__ == "__main__":
    main(sys.argv[1:])
