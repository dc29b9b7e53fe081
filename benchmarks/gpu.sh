#!/usr/bin/env bash
# Ten minutes on a fresh one-GPU machine, offline: install what it lacks, then run benchmarks/gpu_check.py's stages
# (each under its own time limit; what each verifies: its docstring, or docs/performance.md, "Checking a GPU machine").
#
#   python benchmarks/prepare_gpu_wheels.py    # beforehand, where PyPI is reachable: the wheels, in .whl/
#   OUT=/some/folder bash benchmarks/gpu.sh    # on the GPU machine, with .whl/ beside the repository's files
#   bash benchmarks/gpu.sh --device cpu        # the dry run (tiny sizes; the checks that need CUDA are skipped)
#
# Results: $OUT (default outputs/gpu-check): gpu_check.jsonl (a line per result, written as it comes),
# gpu_check.json and gpu_check.log (every stage's output); the summary table on stdout.
# --no-install: install nothing (the dry run in the tests). Other flags go to gpu_check.py (--stages, --budget_s, ...).
# The whole run, installation included, keeps within GPU_CHECK_SECONDS (default 540).
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
install=1
args=()
for arg in "$@"; do
    if [ "$arg" = "--no-install" ]; then install=0; else args+=("$arg"); fi
done
# nothing is fetched from the Hub or anywhere else: a lookup that cannot succeed would only wait for its timeout
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export PIP_DISABLE_PIP_VERSION_CHECK=1

# Where `import vanilla_transformer` leads when run from outside the repository (from inside, the working directory
# on sys.path would find this checkout whatever is installed), found without the import, which takes seconds.
package_root() {
    (cd / && "$PYTHON" -c "import os, importlib.util as u; print(os.path.dirname(os.path.dirname(os.path.realpath(u.find_spec('vanilla_transformer').origin))))" 2>/dev/null)
}

if [ "$install" = 1 ]; then
    # The package's requirements this Python lacks (never torch: the machine's is built for its CUDA), from the
    # wheels prepared beforehand; pip keeps what is installed and satisfies them, and takes the rest from .whl/.
    missing=$("$PYTHON" benchmarks/gpu_check.py --missing)
    if [ -n "$missing" ] && [ -d .whl ]; then
        while read -r requirement; do
            echo "gpu.sh: installing $requirement from .whl/"
            "$PYTHON" -m pip install -q --no-index --find-links .whl "$requirement" \
                || echo "gpu.sh: could not install $requirement from .whl/ (the stages that need it will say so)"
        done <<< "$missing"
    elif [ -n "$missing" ]; then
        echo "gpu.sh: missing, and no .whl/ folder (python benchmarks/prepare_gpu_wheels.py makes it):" $missing
    fi
    if [ "$(package_root)" != "$ROOT" ]; then
        "$PYTHON" -m pip install -q --no-index --no-build-isolation --no-deps -e . \
            || echo "gpu.sh: pip install -e . failed"
    fi
fi
if [ "$(package_root)" != "$ROOT" ]; then
    echo "gpu.sh: vanilla_transformer is not installed from $ROOT; using it through PYTHONPATH"
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
fi
still_missing=$("$PYTHON" benchmarks/gpu_check.py --missing)
[ -z "$still_missing" ] || echo "gpu.sh: still missing:" $still_missing

budget=$(( ${GPU_CHECK_SECONDS:-540} - SECONDS ))
exec "$PYTHON" benchmarks/gpu_check.py --budget_s "$budget" ${args[@]+"${args[@]}"}
