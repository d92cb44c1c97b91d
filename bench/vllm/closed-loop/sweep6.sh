#!/bin/bash
# The sixth closed-loop sweep (2026-12-04, bench/results/closed-loop.md, "2026-12-04, sixth sweep"), from the
# repository root, on the 2-core AMD EPYC Zen 4 the issue was filed on, after two governor fixes (a step decided
# under the last mode judges no spell; k = 0 is left only at a hold's end or on a band change): target-only and,
# interleaved, the closed loop with no profile / this machine's in-process profile / an AVX2 EPYC's and vLLM k = 3,
# 2, 1 (configs-sweep6.json) on the code test prompts; then target-only, the closed loop with no profile and with
# the AVX2 EPYC's and vLLM k = 3 and 1 (the chat set's best lengths in the fifth sweep: configs-sweep6-chat.json) on
# MT-Bench chat. One server per row, 1/2/4/8 requests, 8 prompts x 128 tokens. Resumable (serve_sweep.py run).
# Goals: python bench/vllm/closed-loop/goals.py bench/vllm/closed-loop/{code,mtbench}-sweep6.json
# SWEEP=sweep7 names the outputs of a rerun of these rows (sweep7.sh); SETS (code, mtbench or both), CODE_CONFIGS,
# CHAT_CONFIGS and LEVELS other prompt sets, rows and levels (sweep8.sh).
SWEEP=${SWEEP:-sweep6}
SETS=${SETS:-code mtbench}
CODE_CONFIGS=${CODE_CONFIGS:-configs-sweep6.json}
CHAT_CONFIGS=${CHAT_CONFIGS:-configs-sweep6-chat.json}
declare -A ROWS=([code]=code-test-8:$CODE_CONFIGS [mtbench]=mtbench-chat-8:$CHAT_CONFIGS)
E=~/.cache/disco/embedded
PY=${PY:-.venv/bin/python}
for name in $SETS; do
  IFS=: read -r file configs <<< "${ROWS[$name]}"
  $PY bench/serve_sweep.py run --target $E/qwen2.5-coder-1.5b-instruct --draft $E/qwen2.5-coder-0.5b-instruct \
    --prompts bench/vllm/closed-loop/$file.jsonl --num-prompts 8 --output-len 128 --concurrency ${LEVELS:-1,2,4,8} \
    --configs target-only --config-file bench/vllm/closed-loop/$configs \
    --out bench/vllm/closed-loop/$name-$SWEEP.json
done
