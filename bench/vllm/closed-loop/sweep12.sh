#!/bin/bash
# The twelfth closed-loop sweep (2026-12-07, bench/results/closed-loop.md, "2026-12-07, twelfth sweep"), from the
# repository root, on the 2-core AMD EPYC Zen 4: a step's first draft position timed (c_first) and k = 0 replacing a
# drafting mode with no margin, on MT-Bench chat at 2, 4 and 8 requests (where the tenth sweep missed its goals):
# target-only, the closed loop with no profile, vLLM k = 1 (configs-sweep10-chat.json), interleaved. Resumable.
SWEEP=sweep12 SETS=mtbench LEVELS=${LEVELS:-2,4,8} CHAT_CONFIGS=configs-sweep10-chat.json \
  exec bash "$(dirname "$0")/sweep6.sh"
