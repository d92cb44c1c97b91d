#!/usr/bin/env bash
# The measurements behind bench/results/sampling.md, "Sampling at temperature 0.7" (issue 14): sampled traces at
# T = 0.7, top-p 0.95 on both engines, the classifier and every baseline tuned for that setting, and one
# `disco compare` per engine at the same setting on held-out test prompts, 3 seeds each, beside the
# greedy-trained classifier. Every step resumes or is quick to redo. On a 2-core CPU: llama.cpp
# collection ~7 s per train prompt (273 prompts: 34 min); torch collection ~20 s per prompt; training
# 1-2 min; llama.cpp compare ~3.4 min per prompt and seed (17 rows), torch ~2.3 min (8 rows). Run one
# heavy step at a time.
# Rerun: bash bench/sampling_pipeline.sh (the settings below are environment variables, e.g. DISCO=, OUT=).
set -euo pipefail
cd "$(dirname "$0")/.."
DISCO=${DISCO:-.venv/bin/disco}
PY=${PY:-.venv/bin/python}
MAX_NEW=${MAX_NEW:-128}
T=${T:-0.7}
TOP_P=${TOP_P:-0.95}
SEEDS=${SEEDS:-3}
SAMPLING="--temperature $T --top-p $TOP_P"
TEST_PER_TASK=${TEST_PER_TASK:-2}
TORCH_TRAIN_PER_TASK=${TORCH_TRAIN_PER_TASK:-15}
TORCH_TEST_PER_TASK=${TORCH_TEST_PER_TASK:-1}
LLAMA_TRACES=${LLAMA_TRACES:-traces/llamacpp-t$T-train-$MAX_NEW}
TORCH_TRACES=${TORCH_TRACES:-traces/torch-t$T-train-$MAX_NEW}
LLAMA_CLF=${LLAMA_CLF:-models/embedded-qwen2.5-coder-llamacpp-t$T}   # shipped: the llama.cpp policy for T
LLAMA_GREEDY=${LLAMA_GREEDY:-models/embedded-qwen2.5-coder-llamacpp}  # shipped: the greedy one
TORCH_CLF=${TORCH_CLF:-models/embedded-qwen2.5-coder-t$T}                # shipped: the torch policy for T
TORCH_GREEDY=${TORCH_GREEDY:-models/embedded-qwen2.5-coder}                # shipped: the greedy torch policy
TORCH_LLAMA_TRACES=${TORCH_LLAMA_TRACES:-runs/sampling/llamacpp-t$T-torchcost-soft}  # step 3: llama.cpp traces, torch costs
OUT=${OUT:-bench/sampling}
STEPS=${STEPS:-collect train compare collect-test sim-vs-live train-sampled-labels torch-collect torch-train torch-compare}
TESTS=code-test,explain-test,write-test
mkdir -p "$OUT" runs/sampling

