#!/usr/bin/env python
"""Benchmark VanillaTransformer against transformers' MarianMTModel at identical sizes, in one interleaved run.

    python benchmarks/model_speed.py --quick                       # small size, under 2 minutes on CPU
    python benchmarks/model_speed.py                               # small and base, every row (~15 min on 1 thread)
    python benchmarks/model_speed.py --profile --sizes small base  # torch.profiler tables instead of the benchmark

Prints a Markdown table (medians; ratio = median of per-pair ratios vanilla / Marian) and writes it all as JSON. The
measurements themselves are in benchmarks/speed.py.
"""

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from speed import BenchmarkSettings, format_table, profile_models, run_benchmark  # noqa: E402
from transformers import HfArgumentParser  # noqa: E402


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


@dataclass
class OutputArguments:
    output_file: str = field(
        default="outputs/benchmark.json", metadata={"help": "Where to write the results (JSON); folders are created."}
    )
    profile: bool = field(
        default=False,
        metadata={"help": "Profile a training step and greedy generation of both models instead of benchmarking."},
    )
    profile_dir: str = field(
        default="outputs/profiles", metadata={"help": "Where --profile writes one operator table per workload."}
    )


def main(argv: list[str] | None = None) -> dict:
    parser = HfArgumentParser((BenchmarkSettings, OutputArguments), description=__doc__, formatter_class=HelpFormatter)
    settings, output = parser.parse_args_into_dataclasses(args=argv)
    start = time.perf_counter()

    def progress(message: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f}s] {message}", file=sys.stderr, flush=True)

    if output.profile:
        reports = profile_models(settings)
        os.makedirs(output.profile_dir, exist_ok=True)
        for key, report in reports.items():
            path = os.path.join(output.profile_dir, key.replace("/", "_") + ".txt")
            with open(path, "w") as file:
                file.write(report["table"])
            print(
                f"{key}: {report['wall_s']:.3f} s per call, {report['aten_self_s']:.3f} s inside ATen ops, "
                f"{100 * report['outside_aten_fraction']:.0f}% outside them -> {path}"
            )
        return reports

    os.makedirs(os.path.dirname(output.output_file) or ".", exist_ok=True)

    def write(results: dict) -> None:  # after every row, so that an interrupted run keeps what it measured
        with open(output.output_file, "w") as file:
            json.dump(results, file, indent=2)

    results = run_benchmark(settings, progress=progress, on_row=write)
    write(results)
    print(format_table(results))
    print(f"\nwrote {output.output_file} ({time.perf_counter() - start:.0f} s)")
    return results


if __name__ == "__main__":
    main()
