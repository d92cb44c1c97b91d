#!/usr/bin/env bash
# The measurements behind bench/results/signals.md, "Signals a threshold cannot see" (issue 13): traces with the
# draft's hidden state and the target-side signals, every rule trained and tuned on validation prompts,
# and one `disco compare` per engine on held-out test prompts. Every step resumes or is quick to redo.
# On a 2-core CPU: llama.cpp collection ~5 s per train prompt at 128 tokens (273 prompts: ~22 min),
# training ~5 min, llama.cpp compare ~2 min per test prompt; torch collection ~25 s per prompt,
# torch compare ~3 min per test prompt with the subset of rows below. Run one heavy step at a time.
# Rerun: bash bench/signals_pipeline.sh (the settings below are environment variables, e.g. DISCO=, OUT=).
set -euo pipefail
cd "$(dirname "$0")/.."
DISCO=${DISCO:-.venv/bin/disco}
PY=${PY:-.venv/bin/python}
MAX_NEW=${MAX_NEW:-128}
TEST_PER_TASK=${TEST_PER_TASK:-3}        # held-out test prompts per task to compare on
TORCH_TRAIN_PER_TASK=${TORCH_TRAIN_PER_TASK:-20}  # torch traces are ~5x slower to collect
TORCH_TEST_PER_TASK=${TORCH_TEST_PER_TASK:-2}
LLAMA_TRACES=${LLAMA_TRACES:-traces/llamacpp-v2-train-$MAX_NEW}
TORCH_TRACES=${TORCH_TRACES:-traces/torch-v2-train-$MAX_NEW}
LLAMA_CLF=${LLAMA_CLF:-models/embedded-qwen2.5-coder-llamacpp}
TORCH_CLF=${TORCH_CLF:-runs/signals/torch-classifier}
OUT=${OUT:-bench/signals}
STEPS=${STEPS:-collect train train-fast compare torch-collect torch-profile torch-train torch-compare}
TESTS=code-test,explain-test,write-test
mkdir -p "$OUT" runs/signals

for step in $STEPS; do case $step in
  collect)  # 1. every shipped train prompt on llama.cpp (exact verification, draft in Q4_0)
    $DISCO collect --engine llama.cpp --prompts code-train,explain-train,write-train --max-new-tokens "$MAX_NEW" \
      --out "$LLAMA_TRACES" 2>&1 | tee -a "$OUT/collect-$MAX_NEW.log" ;;
  train)  # 2. the shipped llama.cpp policy: every rule and baseline tuned under exact verification's costs
    $DISCO train --traces "$LLAMA_TRACES" --profile bench/llamacpp/profile-exact.json --out "$LLAMA_CLF" \
      --ablate 2>&1 | tee "$OUT/train-llamacpp-exact.log" ;;
  train-fast)  # 3. the same traces under fast (batched) verification's costs, where drafting can pay
    $DISCO train --traces "$LLAMA_TRACES" --profile bench/llamacpp/profile-fast.json --out runs/signals/llamacpp-fast \
      --ablate 2>&1 | tee "$OUT/train-llamacpp-fast.log" ;;
  compare)  # 4. every rule and policy, llama-server anchors, on held-out test prompts
    $DISCO compare --engine llama.cpp --prompts $TESTS --limit "$TEST_PER_TASK" --max-new-tokens "$MAX_NEW" \
      --classifier "$LLAMA_CLF" --out "$OUT/compare-llamacpp-$MAX_NEW" 2>&1 | tee "$OUT/compare-llamacpp-$MAX_NEW.log"
    $PY bench/cost_model_table.py "$OUT/compare-llamacpp-$MAX_NEW/compare.json" bench/llamacpp/profile-exact.json \
      bench/llamacpp/profile-fast.json | tee "$OUT/compare-llamacpp-$MAX_NEW-cost.md" ;;
  torch-collect)  # 5. torch float32 traces (fewer prompts: ~5x slower per token than llama.cpp here)
    $DISCO collect --engine torch --prompts code-train,explain-train,write-train --limit "$TORCH_TRAIN_PER_TASK" \
      --max-new-tokens "$MAX_NEW" --out "$TORCH_TRACES" 2>&1 | tee -a "$OUT/collect-torch-$MAX_NEW.log" ;;
  torch-profile)
    $DISCO profile --engine torch --out "$OUT/profile-torch.json" 2>&1 | tee "$OUT/profile-torch.log" ;;
  torch-train)
    $DISCO train --traces "$TORCH_TRACES" --profile "$OUT/profile-torch.json" --out "$TORCH_CLF" --ablate \
      2>&1 | tee "$OUT/train-torch.log" ;;
  torch-compare)  # the rows that answer the issue (every row would take ~3x longer on torch)
    $DISCO compare --engine torch --prompts $TESTS --max-new-tokens "$MAX_NEW" \
      --classifier "$TORCH_CLF" --policies threshold,adaedl,svip,classifier,transformers --limit "$TORCH_TEST_PER_TASK" \
      --out "$OUT/compare-torch-$MAX_NEW" 2>&1 | tee "$OUT/compare-torch-$MAX_NEW.log"
    $PY bench/cost_model_table.py "$OUT/compare-torch-$MAX_NEW/compare.json" "$OUT/profile-torch.json" \
      | tee "$OUT/compare-torch-$MAX_NEW-cost.md" ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac; done
