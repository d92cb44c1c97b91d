#!/usr/bin/env bash
# Compare every policy on the embedded pair on a CUDA machine in a few minutes (issue 6).
# Assumes the project is installed (`make install`) and the pair prepared (`disco models prepare`).
# Timings are synchronised on CUDA (disco/decode.py, disco/compare.py); bf16 on the GPU by default.
set -euo pipefail
cd "$(dirname "$0")/.."
DISCO=${DISCO:-.venv/bin/disco}
OUT=${OUT:-bench/gpu}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
$DISCO profile --device cuda --out "$OUT/profile-cuda.json" 2>&1 | tee "$OUT/profile.log"
$DISCO compare --device cuda --prompts code-test,explain-test,write-test --limit 3 --max-new-tokens 128 \
  --classifier models/embedded-qwen2.5-coder --out "$OUT/compare" 2>&1 | tee "$OUT/compare.log"
