#!/usr/bin/env bash
# The measurements behind bench/RESULTS.md "MT-Bench" (issue 24): MT-Bench train traces (both turns) beside the
# shipped sets', the shipped llama.cpp policy retrained on both, the same traces trained under vLLM's costs at
# one request (tuned settings for the vLLM rows, and the cross-task report of what MT-Bench adds), then compare
# on the 32 MT-Bench test prompts (16 questions x 2 turns) x 128 tokens on llama.cpp and on vLLM.
# 2-core CPU: collect ~12 min (MT-Bench, incl. answering 64 first turns) + ~25 min (273 shipped prompts),
# training ~2 + ~4 min, llama.cpp compare ~30 min, vLLM compare ~45 min. One heavy step at a time; every step
# resumes (collect) or is quick to redo.
set -euo pipefail
cd "$(dirname "$0")/.."
DISCO=${DISCO:-.venv/bin/disco}
PY=${PY:-.venv/bin/python}
MT_TRACES=${MT_TRACES:-traces/llamacpp-mtbench-trainval-128}
SHIPPED_TRACES=${SHIPPED_TRACES:-traces/llamacpp-v2-train-128}
CLF=models/embedded-qwen2.5-coder-llamacpp
VLLM_CLF=${VLLM_CLF:-models/embedded-qwen2.5-coder-vllm}
OUT=${OUT:-bench/out/mtbench}
STEPS=${STEPS:-collect train train-vllm compare-llamacpp compare-vllm report}
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
