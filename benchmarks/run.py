#!/usr/bin/env python
"""The one entry point of the benchmarks: `python benchmarks/run.py <benchmark> [its flags]`.

    python benchmarks/run.py --list                                   # what each benchmark measures
    python benchmarks/run.py model_speed --quick                      # speed and memory against MarianMTModel
    python benchmarks/run.py build_mo_corpus --output_dir data/en-fr  # the real corpus, from installed .mo files
    OMP_NUM_THREADS=1 python benchmarks/run.py anchor --data_dir data/en-fr --output_dir outputs/anchor-marian

Each benchmark is a module of this folder with a `main(argv)`; `<benchmark> --help` lists its flags. The folder is
not installed with the package.
"""

from __future__ import annotations

import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

BENCHMARKS = {
    "model_speed": "speed and memory of this model against MarianMTModel at identical sizes (training, generation)",
    "end_to_end": "train.py against transformers' run_translation.py + MarianMTModel, end to end",
    "compile_steps": "training steps of varying lengths under torch_compile=True: time and graphs against Marian",
    "anchor": "MarianMTModel trained by a run_translation.py-style Seq2SeqTrainer run on a parallel corpus",
    "recipe": "train.py's defaults on a parallel corpus, timed like the anchor and compared with it",
    "marian_train": "train.py's recipe training MarianMTModel at the same size (what the recipe gives, not the model)",
    "compare": "a paired bootstrap between two systems' test translations",
    "ctranslate2_speed": "translation throughput and memory: CTranslate2 against generate()",
    "ctranslate2_quality": "the CTranslate2 export's test translations against generate()'s",
    "build_mo_corpus": "an English->French corpus from the gettext catalogs installed on this machine",
    "summarize": "mean ± standard deviation over seeds of anchor.py / recipe.py results, by validation BLEU",
    "seeds": "anchor.py or recipe.py once per seed, unattended (one core each), then summarize's table",
    "gpu_check": "ten minutes on a GPU: the losses, train.py (bf16, fp16, compile, FSDP2), generation, Marian (gpu.sh)",
    "prepare_gpu_wheels": "the wheels gpu.sh installs on a GPU machine that can fetch nothing, into .whl/",
}


def main(argv: list[str] | None = None) -> object:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "--list"):
        print(__doc__)
        print("\n".join(f"  {name:<20} {what}" for name, what in BENCHMARKS.items()))
        return None
    name, rest = argv[0], argv[1:]
    if name not in BENCHMARKS:
        raise SystemExit(f"unknown benchmark {name!r}; one of: {', '.join(BENCHMARKS)}")
    return importlib.import_module(name).main(rest)


if __name__ == "__main__":
    main()
