#!/usr/bin/env bash
# One prepared run of the CUDA arm on a GPU machine (H200): build with
# VTINFER_CUDA=1, run tests/cuda, then the attention/store benchmark.
#   usage: OUT=/path benchmarks/cuda_check.sh      (JSON to $OUT/cuda.json)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/vtinfer-cuda}
mkdir -p "$OUT"
say() { echo "== [$(date +%T)] $*"; }
say "device"; nvidia-smi -L || true
say "torch (CUDA build needed for the tests and the SDPA baseline)"
python -c "import torch; print(torch.__version__, torch.cuda.is_available())" || echo "!!! no torch"
say "build with VTINFER_CUDA=1"
VTINFER_CUDA=1 VTINFER_WERROR=1 timeout 600 python setup.py -q build_ext --inplace 2>&1 | tail -5
python -c "import vtinfer as vt; print(vt.build_info()['cuda'])"
say "tests/cuda"
timeout 600 python -m pytest tests/cuda -q -x -p no:cacheprovider 2>&1 | tee "$OUT/tests.txt" | tail -15 || echo "!!! tests failed"
say "bench_attention_cuda.py"
timeout 600 python benchmarks/bench_attention_cuda.py --out "$OUT/cuda.json" 2>&1 | tee "$OUT/bench.txt"
say "done: $OUT"
