#!/usr/bin/env python
"""Translate with a saved model, by beam search, one sentence per line.

    python scripts/translate.py --model_dir outputs/demo --text "dreihundertzweiundvierzig" "siebzehn"
    python scripts/translate.py --model_dir outputs/demo --input_file test.de --references test.en > test.hyp.en
    echo "dreihundertzweiundvierzig" | python scripts/translate.py --model_dir outputs/demo
    python scripts/translate.py --model_dir outputs/demo-ct2 --engine ctranslate2 --input_file test.de

--engine ctranslate2 translates with CTranslate2 (pip install 'vanilla-transformer[ctranslate2]'): from a folder
written by scripts/export_ctranslate2.py, or from a saved model exported in memory first (float32). Sentences are
batched by length and written in input order; a progress bar (stderr) shows on inputs of more than one batch. With
--references, sacreBLEU, chrF and exact match go to stderr, so that stdout holds only translations. On a GPU with
bf16 the model decodes in it (--dtype to choose).
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, field

import torch
import transformers
from huggingface_hub.errors import StrictDataclassError
from transformers import HfArgumentParser

from vanilla_transformer.inference.loading import load_engine, read_lines, split_lines
from vanilla_transformer.inference.score import score, signatures
from vanilla_transformer.training.cpu import set_cpu_threads
from vanilla_transformer.training.device import DTYPES, decode_dtype


@dataclass
class TranslateArguments:
    model_dir: str = field(metadata={"help": "A saved model folder (train.py's --output_dir) or a CTranslate2 export."})
    text: list[str] | None = field(default=None, metadata={"help": "Sentences to translate.", "nargs": "+"})
    input_file: str | None = field(default=None, metadata={"help": "One sentence per line (default: stdin)."})
    output_file: str | None = field(default=None, metadata={"help": "Where to write translations (default: stdout)."})
    references: str | None = field(default=None, metadata={"help": "Reference translations, one per line: score."})
    batch_size: int = field(default=32, metadata={"help": "Sentences per batch."})
    num_beams: int | None = field(default=None, metadata={"help": "Beam size (default: the model's, 4 for ours)."})
    length_penalty: float | None = field(default=None, metadata={"help": "Beam score / length ** this (the model's)."})
    max_new_tokens: int | None = field(default=None, metadata={"help": "Longest translation (default: input + 50)."})
    engine: str = field(default="transformers", metadata={"help": "transformers (generate()) or ctranslate2."})
    compute_type: str = field(default="default", metadata={"help": "ctranslate2: e.g. int8, float32 (the export's)."})
    inter_threads: int = field(default=1, metadata={"help": "ctranslate2: batches translated at once."})
    device: str | None = field(default=None, metadata={"help": "cpu, cuda, ... (default: a GPU if it loads)."})
    threads: int | None = field(default=None, metadata={"help": "CPU threads (default: one per idle core)."})
    dtype: str | None = field(
        default=None, metadata={"help": "Default: a GPU's bf16, else as saved.", "choices": DTYPES}
    )


def main(argv: list[str] | None = None) -> None:
    (args,) = HfArgumentParser(TranslateArguments).parse_args_into_dataclasses(argv)
    transformers.utils.logging.disable_progress_bar()  # stderr keeps our own progress bar and scores only
    try:
        if args.text and args.input_file:
            raise ValueError("pass --text or --input_file, not both.")
        sentences = args.text or (read_lines("--input_file", args.input_file) if args.input_file else None)
        sentences = split_lines(sys.stdin.read()) if sentences is None else sentences
        references = read_lines("--references", args.references) if args.references else None
        if references is not None and len(references) != len(sentences):
            raise ValueError(f"--references has {len(references)} lines but there are {len(sentences)} inputs.")
        set_cpu_threads(args.threads)
        # --dtype wins (CTranslate2 refuses it); else the device's (training/device.py): a GPU's bf16, or as saved
        dtype = decode_dtype(args.device, args.dtype) if args.engine == "transformers" or args.dtype else None
        options = {"device": args.device, "threads": torch.get_num_threads(), "compute_type": args.compute_type}
        translate = load_engine(args.model_dir, args.engine, inter_threads=args.inter_threads, dtype=dtype, **options)
        start = time.perf_counter()
        translations = translate(
            sentences,
            batch_size=args.batch_size,
            num_beams=args.num_beams,
            length_penalty=args.length_penalty,
            max_new_tokens=args.max_new_tokens,
        )
        seconds = time.perf_counter() - start
    except StrictDataclassError as error:  # a config value that @strict refuses: the field and why, on one line
        raise SystemExit(f"translate.py: error: {' '.join(str(error).split())}") from None
    except (ValueError, OSError, ImportError, RuntimeError) as error:
        raise SystemExit(f"translate.py: error: {str(error).strip().splitlines()[0]}") from None

    sink = open(args.output_file, "w", encoding="utf-8") if args.output_file else contextlib.nullcontext(sys.stdout)
    with sink as output:
        output.writelines(line + "\n" for line in translations)
    print(f"translated {len(sentences)} sentences in {seconds:.1f} s", file=sys.stderr)
    if references is not None:
        scores, signature = score(translations, references), signatures()
        print(f"sacreBLEU  {scores['bleu']:.2f}  ({signature['bleu']})", file=sys.stderr)
        print(f"chrF       {scores['chrf']:.2f}  ({signature['chrf']})", file=sys.stderr)
        print(f"exact      {scores['exact_match']:.2f}%", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
