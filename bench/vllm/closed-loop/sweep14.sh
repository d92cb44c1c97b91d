#!/bin/bash
# The fourteenth closed-loop sweep (2026-12-07, bench/results/closed-loop.md, "2026-12-07, fourteenth sweep"), from
# the repository root, on the 2-core AMD EPYC Zen 4: the cost table's kept bump fitted apart (target-only at 4
# requests priced as timed), A/B against the code before (2b18248, a worktree in /tmp/disco-2b18248 imported first:
# configs-sweep14-chat.json) on MT-Bench chat at 4 and 8 requests: target-only, the closed loop with no profile,
# vLLM k = 1, the closed loop at 2b18248, interleaved; RUN=b a second pass (its own outputs). Resumable.
[ -d /tmp/disco-2b18248 ] || git worktree add -q /tmp/disco-2b18248 2b18248
SWEEP=sweep14${RUN:+$RUN} SETS=mtbench LEVELS=${LEVELS:-4,8} CHAT_CONFIGS=configs-sweep14-chat.json \
  exec bash "$(dirname "$0")/sweep6.sh"
