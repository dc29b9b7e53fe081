#!/usr/bin/env python
"""Translation throughput and memory: CTranslate2 against transformers' generate(), in one run.

    python benchmarks/ctranslate2_speed.py --data_file data/en-fr/test.jsonl --source_lang en \
        --tokenizer_dir outputs/en-fr --sizes small base --threads 1 0

For each model size (benchmarks/speed.py's: small = d_model 256, 3+3 layers; base = the paper's base), decoding
(beam 4, greedy) and thread count (0: all cores) it times four engines on the same sentences, translate.py-style
(sorted by length, batches of --batch_size, tokenize, decode, detokenize):

  marian       transformers' MarianMTModel at the same size: the anchor row, ratios are against it
  vanilla      transformers' generate() of this project's model
  ct2_float32  CTranslate2, the same model exported with float32 weights
  ct2_int8     CTranslate2, int8 weights
  marian_ct2_int8  the Marian model through CTranslate2's own converter (`ct2-transformers-converter`'s
               TransformersConverter), int8 weights: what a Marian user deploys

Weights are random (the same for vanilla and its exports), so every translation is forced to a fixed length: as many
tokens as the longest source in its batch (min = max new tokens), the same work for every engine; tokens/s counts
those generated tokens. The engines take turns on chunks of --chunk_batches batches, so that all see the same machine
load. Peak memory: each engine in a fresh process, resident memory at its peak while loading the model and
translating the longest batches, above the same process just before (imports done); the largest part is the weights.
"""

from __future__ import annotations

import json
import os
import platform
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

import torch
from transformers import AutoTokenizer, HfArgumentParser, MarianMTModel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from speed import SIZES, model_configs  # noqa: E402

from vanilla_transformer import VanillaTransformerForConditionalGeneration  # noqa: E402
from vanilla_transformer.inference.ctranslate2 import export_ctranslate2, require_ctranslate2  # noqa: E402
from vanilla_transformer.inference.loading import split_lines  # noqa: E402

ENGINES = ("marian", "vanilla", "ct2_float32", "ct2_int8", "marian_ct2_int8")
CT2_ENGINES = ("ct2_float32", "ct2_int8", "marian_ct2_int8")  # CTranslate2 model folders
# Targets of d_model 256 / 3+3 layers, beam 4, batches of 16, one thread: at least (tokens/s), at most (memory)
TARGETS = {"ct2_int8": 3.0, "ct2_float32": 2.0, "memory": 0.5}


@dataclass
class Settings:
    data_file: str = field(
        metadata={
            "help": "Source sentences: a .jsonl file of {'translation': {lang: text}} or a text file, one a line."
        }
    )
    tokenizer_dir: str = field(metadata={"help": "A tokenizer folder (e.g. a trained model's), at most 8000 tokens."})
    source_lang: str = field(default="en", metadata={"help": "The language key of a .jsonl file."})
    sizes: list[str] = field(default_factory=lambda: ["small", "base"], metadata={"help": "small, base (tiny: tests)."})
    sentences: int = field(default=1000, metadata={"help": "Sentences per measurement of the small size."})
    base_sentences: int = field(default=200, metadata={"help": "Sentences per measurement of the base size."})
    min_tokens: int = field(default=10, metadata={"help": "Shortest source in tokens (eos included)."})
    max_tokens: int = field(default=40, metadata={"help": "Longest source in tokens (eos included)."})
    beams: list[int] = field(default_factory=lambda: [4, 1], metadata={"help": "Beam sizes (1: greedy)."})
    threads: list[int] = field(default_factory=lambda: [1, 0], metadata={"help": "Thread counts; 0: all cores."})
    batch_size: int = field(default=16, metadata={"help": "Sentences per batch."})
    chunk_batches: int = field(default=4, metadata={"help": "Batches each engine translates before the next's turn."})
    memory: bool = field(default=True, metadata={"help": "Measure peak memory (fresh processes, beam 4, 1 thread)."})
    output_file: str = field(default="outputs/ctranslate2_speed.json", metadata={"help": "Where to write JSON."})
    seed: int = field(default=0, metadata={"help": "Seed of the weights and of the sentence sample."})