for step in $STEPS; do case $step in
  collect)  # 1. every shipped train prompt on llama.cpp, sampled (exact verification, draft in Q4_0)
    $DISCO collect --engine llama.cpp --prompts code-train,explain-train,write-train --max-new-tokens "$MAX_NEW" \
      $SAMPLING --out "$LLAMA_TRACES" 2>&1 | tee -a "$OUT/collect-llamacpp-t$T.log" ;;
  train)  # 2. the shipped llama.cpp policy for T: soft labels, every rule and baseline tuned under exact costs
    $DISCO train --traces "$LLAMA_TRACES" --profile bench/llamacpp/profile-exact.json --out "$LLAMA_CLF" \
      2>&1 | tee "$OUT/train-llamacpp-t$T.log"
    # the same under fast (batched) verification's costs, where greedy drafting could pay
    $DISCO train --traces "$LLAMA_TRACES" --profile bench/llamacpp/profile-fast.json \
      --out runs/sampling/llamacpp-t$T-fast 2>&1 | tee "$OUT/train-llamacpp-t$T-fast.log" ;;
  train-sampled-labels)  # 3. soft vs sampled labels, same traces and costs (torch's, where drafting pays)
    $DISCO train --traces "$LLAMA_TRACES" --profile bench/signals/profile-torch.json --no-head \
      --out runs/sampling/llamacpp-t$T-torchcost-soft 2>&1 | tee "$OUT/train-llamacpp-t$T-torchcost-soft.log"
    $DISCO train --traces "$LLAMA_TRACES" --profile bench/signals/profile-torch.json --no-head --labels sampled \
      --out runs/sampling/llamacpp-t$T-torchcost-sampled 2>&1 | tee "$OUT/train-llamacpp-t$T-torchcost-sampled.log" ;;
  torch-collect)  # 4. torch float32 traces at T (fewer prompts: ~4x slower per token than llama.cpp here)
    $DISCO collect --engine torch --prompts code-train,explain-train,write-train --limit "$TORCH_TRAIN_PER_TASK" \
      --max-new-tokens "$MAX_NEW" $SAMPLING --out "$TORCH_TRACES" 2>&1 | tee -a "$OUT/collect-torch-t$T.log" ;;
  torch-train)
    $DISCO train --traces "$TORCH_TRACES" --profile bench/signals/profile-torch.json --out "$TORCH_CLF" \
      2>&1 | tee "$OUT/train-torch-t$T.log" ;;
  torch-compare)  # 5. the rows the goals name: threshold tuned for T, transformers' assisted generation at T,
                  #    the classifier trained for T and the greedy-trained one; and one trained on the (6x more)
                  #    llama.cpp traces at T under torch's costs
    $DISCO compare --engine torch --prompts $TESTS --limit "$TORCH_TEST_PER_TASK" --max-new-tokens "$MAX_NEW" \
      $SAMPLING --seeds "$SEEDS" --classifier "$TORCH_CLF" --classifier "$TORCH_GREEDY" --classifier "$TORCH_LLAMA_TRACES" \
      --policies threshold,classifier,transformers --out "$OUT/compare-torch-t$T" 2>&1 | tee "$OUT/compare-torch-t$T.log"
    $PY bench/cost_model_table.py "$OUT/compare-torch-t$T/compare.json" bench/signals/profile-torch.json \
      | tee "$OUT/compare-torch-t$T-cost.md" ;;
  compare)  # 6. llama.cpp, every policy but the per-rule rows (and no oracle: greedy only), llama-server anchors
    $DISCO compare --engine llama.cpp --prompts $TESTS --limit "$TEST_PER_TASK" --max-new-tokens "$MAX_NEW" \
      $SAMPLING --seeds "$SEEDS" --classifier "$LLAMA_CLF" --classifier "$LLAMA_GREEDY" \
      --policies constant,heuristic,threshold,adaedl,svip,classifier,llama-server \
      --out "$OUT/compare-llamacpp-t$T" 2>&1 | tee "$OUT/compare-llamacpp-t$T.log"
    $PY bench/cost_model_table.py "$OUT/compare-llamacpp-t$T/compare.json" bench/llamacpp/profile-exact.json \
      bench/llamacpp/profile-fast.json | tee "$OUT/compare-llamacpp-t$T-cost.md" ;;
  collect-test)  # 7. sampled traces of compare's own test prompts, to check the simulator against it
    $DISCO collect --engine llama.cpp --prompts $TESTS --limit "$TEST_PER_TASK" --max-new-tokens "$MAX_NEW" \
      $SAMPLING --out "traces/llamacpp-t$T-test-$MAX_NEW" 2>&1 | tee -a "$OUT/collect-llamacpp-t$T-test.log" ;;
  sim-vs-live)
    $PY bench/sim_vs_live.py "traces/llamacpp-t$T-test-$MAX_NEW" "$OUT/compare-llamacpp-t$T/compare.json" \
      bench/llamacpp/profile-exact.json "$LLAMA_CLF" "$LLAMA_GREEDY" | tee "$OUT/sim-vs-live-llamacpp-t$T.md" ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac; done
