#!/usr/bin/env bash
# One GPU run of benchmarks/model_speed.py (written for one H200; at most 3.5 minutes): the paper's base size, bf16 autocast
# (fp32 master weights, bf16 matmuls; the loss in fp32), VanillaTransformer against MarianMTModel interleaved in the
# same process, and the MFU of the training step against the bf16 torch.matmul peak measured in the same run.
#
#   OUT=/some/folder bash benchmarks/gpu.sh
#
# Two stages (a third, optional), each under its own timeout so that a slow one cannot eat the others' results; the
# JSON is rewritten after every row, so a stage cut short still leaves the rows it finished:
#   1. eager: training step (batch 256 × 128 source / 128 target tokens), greedy and beam-4 generation (batch 16 ×
#      32 source tokens, exactly 64 new tokens), training peak memory (torch.cuda.max_memory_allocated in fresh
#      processes);
#   2. torch.compile(model) training step (the MFU target is >= 40% of the measured bf16 peak);
#   3. only with STATIC=1: greedy generation with the static cache and a compiled decoding step.
# Results: $OUT/gpu_<stage>.json, the tables in $OUT/gpu_<stage>.txt, progress in .log, versions in $OUT/env.txt.
set -uo pipefail

cd "$(dirname "$0")/.."
OUT="${OUT:-outputs/gpu}"
mkdir -p "$OUT"

# The package needs transformers >= 5.24. A GPU image with an older one gets the wheels found in .whl/ (fetched
# beforehand with `pip download transformers==5.24.0 tokenizers==0.23.3 --no-deps -d .whl`, tokenizers with
# --platform/--python-version matching the GPU machine, and carried along with the repository).
if ls .whl/transformers-*.whl > /dev/null 2>&1; then
    pip install --no-deps -q .whl/transformers-*.whl .whl/tokenizers-*.whl || echo "could not install the wheels in .whl/"
fi
python -c "import vanilla_transformer" 2>/dev/null || pip install -e . --no-deps -q
{
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv || true
    python -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

COMMON=(--device cuda --dtype bf16 --sizes base --threads 4 --gemm_size 8192
        --train_batch_size 256 --train_src_len 128 --train_tgt_len 128)

stage() {  # stage NAME SECONDS ARGS...
    local name=$1 seconds=$2
    shift 2
    echo "=== $name (at most ${seconds}s)"
    timeout --signal=INT "$seconds" python benchmarks/model_speed.py "${COMMON[@]}" "$@" \
        --output_file "$OUT/gpu_$name.json" > "$OUT/gpu_$name.txt" 2> "$OUT/gpu_$name.log"
    echo "exit status $?"
    cat "$OUT/gpu_$name.txt"
    tail -n 5 "$OUT/gpu_$name.log"
}

stage eager 85 --rows train greedy beam memory --pairs 5 --warmup 2 --memory_rounds 1 --memory_steps 2
stage compiled 125 --rows train_compiled --pairs 8 --compile_warmup 2
if [ "${STATIC:-0}" = 1 ]; then
    stage static 90 --rows greedy_static_compiled --pairs 3 --compile_warmup 2
fi
