#!/usr/bin/env python
"""Translate with a saved model, by beam search, one sentence per line.

    python scripts/translate.py --model_dir outputs/demo --text "dreihundertzweiundvierzig" "siebzehn"
    python scripts/translate.py --model_dir outputs/demo --input_file test.de --output_file test.hyp.en \
        --references test.en
    echo "dreihundertzweiundvierzig" | python scripts/translate.py --model_dir outputs/demo
    python scripts/translate.py --model_dir outputs/demo-ct2 --engine ctranslate2 --input_file test.de

--engine ctranslate2 translates with CTranslate2 (pip install 'vanilla-transformer[ctranslate2]'): from a folder
written by scripts/export_ctranslate2.py, or from a saved model, which is then exported in memory first (float32).

Sentences are batched by length (less padding) and written in input order; a progress bar (on stderr) shows on
inputs of more than one batch. With --references, sacreBLEU and chrF of the translations are printed on stderr, so
that stdout holds only translations.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field

import torch
import transformers
from huggingface_hub.errors import StrictDataclassError
from transformers import HfArgumentParser

import vanilla_transformer  # noqa: F401  (registers the model with the Auto classes)
from vanilla_transformer.inference.loading import load_translator
from vanilla_transformer.inference.translate import translate
from vanilla_transformer.training.cpu import set_cpu_threads

ENGINES = ("transformers", "ctranslate2")


@dataclass
class TranslateArguments:
    model_dir: str = field(metadata={"help": "A saved model folder (scripts/train.py's --output_dir)."})
    text: list[str] | None = field(
        default=None, metadata={"help": "Sentences to translate, given on the command line.", "nargs": "+"}
    )
    input_file: str | None = field(
        default=None, metadata={"help": "A file of sentences, one per line (default: stdin when no --text)."}
    )
    output_file: str | None = field(default=None, metadata={"help": "Where to write translations (default: stdout)."})
    references: str | None = field(
        default=None, metadata={"help": "Reference translations, one per line: print sacreBLEU and chrF."}
    )
    batch_size: int = field(default=32, metadata={"help": "Sentences per batch."})
    num_beams: int | None = field(default=None, metadata={"help": "Beam size (default: the model's, 4 for ours)."})
    length_penalty: float | None = field(
        default=None,
        metadata={"help": "Beam scores are divided by length ** length_penalty (default: the model's, 1.0)."},
    )
    max_new_tokens: int | None = field(
        default=None, metadata={"help": "Longest translation in tokens (default: longest input in the batch + 50)."}
    )
    engine: str = field(
        default="transformers",
        metadata={"help": "transformers (generate()) or ctranslate2 (an exported folder; much faster on CPU)."},
    )
    compute_type: str = field(
        default="default",
        metadata={
            "help": "ctranslate2 only: the type to compute in, e.g. int8, int8_float32, float32 (default: the type "
            "the folder was exported with)."
        },
    )
    inter_threads: int = field(
        default=1,
        metadata={
            "help": "ctranslate2 only: batches translated at once, each on --threads threads (--threads × "
            "--inter_threads should not exceed the idle cores)."
        },
    )
    device: str | None = field(
        default=None,
        metadata={
            "help": "cpu, cuda, ... (default: a GPU if there is one; with ctranslate2, one whose CUDA libraries load, "
            "else the CPU, saying why)."
        },
    )
    threads: int | None = field(
        default=None,
        metadata={
            "help": "CPU threads (default: one per physical core that is idle at start, so that a shared machine "
            "does not slow translation down many-fold; OMP_NUM_THREADS is respected too)."
        },
    )


def read_lines(flag: str, path: str) -> list[str]:
    if not os.path.isfile(path):
        raise ValueError(f"{flag} {path!r} does not exist.")
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def main(argv: list[str] | None = None) -> None:
    (args,) = HfArgumentParser(TranslateArguments).parse_args_into_dataclasses(argv)
    transformers.utils.logging.disable_progress_bar()  # stderr keeps our own progress bar and scores only
    try:
        if args.text and args.input_file:
            raise ValueError("pass --text or --input_file, not both.")
        if args.text:
            sentences = list(args.text)
        elif args.input_file:
            sentences = read_lines("--input_file", args.input_file)
        else:
            sentences = sys.stdin.read().splitlines()
        references = read_lines("--references", args.references) if args.references else None
        if references is not None and len(references) != len(sentences):
            raise ValueError(
                f"--references {args.references!r} has {len(references)} lines but there are {len(sentences)} inputs."
            )
        if args.num_beams is not None and args.num_beams < 1:
            raise ValueError(f"--num_beams={args.num_beams} must be at least 1.")
        if args.engine not in ENGINES:
            raise ValueError(f"--engine {args.engine!r} is not supported; allowed: {', '.join(ENGINES)}.")
        if args.engine != "ctranslate2" and (args.compute_type != "default" or args.inter_threads != 1):
            raise ValueError("--compute_type and --inter_threads apply to --engine ctranslate2 only.")
        set_cpu_threads(args.threads)
        if args.engine == "ctranslate2":
            from vanilla_transformer.inference.ctranslate2 import load_ctranslate2_translator

            # "auto": a GPU where CTranslate2 sees one and its CUDA libraries load, else the CPU (saying why)
            translator = load_ctranslate2_translator(
                args.model_dir,
                device=args.device or "auto",
                compute_type=args.compute_type,
                threads=torch.get_num_threads(),
                inter_threads=args.inter_threads,
            )
        else:
            model, tokenizer = load_translator(args.model_dir, device=args.device)
    except StrictDataclassError as error:  # a config value that @strict refuses: the field and why, on one line
        raise SystemExit(f"translate.py: error: {' '.join(str(error).split())}") from None
    except (ValueError, OSError, ImportError, RuntimeError) as error:
        raise SystemExit(f"translate.py: error: {str(error).strip().splitlines()[0]}") from None

    options = dict(
        batch_size=args.batch_size,
        num_beams=args.num_beams,
        length_penalty=args.length_penalty,
        max_new_tokens=args.max_new_tokens,
    )
    start = time.perf_counter()
    try:
        if args.engine == "ctranslate2":
            translations = translator.translate(sentences, **options)
        else:
            translations = translate(model, tokenizer, sentences, **options)
    # e.g. a sentence longer than the model accepts; the GPU running out of memory; a library failing to load
    except (ValueError, RuntimeError, OSError) as error:
        raise SystemExit(f"translate.py: error: {str(error).strip().splitlines()[0]}") from None
    seconds = time.perf_counter() - start

    output = open(args.output_file, "w", encoding="utf-8") if args.output_file else sys.stdout
    try:
        for line in translations:
            output.write(line + "\n")
    finally:
        if args.output_file:
            output.close()
    print(f"translated {len(sentences)} sentences in {seconds:.1f} s", file=sys.stderr)
    if references is not None:
        import sacrebleu

        bleu, chrf = sacrebleu.BLEU(), sacrebleu.CHRF()
        bleu_score, chrf_score = (
            bleu.corpus_score(translations, [references]),
            chrf.corpus_score(translations, [references]),
        )
        exact = 100.0 * sum(h.strip() == r.strip() for h, r in zip(translations, references)) / max(len(references), 1)
        print(f"sacreBLEU  {bleu_score.score:.2f}  ({bleu.get_signature()})", file=sys.stderr)
        print(f"chrF       {chrf_score.score:.2f}  ({chrf.get_signature()})", file=sys.stderr)
        print(f"exact      {exact:.2f}%", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
