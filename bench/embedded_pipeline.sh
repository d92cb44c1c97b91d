#!/usr/bin/env bash
# The measurements behind bench/RESULTS.md for the embedded pair on the CPU, and how the shipped
# classifier in models/embedded-qwen2.5-coder was made. Every step resumes or is quick to redo.
# Sizes are kept small enough for a 2-core CPU (about 1 h in all); raise them on a bigger machine.
set -euo pipefail
cd "$(dirname "$0")/.."
DISCO=${DISCO:-.venv/bin/disco}
TRAIN_PER_TASK=${TRAIN_PER_TASK:-6}   # shipped train prompts per task to trace
TEST_PER_TASK=${TEST_PER_TASK:-2}      # held-out test prompts per task to compare on
MAX_NEW=${MAX_NEW:-64}                 # new tokens per prompt
OUT=${OUT:-bench/embedded}
mkdir -p "$OUT"

# 1. oracle traces on the train prompts of every task (issue 4)
$DISCO collect --prompts code-train,explain-train,write-train --limit "$TRAIN_PER_TASK" \
  --max-new-tokens "$MAX_NEW" --shard-prompts 4 --out traces/embedded-train 2>&1 | tee "$OUT/collect.log"
# 2. the cost model on this machine (issue 5)
$DISCO profile --repeats 3 --warmup 1 --out "$OUT/profile-cpu.json" 2>&1 | tee "$OUT/profile.log"
# 3. the classifier, its threshold and the baselines tuned on validation prompts (issue 5)
$DISCO train --traces traces/embedded-train --profile "$OUT/profile-cpu.json" \
  --out models/embedded-qwen2.5-coder --ablate 2>&1 | tee "$OUT/train.log"
# 4. every policy on held-out test prompts, one interleaved run (issues 2, 6)
$DISCO compare --prompts code-test,explain-test,write-test --limit "$TEST_PER_TASK" --max-new-tokens "$MAX_NEW" \
  --classifier models/embedded-qwen2.5-coder --out "$OUT/compare-embedded" 2>&1 | tee "$OUT/compare.log"
