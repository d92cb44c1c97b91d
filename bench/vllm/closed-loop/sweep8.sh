#!/bin/bash
# The eighth closed-loop sweep (2026-12-05, bench/results/closed-loop.md, "2026-12-05, eighth sweep"), from the
# repository root, on a 2-core Intel Xeon with AMX, after the stale-rejoin fix (a batch whose every request missed
# the draft's pass keeps it skipped): the cell the fix was made for (MT-Bench chat at 8 requests, where the seventh
# sweep's loop spent 75 % of its time on stale rejoins) and the rows it is judged against: target-only and,
# interleaved, the closed loop with no profile and vLLM k = 1 (configs-sweep8-chat.json: the chat set's best fixed
# length at 2-8 requests in the seventh sweep). CODE=1 LEVELS=4,8 adds the code rows (configs-sweep8.json: the
# closed loop with no profile, vLLM k = 2 and 1) at 4 and 8 requests. Commands as sweep6.sh's; resumable.
# Goals: python bench/vllm/closed-loop/goals.py bench/vllm/closed-loop/mtbench-sweep8.json
E=~/.cache/disco/embedded
PY=${PY:-.venv/bin/python}
LEVELS=${LEVELS:-8}
sets=mtbench:mtbench-chat-8:configs-sweep8-chat.json
[ -n "${CODE:-}" ] && sets="code:code-test-8:configs-sweep8.json $sets"
for set in $sets; do
  IFS=: read -r name file configs <<< "$set"
  $PY bench/serve_sweep.py run --target $E/qwen2.5-coder-1.5b-instruct --draft $E/qwen2.5-coder-0.5b-instruct \
    --prompts bench/vllm/closed-loop/$file.jsonl --num-prompts 8 --output-len 128 --concurrency "$LEVELS" \
    --configs target-only --config-file bench/vllm/closed-loop/$configs \
    --out bench/vllm/closed-loop/$name-sweep8.json
done