def load_sentences(settings: Settings, tokenizer, count: int) -> list[str]:
    """`count` distinct sentences of min_tokens … max_tokens tokens, a seeded sample of the file's."""
    with open(settings.data_file, encoding="utf-8") as f:
        lines = split_lines(f.read())
    if settings.data_file.endswith(".jsonl"):
        lines = [json.loads(line)["translation"][settings.source_lang] for line in lines if line.strip()]
    texts = sorted({line.strip() for line in lines if line.strip()})
    random.Random(settings.seed).shuffle(texts)
    chosen = []
    for text in texts:
        if settings.min_tokens <= len(tokenizer(text)["input_ids"]) <= settings.max_tokens:
            chosen.append(text)
            if len(chosen) == count:
                return chosen
    raise ValueError(
        f"{settings.data_file} has only {len(chosen)} sentences of {settings.min_tokens}-"
        f"{settings.max_tokens} tokens; {count} are needed."
    )


# --------------------------------------------------------------------------------------------------------------------
# Engines: each translates one batch of token-id lists, generating exactly `new_tokens` tokens per sentence


def transformers_engine(model, tokenizer, num_beams: int) -> Callable[[list[list[int]], int], list[str]]:
    def run(batch: list[list[int]], new_tokens: int) -> list[str]:
        inputs = tokenizer.pad({"input_ids": batch}, return_tensors="pt")
        with torch.inference_mode():
            outputs = model.generate(
                **inputs,
                num_beams=num_beams,
                do_sample=False,
                min_new_tokens=new_tokens,
                max_new_tokens=new_tokens,
                max_length=None,
            )
        return tokenizer.batch_decode(outputs, skip_special_tokens=True)

    return run


def ctranslate2_engine(translator, tokenizer, num_beams: int) -> Callable[[list[list[int]], int], list[str]]:
    def run(batch: list[list[int]], new_tokens: int) -> list[str]:
        results = translator.translate_batch(
            [tokenizer.convert_ids_to_tokens(ids) for ids in batch],
            beam_size=num_beams,
            min_decoding_length=new_tokens,
            max_decoding_length=new_tokens,
            max_input_length=0,
        )
        ids = [tokenizer.convert_tokens_to_ids(result.hypotheses[0]) for result in results]
        return tokenizer.batch_decode(ids, skip_special_tokens=True)

    return run


def build_models(size: str, tokenizer, folder: str, seed: int) -> dict[str, str | torch.nn.Module]:
    """The two transformers models (random weights, seeded), the CTranslate2 folders of the vanilla one, and the
    Marian one converted by CTranslate2's TransformersConverter (int8)."""
    configs = model_configs(size)
    torch.manual_seed(seed)
    vanilla = VanillaTransformerForConditionalGeneration(configs["vanilla"]).eval()
    torch.manual_seed(seed)
    marian = MarianMTModel(configs["marian"]).eval()
    model_dir = os.path.join(folder, f"{size}-model")
    vanilla.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    exports = {
        f"ct2_{q}": export_ctranslate2(model_dir, os.path.join(folder, f"{size}-{q}"), quantization=q, force=True)
        for q in ("float32", "int8")
    }
    marian_dir = os.path.join(folder, f"{size}-marian")
    marian.save_pretrained(marian_dir)
    # CTranslate2's Marian loader expects OPUS-MT's layout: one embedding row per token plus a last one, OPUS-MT's
    # <pad>, which it drops (its decoder starts from a zero embedding). This tokenizer has pad at 0, so the converted
    # copy gets one row more than the tokenizer's tokens; the same weights otherwise
    for_converter = MarianMTModel.from_pretrained(marian_dir)
    for_converter.resize_token_embeddings(len(tokenizer) + 1)
    for_converter.save_pretrained(marian_dir)
    tokenizer.save_pretrained(marian_dir)
    converter = require_ctranslate2().converters.TransformersConverter(marian_dir)
    exports["marian_ct2_int8"] = converter.convert(os.path.join(folder, f"{size}-marian-int8"), quantization="int8")
    return {"marian": marian, "vanilla": vanilla, **exports}


def make_engine(name: str, model, tokenizer, num_beams: int, threads: int):
    if name in CT2_ENGINES:
        ctranslate2 = require_ctranslate2()
        translator = ctranslate2.Translator(model, device="cpu", intra_threads=threads, inter_threads=1)
        return ctranslate2_engine(translator, tokenizer, num_beams)
    return transformers_engine(model, tokenizer, num_beams)


