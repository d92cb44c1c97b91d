#!/usr/bin/env bash
# The measurements behind bench/results/llamacpp.md, "llama.cpp engine", and how the shipped llama.cpp classifier
# in models/embedded-qwen2.5-coder-llamacpp was made. Every step resumes or is quick to redo.
# On a 2-core CPU: collection ~10 s per train prompt at 128 tokens, profile ~1.5 min, training ~1 min,
# server tuning ~5 min, compare ~1 min per test prompt, engine table ~6 min (converts the pair for
# torch once: ~3 min). Run one heavy step at a time: two model processes on 2 cores slow each other.
# Rerun: bash bench/llamacpp_pipeline.sh (the settings below are environment variables, e.g. DISCO=, OUT=).
set -euo pipefail
cd "$(dirname "$0")/.."
DISCO=${DISCO:-.venv/bin/disco}
PY=${PY:-.venv/bin/python}
MAX_NEW=${MAX_NEW:-128}                # new tokens per prompt
TRAIN_PER_TASK=${TRAIN_PER_TASK:-50}   # train prompts per task to trace
TEST_PER_TASK=${TEST_PER_TASK:-3}      # held-out test prompts per task to compare on
MODEL=${MODEL:-lightgbm}               # classifier kind (lightgbm, logistic, mlp)
TRACES=${TRACES:-traces/llamacpp-train-$MAX_NEW}
CLASSIFIER=${CLASSIFIER:-models/embedded-qwen2.5-coder-llamacpp}
OUT=${OUT:-bench/llamacpp}
STEPS=${STEPS:-collect profile train tune compare engines}
mkdir -p "$OUT"

for step in $STEPS; do case $step in
  collect)  # 1. oracle traces on the llama.cpp engine (exact verification, draft in Q4_0)
    $DISCO collect --engine llama.cpp --prompts code-train,explain-train,write-train --limit "$TRAIN_PER_TASK" \
      --max-new-tokens "$MAX_NEW" --out "$TRACES" 2>&1 | tee -a "$OUT/collect-$MAX_NEW.log" ;;
  profile)  # 2. the cost model of both verification modes
    $DISCO profile --engine llama.cpp --verify exact --out "$OUT/profile-exact.json" 2>&1 | tee "$OUT/profile-exact.log"
    $DISCO profile --engine llama.cpp --verify fast --out "$OUT/profile-fast.json" 2>&1 | tee "$OUT/profile-fast.log" ;;
  train)  # 3. the classifier, its threshold and the baselines tuned on validation prompts, under fast
    # verification's costs: with exact verification no window pays on this machine (bench/results/llamacpp.md)
    $DISCO train --traces "$TRACES" --profile "$OUT/profile-fast.json" --model "$MODEL" \
      --out "$CLASSIFIER" --ablate 2>&1 | tee "$OUT/train.log" ;;
  tune)  # 4. llama-server -md tuned on the same validation prompts (writes $CLASSIFIER/server-tuned.json)
    $PY bench/tune_llama_server.py --classifier "$CLASSIFIER" --max-new-tokens "$MAX_NEW" 2>&1 | tee "$OUT/tune-server.log" ;;
  compare)  # 5. every policy, llama-server target-only and -md (defaults, tuned) on held-out test prompts
    $DISCO compare --engine llama.cpp --prompts code-test,explain-test,write-test --limit "$TEST_PER_TASK" \
      --max-new-tokens "$MAX_NEW" --classifier "$CLASSIFIER" --out "$OUT/compare-$MAX_NEW" 2>&1 | tee "$OUT/compare-$MAX_NEW.log" ;;
  engines)  # 6. torch float32 vs llama.cpp: step costs, verify(k), bandwidth floor, target-only tok/s
    $PY bench/engines.py --json "$OUT/engines.json" 2>&1 | tee "$OUT/engines.log" ;;
  *) echo "unknown step $step (collect profile train tune compare engines)" >&2; exit 2 ;;
esac; done
