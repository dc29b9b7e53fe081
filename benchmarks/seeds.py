#!/usr/bin/env python
"""anchor.py or recipe.py once per seed, unattended, then the mean ± standard deviation over the seeds.

Each seed's run goes to OUTPUT_DIR/seed-S (its result.json records the command, commit and time), its output to
OUTPUT_DIR/seed-S.log. `--parallel N` runs N at a time, each pinned to its own core with `taskset` and one thread,
as the runs in docs/results.md were made. Then the table of summarize.py, also written to OUTPUT_DIR/summary.json.

    python benchmarks/run.py seeds --seeds 42 43 44 --parallel 2 -- anchor --data_dir data/en-fr \
        --output_dir outputs/anchor-stock --dropout 0 --bf16 --max_train_minutes 6
    python benchmarks/run.py seeds --seeds 42 43 44 --parallel 2 -- recipe --data_dir data/en-fr \
        --output_dir outputs/recipe --max_train_minutes 6 -- --threads 1

The seed goes where each driver takes it: anchor.py's `--seed`, or after recipe.py's `--` (train.py's `--seed`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from summarize import format_table, load_results, summarize  # noqa: E402

RUN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "run.py")
DRIVERS = ("anchor", "recipe")


def seed_command(benchmark: list[str], seed: int) -> tuple[list[str], str]:
    """The command line of one seed's run of `benchmark` (a driver's name and its arguments), and its output folder."""
    if not benchmark or benchmark[0] not in DRIVERS:
        raise SystemExit(f"seeds: name a driver after `--`, one of {', '.join(DRIVERS)}; got {benchmark[:1]}")
    name, rest = benchmark[0], benchmark[1:]
    own, extra = (rest[: rest.index("--")], rest[rest.index("--") + 1 :]) if "--" in rest else (rest, [])
    if "--seed" in own or "--seed" in extra:
        raise SystemExit("seeds: --seed is set by --seeds; drop it from the driver's arguments")
    if "--output_dir" not in own or own.index("--output_dir") + 1 >= len(own):
        raise SystemExit(f"seeds: {name} needs --output_dir (each seed's run goes to a folder seed-S inside it)")
    at = own.index("--output_dir") + 1
    base, output_dir = own[at], os.path.join(own[at], f"seed-{seed}")
    own = [*own[:at], output_dir, *own[at + 1 :]]
    if name == "anchor":  # its recipe's name comes from its flags, the same for every seed
        return [sys.executable, RUN, name, *own, "--seed", str(seed)], output_dir
    if "--name" not in own:  # recipe.py's default, the output folder's name, would differ by seed
        own += ["--name", os.path.basename(os.path.normpath(base))]
    return [sys.executable, RUN, name, *own, "--", *extra, "--seed", str(seed)], output_dir


def main(argv: list[str] | None = None) -> list[dict]:
    argv = sys.argv[1:] if argv is None else list(argv)
    own, benchmark = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    parser.add_argument("--parallel", type=int, default=1, help="runs at a time, one core each")
    args = parser.parse_args(own)
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds {args.seeds}: each seed once")
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if not 1 <= args.parallel <= len(cores):
        parser.error(f"--parallel {args.parallel}: between 1 and this process's {len(cores)} cores")
    runs = [seed_command(benchmark, seed) for seed in args.seeds]
    pin = args.parallel > 1 and shutil.which("taskset") is not None
    env = dict(os.environ, OMP_NUM_THREADS="1")
    failed, waiting, running = [], list(zip(args.seeds, runs)), {}
    while waiting or running:
        while waiting and len(running) < args.parallel:
            seed, (command, output_dir) = waiting.pop(0)
            core = next(core for core in cores if core not in running.values())
            os.makedirs(os.path.dirname(output_dir), exist_ok=True)
            print(f"seed {seed}: {' '.join(command)}" + (f" (core {core})" if pin else ""), flush=True)
            with open(f"{output_dir}.log", "w") as log:
                pinned = ["taskset", "-c", str(core), *command] if pin else command
                running[subprocess.Popen(pinned, stdout=log, stderr=subprocess.STDOUT, env=env)] = core
        pid, status = os.wait()  # the first of the running seeds to finish
        finished = next((process for process in running if process.pid == pid), None)
        if finished is None:
            continue
        finished.returncode = os.waitstatus_to_exitcode(status)
        del running[finished]
        if finished.returncode != 0:
            failed.append(" ".join(finished.args))
    for command in failed:
        print(f"failed: {command}", flush=True)
    folders = [output_dir for _, output_dir in runs]
    rows = summarize(load_results(folders))
    print(format_table(rows))
    with open(os.path.join(os.path.dirname(folders[0]), "summary.json"), "w") as f:
        json.dump({"seeds": args.seeds, "rows": rows, "runs": [command for command, _ in runs]}, f, indent=1)
    if failed:
        raise SystemExit(f"seeds: {len(failed)} of {len(runs)} runs failed; see their seed-S.log")
    return rows


if __name__ == "__main__":
    main()
