#!/bin/bash
# The thirteenth closed-loop sweep (2026-12-07, bench/results/closed-loop.md, "2026-12-07, thirteenth sweep"), from
# the repository root, on the 2-core AMD EPYC Zen 4: k = 0 holding unjudged at its band and above, a level's tail no
# band, a trial judged from a quarter window, A/B against the code before (48e60c3, a worktree in
# /tmp/disco-48e60c3 imported first: configs-sweep13-chat.json) on MT-Bench chat at 4 and 8 requests (the twelfth
# sweep's misses): target-only, the closed loop with no profile, vLLM k = 1, the closed loop at 48e60c3,
# interleaved; RUN=b a second pass (its own outputs) for two runs a row. Resumable.
[ -d /tmp/disco-48e60c3 ] || git worktree add -q /tmp/disco-48e60c3 48e60c3
SWEEP=sweep13${RUN:+$RUN} SETS=mtbench LEVELS=${LEVELS:-4,8} CHAT_CONFIGS=configs-sweep13-chat.json \
  exec bash "$(dirname "$0")/sweep6.sh"
