#!/usr/bin/env python
"""Is the CTranslate2 export the same model? Test-set translations of a trained model by transformers' generate()
and by its float32 and int8 CTranslate2 exports: identical sentences, BLEU and chrF, in one run.

    python benchmarks/ctranslate2_quality.py --model_dir outputs/demo            # the built-in demo test set
    python benchmarks/ctranslate2_quality.py --model_dir outputs/en-fr --data_file data/en-fr/test.jsonl \
        --source_lang en --target_lang fr

Greedy and beam 4 (the paper's), batches of 32, one thread unless --threads; the model's own generation settings
otherwise. Prints a Markdown table and writes it all as JSON next to the --output_file.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import torch
from transformers import HfArgumentParser

from vanilla_transformer.inference.ctranslate2 import export_ctranslate2, load_ctranslate2_translator
from vanilla_transformer.inference.loading import load_translator
from vanilla_transformer.inference.score import score
from vanilla_transformer.inference.translate import translate


@dataclass
class QualitySettings:
    model_dir: str = field(metadata={"help": "A trained model folder (scripts/train.py's --output_dir)."})
    data_file: str | None = field(
        default=None, metadata={"help": "A .jsonl test set of {'translation': {lang: text}} (default: the demo's)."}
    )
    source_lang: str = field(default="de", metadata={"help": "Source language key."})
    target_lang: str = field(default="en", metadata={"help": "Target language key."})
    max_sentences: int | None = field(default=None, metadata={"help": "Use only the first N test sentences."})
    threads: int = field(default=1, metadata={"help": "CPU threads of both engines."})
    output_file: str = field(default="outputs/ctranslate2_quality.json", metadata={"help": "Where to write JSON."})


def test_set(settings: QualitySettings) -> tuple[list[str], list[str]]:
    if settings.data_file is None:
        from vanilla_transformer.training.data import demo_corpus

        pairs = demo_corpus()["test"]["translation"]
    else:
        with open(settings.data_file, encoding="utf-8") as f:
            pairs = [json.loads(line)["translation"] for line in f if line.strip()]
    pairs = pairs[: settings.max_sentences]
    return [p[settings.source_lang] for p in pairs], [p[settings.target_lang] for p in pairs]


def main(argv: list[str] | None = None) -> dict:
    (settings,) = HfArgumentParser(QualitySettings).parse_args_into_dataclasses(argv)
    torch.set_num_threads(settings.threads)
    sources, references = test_set(settings)
    model, tokenizer = load_translator(settings.model_dir, device="cpu")
    rows, outputs = [], {}
    with tempfile.TemporaryDirectory() as folder:
        engines = {"transformers": None}
        for quantization in ("float32", "int8"):
            exported = export_ctranslate2(settings.model_dir, os.path.join(folder, quantization), quantization)
            engines[f"ct2_{quantization}"] = load_ctranslate2_translator(exported, threads=settings.threads)
        for num_beams in (1, 4):
            for name, engine in engines.items():
                start = time.perf_counter()
                if engine is None:
                    hypotheses = translate(model, tokenizer, sources, num_beams=num_beams, progress=False)
                else:
                    hypotheses = engine.translate(sources, num_beams=num_beams, progress=False)
                seconds = time.perf_counter() - start
                outputs[(name, num_beams)] = hypotheses
                same = sum(a == b for a, b in zip(hypotheses, outputs[("transformers", num_beams)]))
                scores = score(hypotheses, references)
                rows.append(
                    {
                        "engine": name,
                        "num_beams": num_beams,
                        "bleu": scores["bleu"],
                        "chrf": scores["chrf"],
                        "identical_to_transformers": same,
                        "sentences": len(sources),
                        "seconds": seconds,
                    }
                )
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "settings": vars(settings),
        "rows": rows,
    }
    os.makedirs(os.path.dirname(os.path.abspath(settings.output_file)), exist_ok=True)
    with open(settings.output_file, "w") as f:
        json.dump(result, f, indent=1)
    print("| decoding | engine | BLEU | chrF | identical to transformers | seconds |")
    print("|---|---|---:|---:|---:|---:|")
    for row in rows:
        decoding = "greedy" if row["num_beams"] == 1 else f"beam {row['num_beams']}"
        print(
            f"| {decoding} | {row['engine']} | {row['bleu']:.2f} | {row['chrf']:.2f} | "
            f"{row['identical_to_transformers']}/{row['sentences']} | {row['seconds']:.1f} |"
        )
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