def batches_of(encoded: list[list[int]], batch_size: int) -> list[list[list[int]]]:
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    return [[encoded[i] for i in order[start : start + batch_size]] for start in range(0, len(order), batch_size)]


def measure_speed(models: dict, tokenizer, sentences: list[str], num_beams: int, threads: int, settings: Settings):
    """Seconds, generated tokens and sentences per engine; the engines take turns on chunks of batches. Tokenizing
    and detokenizing are timed with the translation."""
    torch.set_num_threads(threads)
    engines = {name: make_engine(name, models[name], tokenizer, num_beams, threads) for name in ENGINES}
    # the chunks are fixed by the sentences' token counts, the same for every engine
    lengths = [len(ids) for ids in tokenizer(sentences)["input_ids"]]
    order = sorted(range(len(sentences)), key=lambda i: lengths[i])
    chunk = settings.batch_size * settings.chunk_batches
    chunks = [[sentences[i] for i in order[start : start + chunk]] for start in range(0, len(order), chunk)]
    for engine in engines.values():  # warm-up: one batch of the longest sentences
        engine(tokenizer(chunks[-1][-settings.batch_size :])["input_ids"], 8)
    seconds = {name: 0.0 for name in ENGINES}
    chunk_ratios = {name: [] for name in ENGINES}
    tokens = 0
    for texts in chunks:
        chunk_seconds = {}
        for name, engine in engines.items():
            start = time.perf_counter()
            for batch in batches_of(tokenizer(texts)["input_ids"], settings.batch_size):
                engine(batch, max(len(ids) for ids in batch))
            chunk_seconds[name] = time.perf_counter() - start
            seconds[name] += chunk_seconds[name]
        tokens += sum(
            len(batch) * max(len(ids) for ids in batch)
            for batch in batches_of(tokenizer(texts)["input_ids"], settings.batch_size)
        )
        for name in ENGINES:
            chunk_ratios[name].append(chunk_seconds["marian"] / chunk_seconds[name])
    rows = []
    for name in ENGINES:
        rows.append(
            {
                "engine": name,
                "seconds": seconds[name],
                "tokens_per_s": tokens / seconds[name],
                "sentences_per_s": len(sentences) / seconds[name],
                "ratio": seconds["marian"] / seconds[name],
                "median_chunk_ratio": sorted(chunk_ratios[name])[len(chunk_ratios[name]) // 2],
            }
        )
    return {"tokens": tokens, "sentences": len(sentences), "rows": rows}


# --------------------------------------------------------------------------------------------------------------------
# Peak memory, each engine in a fresh process


def _rss_kib(field_name: str) -> int:
    with open("/proc/self/status") as status:
        return int(re.search(rf"^{field_name}:\s+(\d+) kB", status.read(), re.MULTILINE).group(1))


def memory_child(arguments: str) -> None:
    """Entry point of the subprocess: load one engine, translate the longest batches, print the peak as JSON."""
    arguments = json.loads(arguments)
    require_ctranslate2()
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(arguments["tokenizer_dir"])
    encoded = tokenizer(arguments["sentences"])["input_ids"]
    baseline = _rss_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")  # resets the high-water mark VmHWM to the current resident size (Linux 4.0+)
    name, size = arguments["engine"], arguments["size"]
    if name in CT2_ENGINES:
        model = arguments["folder"]
    else:
        torch.manual_seed(0)
        model_class = MarianMTModel if name == "marian" else VanillaTransformerForConditionalGeneration
        model = model_class(model_configs(size)[name]).eval()
    engine = make_engine(name, model, tokenizer, arguments["num_beams"], 1)
    for batch in batches_of(encoded, arguments["batch_size"]):
        engine(batch, max(len(ids) for ids in batch))
    peak = _rss_kib("VmHWM")
    result = {"engine": name, "baseline_mib": baseline / 1024, "peak_mib": peak / 1024}
    result["increase_mib"] = result["peak_mib"] - result["baseline_mib"]
    print("MEMORY_RESULT " + json.dumps(result), flush=True)


def measure_memory(size: str, models: dict, sentences: list[str], settings: Settings) -> list[dict]:
    longest = sentences[-4 * settings.batch_size :]  # the sample is sorted by length below
    code = "import sys; sys.path.insert(0, sys.argv[1]); import ctranslate2_speed as b; b.memory_child(sys.argv[2])"
    results = []
    for name in ENGINES:
        arguments = {
            "engine": name,
            "size": size,
            "folder": models[name] if name in CT2_ENGINES else None,
            "tokenizer_dir": settings.tokenizer_dir,
            "sentences": longest,
            "num_beams": 4,
            "batch_size": settings.batch_size,
        }
        completed = subprocess.run(
            [sys.executable, "-c", code, os.path.dirname(os.path.abspath(__file__)), json.dumps(arguments)],
            capture_output=True,
            text=True,
            env=dict(os.environ, OMP_NUM_THREADS="1"),
            check=False,
        )
        lines = [line for line in completed.stdout.splitlines() if line.startswith("MEMORY_RESULT ")]
        if not lines:
            raise RuntimeError(f"memory subprocess for {name} ({size}) failed:\n{completed.stderr[-3000:]}")
        results.append(json.loads(lines[0][len("MEMORY_RESULT ") :]))
    anchor = results[0]["increase_mib"]
    for result in results:
        result["ratio"] = result["increase_mib"] / anchor
    return results


# --------------------------------------------------------------------------------------------------------------------


def machine() -> dict:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = re.search(r"^model name\s*:\s*(.+)$", f.read(), re.MULTILINE).group(1)
    except (OSError, AttributeError):
        pass
    ctranslate2 = require_ctranslate2()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
        "torch": torch.__version__,
        "ctranslate2": ctranslate2.__version__,
        "python": platform.python_version(),
    }


