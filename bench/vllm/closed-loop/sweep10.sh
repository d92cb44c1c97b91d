#!/bin/bash
# The tenth closed-loop sweep (2026-12-06, bench/results/closed-loop.md, "2026-12-06, tenth sweep"), from the
# repository root, on the 2-core AMD EPYC Zen 4: the governor's measured speeds at the machine's pace (9809819) and
# the pass kept for new requests in an off step at another band (6175f95) on MT-Bench chat, where the ninth sweep's
# closed loop lost most (4 requests: k = 0 after a shared slowdown; 8: every request stale from its prefill), at 4
# then 8 requests (LEVELS; run at 1, 2, 4 and 8) in one server: target-only, the closed loop with no profile, vLLM's best fixed length there (k = 1)
# (configs-sweep10-chat.json).
# sweep6.sh's commands; resumable.
# Goals: python bench/vllm/closed-loop/goals.py bench/vllm/closed-loop/mtbench-sweep10.json
SWEEP=sweep10 SETS=mtbench LEVELS=${LEVELS:-1,2,4,8} CHAT_CONFIGS=configs-sweep10-chat.json \
  exec bash "$(dirname "$0")/sweep6.sh"
