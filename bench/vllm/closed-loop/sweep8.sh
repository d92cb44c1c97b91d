#!/bin/bash
# The eighth closed-loop sweep (2026-12-05, bench/results/closed-loop.md, "2026-12-05, eighth sweep"), from the
# repository root, on a 2-core Intel Xeon with AMX, after the stale-rejoin fix (a batch whose every request missed
# the draft's pass keeps it skipped): the cell the fix was made for (MT-Bench chat at 8 requests, where the seventh
# sweep's loop spent 75 % of its time on stale rejoins) and the rows it is judged against: target-only and,
# interleaved, the closed loop with no profile and vLLM k = 1 (configs-sweep8-chat.json: the chat set's best fixed
# length at 2-8 requests in the seventh sweep). SETS="code mtbench" LEVELS=4,8 adds the code rows
# (configs-sweep8.json: the closed loop with no profile, vLLM k = 2 and 1) at 4 and 8 requests. sweep6.sh's
# commands; resumable.
# Goals: python bench/vllm/closed-loop/goals.py bench/vllm/closed-loop/mtbench-sweep8.json
SWEEP=sweep8 SETS=${SETS:-mtbench} LEVELS=${LEVELS:-8} CODE_CONFIGS=configs-sweep8.json \
  CHAT_CONFIGS=configs-sweep8-chat.json exec bash "$(dirname "$0")/sweep6.sh"
