#!/usr/bin/env bash
# Compare every policy on the embedded pair on a CUDA machine in a few minutes (issues 6, 15): the
# profile and the compare table once per path, eager (transformers' DynamicCache, eager forwards) and
# captured (static, position-indexed caches; each model's step compiled per verify-width bucket with
# CUDA graphs, compiled once before any timing: the profile's and compare.json's compile_s).
# Assumes the project is installed (`make install`); prepares the pair itself (once, cached).
# Timings are synchronised on CUDA (disco/loop/decode.py, disco/jobs/compare.py); bf16 on the GPU by default.
# Rerun: bash bench/gpu_compare.sh (the settings below are environment variables, e.g. DISCO=, OUT=).
set -euo pipefail
cd "$(dirname "$0")/.."
DISCO=${DISCO:-.venv/bin/disco}
OUT=${OUT:-bench/gpu}
CACHES=${CACHES:-dynamic static}  # static on cuda = captured steps (--compile is on by default there)
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
$DISCO models prepare --engine torch 2>&1 | tail -2
for cache in $CACHES; do
  $DISCO profile --engine torch --device cuda --cache "$cache" --out "$OUT/profile-cuda-$cache.json" 2>&1 \
    | tee "$OUT/profile-$cache.log"
  $DISCO compare --engine torch --device cuda --cache "$cache" --prompts code-test,explain-test,write-test --limit 3 \
    --max-new-tokens 128 --classifier models/embedded-qwen2.5-coder \
    --out "$OUT/compare-$cache" 2>&1 | tee "$OUT/compare-$cache.log"
done
