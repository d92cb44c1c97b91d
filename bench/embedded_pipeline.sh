#!/usr/bin/env bash
# The measurements behind bench/results/embedded-pair.md for the embedded pair on the CPU, and how the shipped
# classifier in models/embedded-qwen2.5-coder was made. Every step resumes or is quick to redo.
# On a 2-core CPU: collection ~25 s per prompt at 128 tokens (all 273 train prompts: ~2 h; the
# collector takes the tasks in turn, so stopping it early (kill / Ctrl-C) leaves a balanced trace
# that rerunning the same command continues), compare ~4 min per test prompt.
# Run one heavy step at a time: two model processes on 2 cores slow each other 5-8x.
# Rerun: bash bench/embedded_pipeline.sh (the settings below are environment variables, e.g. DISCO=, OUT=).
set -euo pipefail
cd "$(dirname "$0")/.."
DISCO=${DISCO:-.venv/bin/disco}
PY=${PY:-.venv/bin/python}
MAX_NEW=${MAX_NEW:-128}                # new tokens per prompt
TEST_PER_TASK=${TEST_PER_TASK:-3}      # held-out test prompts per task to compare on
MODEL=${MODEL:-lightgbm}               # classifier kind (lightgbm, logistic, mlp)
TRACES=${TRACES:-traces/embedded-train-$MAX_NEW}
OUT=${OUT:-bench/embedded}
STEPS=${STEPS:-collect profile train checks compare}
mkdir -p "$OUT"

for step in $STEPS; do case $step in
  collect)  # 1. oracle traces on the shipped train prompts of every task (issue 4)
    $DISCO collect --prompts code-train,explain-train,write-train --max-new-tokens "$MAX_NEW" \
      --out "$TRACES" 2>&1 | tee -a "$OUT/collect-$MAX_NEW.log" ;;
  profile)  # 2. the cost model on this machine (issue 5)
    $DISCO profile --repeats 3 --warmup 1 --out "$OUT/profile-cpu.json" 2>&1 | tee "$OUT/profile.log" ;;
  train)  # 3. the classifier, its threshold and the baselines tuned on validation prompts (issue 5)
    $DISCO train --traces "$TRACES" --profile "$OUT/profile-cpu.json" --model "$MODEL" \
      --out models/embedded-qwen2.5-coder --ablate --cross-task 2>&1 | tee "$OUT/train.log" ;;
  checks)  # 4. collection cost vs plain generation; simulated vs real counts (issues 4, 5)
    $PY bench/real_pair_checks.py --traces "$TRACES" --classifier models/embedded-qwen2.5-coder --prompts 3 \
      --json "$OUT/real-checks.json" 2>&1 | tee "$OUT/real-checks.log" ;;
  compare)  # 5. every policy on held-out test prompts, one interleaved run (issues 2, 6, 8)
    $DISCO compare --prompts code-test,explain-test,write-test --limit "$TEST_PER_TASK" --max-new-tokens "$MAX_NEW" \
      --classifier models/embedded-qwen2.5-coder --out "$OUT/compare-embedded-$MAX_NEW" 2>&1 | tee "$OUT/compare-$MAX_NEW.log" ;;
  *) echo "unknown step $step (collect profile train checks compare)" >&2; exit 2 ;;
esac; done
