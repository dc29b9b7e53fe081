"""What the benchmark drivers share: the corpus files, test-set BLEU by beam search, the one-line result."""

from __future__ import annotations

import json
import os

import sacrebleu
import torch

from vanilla_transformer.inference.translate import translate


def corpus_files(data_dir: str) -> dict[str, str]:
    files = {split: os.path.join(data_dir, f"{split}.jsonl") for split in ("train", "validation", "test")}
    missing = [path for path in files.values() if not os.path.isfile(path)]
    if missing:
        raise SystemExit(f"missing {missing}: build the corpus first (benchmarks/build_mo_corpus.py)")
    return files


def test_bleu(model, tokenizer, test_split, src: str, tgt: str, num_beams: int = 4) -> tuple[float, float, list[str]]:
    """(sacreBLEU, chrF, hypotheses) of `model` on the test split with beam search."""
    sources = [ex[src] for ex in test_split["translation"]]
    references = [ex[tgt] for ex in test_split["translation"]]
    model.eval()
    with torch.inference_mode():
        hypotheses = translate(model, tokenizer, sources, batch_size=64, num_beams=num_beams, progress=False)
    return (
        sacrebleu.corpus_bleu(hypotheses, [references]).score,
        sacrebleu.corpus_chrf(hypotheses, [references]).score,
        hypotheses,
    )


def result_line(result: dict) -> str:
    keys = ("recipe", "steps", "train_minutes", "eval_loss", "test_bleu", "test_chrf")
    return "result: " + "  ".join(f"{key}={result[key]}" for key in keys if key in result)


def report(result: dict, output_dir: str) -> dict:
    """Write `result` to output_dir/result.json and print its one-line summary."""
    with open(os.path.join(output_dir, "result.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(result_line(result))
    return result
