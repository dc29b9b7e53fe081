#!/usr/bin/env python
"""The wheels benchmarks/gpu.sh installs on a GPU machine that can fetch nothing, downloaded beforehand into .whl/.

    python benchmarks/prepare_gpu_wheels.py                           # Python 3.11 and 3.12, manylinux x86_64
    python benchmarks/prepare_gpu_wheels.py --python 3.12 --exclude hf-xet lxml      # what a known machine lacks

A GPU image brings torch built for its CUDA, and often an older transformers (5.17, say, below the package's 5.24
floor). This resolves the package's requirements (setup.cfg: install_requires and the `train` extra; `--ctranslate2`
adds that extra) for each Python version, as pip would install them on a bare manylinux x86_64 Python, and downloads
every wheel except torch's and those of --exclude (with what only they need): torch is never replaced, and numpy,
pandas and pyarrow, which every such image holds, would not fit. gpu.sh then installs from the folder only what the
machine lacks (`pip install --no-index --find-links .whl`), keeping what it has where that satisfies the
requirements. (No wheels for Python 3.10: transformers 5.21 and later require 3.11.)

The folder travels with the repository to the GPU machine (64 MiB in all there), so this fails above --limit_mib.
CTranslate2's wheel alone is 41 MiB for one Python version, transformers' 13: with --ctranslate2 even Python 3.12
alone, without hf-xet and lxml, came to 70 MiB (2026-12-07), so gpu.sh checks CTranslate2 only on a machine that
has it (its translate stage says "skipped" otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from gpu_check import requirements  # noqa: E402

PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_26_x86_64", "manylinux_2_24_x86_64"]
PLATFORMS += ["manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_12_x86_64", "manylinux2010_x86_64"]
PLATFORMS += ["manylinux1_x86_64", "linux_x86_64"]
# what the GPU machine has, or must keep: torch (built for its CUDA; what it alone needs goes with it) and the large
# wheels every image with torch holds
NOT_CARRIED = ["torch", "numpy", "pandas", "pyarrow"]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pip_options(python: str) -> list[str]:
    options = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp"]
    for platform in PLATFORMS:
        options += ["--platform", platform]
    return options


def resolve(wanted: list[str], python: str, pins: dict[str, str] | None = None) -> list[dict]:
    """What pip would install for `wanted` on a bare `python` on manylinux x86_64 (with `pins`: these versions of
    the packages named): its installation report's items."""
    with tempfile.TemporaryDirectory() as folder:
        report = os.path.join(folder, "report.json")
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
        command += ["--report", report, "--target", os.path.join(folder, "target"), *pip_options(python), *wanted]
        if pins:
            with open(os.path.join(folder, "pins.txt"), "w") as f:
                f.write("".join(f"{name}=={version}\n" for name, version in pins.items()))
            command += ["--constraint", os.path.join(folder, "pins.txt")]
        if subprocess.run(command, check=False).returncode != 0:
            raise SystemExit(
                f"prepare_gpu_wheels.py: error: pip found no wheels of {' '.join(wanted)} for Python {python} "
                "(why: above)."
            )
        with open(report) as f:
            return json.load(f)["install"]


def marker_environment(python: str) -> dict[str, str]:
    return {
        "python_version": python,
        "python_full_version": f"{python}.0",
        "platform_machine": "x86_64",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "extra": "",
    }


def needed(items: list[dict], python: str, not_carried: set[str]) -> list[dict]:
    """The items reachable from the requested ones without going through `not_carried`: a package that only torch
    (or numpy, ...) needs stays behind with it; one that the package needs too is kept."""
    from packaging.requirements import Requirement

    by_name = {canonical(item["metadata"]["name"]): item for item in items}
    environment = marker_environment(python)
    todo = [name for name, item in by_name.items() if item.get("requested") and name not in not_carried]
    kept = set()
    while todo:
        name = todo.pop()
        if name in kept:
            continue
        kept.add(name)
        for line in by_name[name]["metadata"].get("requires_dist") or []:
            requirement = Requirement(line)
            if requirement.marker is not None and not requirement.marker.evaluate(environment):
                continue
            dependency = canonical(requirement.name)
            if dependency in by_name and dependency not in not_carried and dependency not in kept:
                todo.append(dependency)
    return [by_name[name] for name in sorted(kept)]


def download(items: list[dict], python: str, folder: str) -> None:
    pins = [f"{item['metadata']['name']}=={item['metadata']['version']}" for item in items]
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", *pip_options(python), "-d", folder]
    subprocess.run(command + pins, check=True)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", nargs="+", default=["3.11", "3.12"], help="Python versions (X.Y).")
    parser.add_argument("--dir", default=os.path.join(ROOT, ".whl"), help="The wheel folder (replaced).")
    parser.add_argument("--ctranslate2", action="store_true", help="Add the ctranslate2 extra (about 43 MB).")
    parser.add_argument(
        "--exclude",
        nargs="*",
        default=[],
        help="More packages not to carry (the machine has them in a version "
        "that satisfies the requirements), with what only they need.",
    )
    parser.add_argument("--limit_mib", type=float, default=60.0, help="Fail above this size.")
    args = parser.parse_args(argv)

    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import Requirement

    extras = ("train", "ctranslate2") if args.ctranslate2 else ("train",)
    wanted = requirements(extras)
    # the transformers the tests here ran on (it meets the floor): the GPU machine runs what was tested
    tested = f"transformers=={version('transformers')}"
    wanted = [tested if canonical(Requirement(line).name) == "transformers" else line for line in wanted]
    if not Requirement(next(line for line in requirements() if line.startswith("transformers"))).specifier.contains(
        version("transformers")
    ):
        raise SystemExit(f"prepare_gpu_wheels.py: error: the installed {tested} is not what setup.cfg asks for.")
    not_carried = {canonical(name) for name in NOT_CARRIED + args.exclude}
    if os.path.isdir(args.dir):
        for name in os.listdir(args.dir):
            if name.endswith(".whl"):
                os.remove(os.path.join(args.dir, name))
    os.makedirs(args.dir, exist_ok=True)
    for python in args.python:
        items = needed(resolve(wanted, python), python, not_carried)
        # the versions the tests here ran on, where they resolve for that Python: the GPU machine runs what was tested
        pins = {}
        for item in items:
            try:
                pins[item["metadata"]["name"]] = version(item["metadata"]["name"])
            except PackageNotFoundError:
                continue
        try:
            items = needed(resolve(wanted, python, pins), python, not_carried)
        except SystemExit:
            print(f"Python {python}: the versions installed here do not resolve together there; the newest do")
        print(f"Python {python}: {len(items)} wheels for {' '.join(wanted)}", flush=True)
        download(items, python, args.dir)
    sizes = {name: os.path.getsize(os.path.join(args.dir, name)) for name in sorted(os.listdir(args.dir))}
    total = sum(sizes.values())
    for name, size in sizes.items():
        print(f"{size / 2**20:7.2f} MiB  {name}")
    print(
        f"{total / 2**20:7.2f} MiB in {len(sizes)} files in {args.dir}; not carried: {', '.join(sorted(not_carried))}"
    )
    if total > args.limit_mib * 2**20:
        raise SystemExit(
            f"prepare_gpu_wheels.py: error: {total / 2**20:.1f} MiB is over --limit_mib {args.limit_mib:g}: the "
            "repository travels to the GPU machine with at most 64 MiB; name fewer --python versions, or --exclude "
            "packages the machine has."
        )
    return {"files": sizes, "total_bytes": total}


if __name__ == "__main__":
    main()
