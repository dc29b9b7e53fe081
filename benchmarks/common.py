"""What the benchmark drivers share: the corpus files, test-set BLEU by beam search, the one-line result and what
made it."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys

import torch

from vanilla_transformer.inference.score import score
from vanilla_transformer.inference.translate import translate


def corpus_files(data_dir: str) -> dict[str, str]:
    files = {split: os.path.join(data_dir, f"{split}.jsonl") for split in ("train", "validation", "test")}
    missing = [path for path in files.values() if not os.path.isfile(path)]
    if missing:
        raise SystemExit(f"missing {missing}: build the corpus first (benchmarks/build_mo_corpus.py)")
    return files


def test_bleu(model, tokenizer, test_split, src: str, tgt: str, num_beams: int = 4) -> tuple[float, float, list[str]]:
    """(sacreBLEU, chrF, hypotheses) of `model` on the test split with beam search: the toolkit's `translate` and
    `score`, as train.py evaluates."""
    sources = [ex[src] for ex in test_split["translation"]]
    references = [ex[tgt] for ex in test_split["translation"]]
    hypotheses = translate(model.eval(), tokenizer, sources, batch_size=64, num_beams=num_beams, progress=False)
    scores = score(hypotheses, references)
    return scores["bleu"], scores["chrf"], hypotheses


def result_line(result: dict) -> str:
    keys = ("recipe", "steps", "train_minutes", "eval_loss", "test_bleu", "test_chrf")
    return "result: " + "  ".join(f"{key}={result[key]}" for key in keys if key in result)


def provenance() -> dict:
    """What made a result: the command line, the commit of this repository ("+changes" when the working tree differs
    from it, None outside a git checkout), the UTC time, the CPU and torch."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*arguments: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", root, *arguments], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "--short", "HEAD")
    if commit is not None and git("status", "--porcelain", "--untracked-files=no"):
        commit += "+changes"
    cpu = platform.processor() or platform.machine()
    if os.path.isfile("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = f"{names[0]} ({len(names)} logical CPUs)" if names else cpu
    return {
        "command": shlex.join([os.path.basename(sys.executable), *sys.argv]),
        "commit": commit,
        "utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M"),
        "cpu": cpu,
        "torch": torch.__version__,
    }


def report(result: dict, output_dir: str) -> dict:
    """Write `result`, with its `provenance()`, to output_dir/result.json and print its one-line summary."""
    result = {**result, "provenance": provenance()}
    with open(os.path.join(output_dir, "result.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(result_line(result))
    return result