def format_table(result: dict) -> str:
    lines = [
        "| size | decoding | threads | engine | tokens/s | sentences/s | × Marian (tokens/s) |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    for run in result["speed"]:
        decoding = "greedy" if run["num_beams"] == 1 else f"beam {run['num_beams']}"
        for row in run["rows"]:
            lines.append(
                f"| {run['size']} | {decoding} | "
                f"{run['threads']} | {row['engine']} | {row['tokens_per_s']:.0f} | {row['sentences_per_s']:.1f} | "
                f"{row['ratio']:.2f} |"
            )
    if result["memory"]:
        lines += ["", "| size | engine | peak memory above baseline (MiB) | × Marian |", "|---|---|---:|---:|"]
        for size, rows in result["memory"].items():
            for row in rows:
                lines.append(f"| {size} | {row['engine']} | {row['increase_mib']:.0f} | {row['ratio']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    (settings,) = HfArgumentParser(Settings).parse_args_into_dataclasses(argv)
    for size in settings.sizes:
        if size not in SIZES:
            raise SystemExit(f"ctranslate2_speed.py: error: --sizes: {size!r} is not one of {', '.join(SIZES)}")
    tokenizer = AutoTokenizer.from_pretrained(settings.tokenizer_dir)
    cores = os.cpu_count() or 1
    result = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": machine()}
    result.update(settings=asdict(settings), speed=[], memory={})
    with tempfile.TemporaryDirectory() as folder:
        for size in settings.sizes:
            if len(tokenizer) > SIZES[size].vocab_size:
                raise SystemExit(f"the tokenizer has {len(tokenizer)} tokens, more than the {size} model's vocabulary")
            count = settings.base_sentences if size == "base" else settings.sentences
            sentences = load_sentences(settings, tokenizer, count)
            models = build_models(size, tokenizer, folder, settings.seed)
            for threads in settings.threads:
                for num_beams in settings.beams:
                    run = measure_speed(models, tokenizer, sentences, num_beams, threads or cores, settings)
                    run.update(size=size, num_beams=num_beams, threads=threads or cores)
                    result["speed"].append(run)
                    print(format_table({"speed": [run], "memory": {}}).splitlines()[-4:], flush=True)
            if settings.memory:
                by_length = sorted(sentences, key=lambda s: len(tokenizer(s)["input_ids"]))
                result["memory"][size] = measure_memory(size, models, by_length, settings)
    os.makedirs(os.path.dirname(os.path.abspath(settings.output_file)), exist_ok=True)
    with open(settings.output_file, "w") as f:
        json.dump(result, f, indent=1)
    print(format_table(result))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
