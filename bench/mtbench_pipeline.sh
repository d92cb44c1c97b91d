#!/usr/bin/env bash
# The measurements behind bench/results/mtbench.md, "MT-Bench" (issue 24): MT-Bench train traces (both turns) beside the
# shipped sets', the shipped llama.cpp policy retrained on both, the same traces trained under vLLM's costs at
# one request (tuned settings for the vLLM rows, and the cross-task report of what MT-Bench adds), then compare
# on the 32 MT-Bench test prompts (16 questions x 2 turns) x 128 tokens on llama.cpp and on vLLM.
# 2-core CPU (2026-12-01): collect 26 min (MT-Bench, incl. answering 64 first turns) + ~50 min (273 shipped
# prompts; stopped after 181 for time), training 2.5 + 5 min, vLLM compare ~60 min, test traces ~6 min,
# llama.cpp compare ~20 min. One heavy step at a time; every step resumes (collect) or is quick to redo.
# Rerun: bash bench/mtbench_pipeline.sh (the settings below are environment variables, e.g. DISCO=, OUT=).
set -euo pipefail
cd "$(dirname "$0")/.."
DISCO=${DISCO:-.venv/bin/disco}
PY=${PY:-.venv/bin/python}
MT_TRACES=${MT_TRACES:-traces/llamacpp-mtbench-trainval-128}
SHIPPED_TRACES=${SHIPPED_TRACES:-traces/llamacpp-v2-train-128}
CLF=models/embedded-qwen2.5-coder-llamacpp
VLLM_CLF=${VLLM_CLF:-models/embedded-qwen2.5-coder-vllm}
OUT=${OUT:-bench/out/mtbench}
TEST_TRACES=${TEST_TRACES:-traces/llamacpp-mtbench-test-128}
STEPS=${STEPS:-collect train train-vllm compare-vllm collect-test simulate compare-llamacpp report}
mkdir -p "$OUT" runs/mtbench

for step in $STEPS; do case $step in
  collect)  # MT-Bench's train and validation questions, both turns (the test questions never), then the shipped sets
    $DISCO collect --engine llama.cpp --prompts mt-bench:train+val,mt-bench-2:train+val --max-new-tokens 128 \
      --out "$MT_TRACES" 2>&1 | tee -a "$OUT/collect-mtbench.log"
    $DISCO collect --engine llama.cpp --prompts code-train,explain-train,write-train --max-new-tokens 128 \
      --out "$SHIPPED_TRACES" 2>&1 | tee -a "$OUT/collect-shipped.log" ;;
  train)  # the shipped policy, as before (exact verification's costs) with MT-Bench's traces added
    $DISCO train --traces "$SHIPPED_TRACES" --traces "$MT_TRACES" --profile bench/llamacpp/profile-exact.json \
      --out "$CLF" --overwrite --ablate 2>&1 | tee "$OUT/train-llamacpp.log"
    git checkout -- "$CLF/README.md" "$CLF/server-tuned.json" ;;  # --overwrite replaced the folder whole
  train-vllm)  # the policy for vLLM: the same traces under vLLM's costs at one request, without the target's
    # signals (vLLM's proposer never sees them); its tuned settings for every vLLM row; what MT-Bench adds
    $PY bench/mtbench_bench.py profile-c1
    $DISCO train --traces "$SHIPPED_TRACES" --traces "$MT_TRACES" --profile bench/vllm/profile-c1.json \
      --max-window 8 --no-target-signals --out "$VLLM_CLF" --overwrite --cross-task 2>&1 | tee "$OUT/train-vllm.log" ;;
  collect-test)  # the test questions' traces: only for simulating every policy per category (never trained on)
    $DISCO collect --engine llama.cpp --prompts mt-bench:test,mt-bench-2:test --max-new-tokens 128 \
      --out "$TEST_TRACES" 2>&1 | tee -a "$OUT/collect-test.log" ;;
  simulate)
    $PY bench/mtbench_bench.py simulate "$TEST_TRACES" "$CLF" bench/llamacpp/profile-exact.json 20 \
      | tee "$OUT/simulate-llamacpp.md"
    $PY bench/mtbench_bench.py simulate "$TEST_TRACES" "$VLLM_CLF" bench/vllm/profile-c1.json 8 \
      | tee "$OUT/simulate-vllm.md"
    $PY bench/signals_in_vllm.py bench/vllm/profile-c1.json "$SHIPPED_TRACES,$MT_TRACES" "$CLF" "$VLLM_CLF" \
      | tee "$OUT/signals-in-vllm.md" ;;
  compare-llamacpp)
    $PY bench/mtbench_bench.py llamacpp "$OUT/compare-llamacpp" 2>&1 | tee "$OUT/compare-llamacpp.log" ;;
  compare-vllm)
    $PY bench/mtbench_bench.py vllm "$VLLM_CLF" "$OUT/compare-vllm" 2>&1 | tee "$OUT/compare-vllm.log" ;;
  report)
    $PY bench/mtbench_bench.py report "$OUT/compare-llamacpp/compare.json" bench/llamacpp/profile-exact.json \
      | tee "$OUT/report-llamacpp.md"
    $PY bench/mtbench_bench.py report "$OUT/compare-vllm/c1/compare.json" bench/vllm/profile-c1.json \
      | tee "$OUT/report-vllm.md" ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac; done
