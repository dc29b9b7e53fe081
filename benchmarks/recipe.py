#!/usr/bin/env python
"""The project's recipe on a parallel corpus: `scripts/train.py` with its defaults, timed like the anchor, compared with
the anchor's test translations by a paired bootstrap. `--model marian` trains MarianMTModel in the same recipe.

    python benchmarks/build_mo_corpus.py --output_dir data/en-fr
    OMP_NUM_THREADS=1 python benchmarks/anchor.py --data_dir data/en-fr --output_dir outputs/anchor-marian
    OMP_NUM_THREADS=1 python benchmarks/recipe.py --data_dir data/en-fr --output_dir outputs/recipe \
        --anchor_dir outputs/anchor-marian --max_train_minutes 15 -- --config_overrides "d_model=256,..."

Everything after `--` goes to train.py unchanged (any of its flags). Prints one result line and writes result.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import corpus_files, report  # noqa: E402
from compare import format_comparison, paired_bootstrap, read_lines  # noqa: E402

TRAIN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "train.py")
MARIAN_TRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "marian_train.py")


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", required=True, help="train/validation/test.jsonl from build_mo_corpus.py")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--anchor_dir", default=None, help="An anchor.py output folder to compare with.")
    parser.add_argument("--max_train_minutes", type=float, required=True)
    parser.add_argument("--source_lang", default="en")
    parser.add_argument("--target_lang", default="fr")
    parser.add_argument("--name", default=None, help="The recipe's name in the result line.")
    parser.add_argument(
        "--model",
        choices=("vanilla", "marian"),
        default="vanilla",
        help="marian: the same recipe training MarianMTModel at the same size (marian_train.py).",
    )
    args = parser.parse_args(own)

    files = corpus_files(args.data_dir)
    script = MARIAN_TRAIN if args.model == "marian" else TRAIN
    command = [sys.executable, script, "--train_file", files["train"], "--validation_file", files["validation"]]
    command += ["--test_file", files["test"], "--source_lang", args.source_lang, "--target_lang", args.target_lang]
    command += ["--output_dir", args.output_dir, "--max_train_minutes", str(args.max_train_minutes)]
    command += extra
    print("running:", " ".join(command), flush=True)
    start = time.perf_counter()
    subprocess.run(command, check=True)
    wall_minutes = (time.perf_counter() - start) / 60

    with open(os.path.join(args.output_dir, "all_results.json")) as f:
        metrics = json.load(f)
    with open(os.path.join(args.output_dir, "trainer_state.json")) as f:
        steps = json.load(f)["global_step"]
    references = [json.loads(line)["translation"][args.target_lang] for line in open(files["test"], encoding="utf-8")]
    hypotheses = read_lines(os.path.join(args.output_dir, "generated_predictions.txt"))
    result = {
        "recipe": args.name or os.path.basename(os.path.normpath(args.output_dir)),
        "model": args.model,
        "seed": int(extra[extra.index("--seed") + 1]) if "--seed" in extra else 42,  # train.py's default seed
        "steps": steps,
        "train_minutes": round(metrics["train_runtime"] / 60, 2),
        "wall_minutes": round(wall_minutes, 2),
        "eval_loss": metrics.get("eval_loss"),
        "validation_bleu": round(metrics["eval_bleu"], 2) if "eval_bleu" in metrics else None,
        "test_bleu": round(metrics["predict_bleu"], 2),
        "test_chrf": round(metrics["predict_chrf"], 2),
        "train_args": extra,
    }
    if args.anchor_dir:
        anchor = read_lines(os.path.join(args.anchor_dir, "test_predictions.txt"))
        comparison = paired_bootstrap(references, anchor, hypotheses)
        result["versus_anchor"] = comparison
        print("versus the anchor:", format_comparison(comparison))
    return report(result, args.output_dir)


if __name__ == "__main__":
    main()
