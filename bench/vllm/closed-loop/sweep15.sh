#!/bin/bash
# The fifteenth closed-loop sweep (2026-12-07, bench/results/closed-loop.md, "2026-12-07, fifteenth sweep"), from the
# repository root, on the 2-core AMD EPYC Zen 4: target-only's step timed at its own batch (a band's k = 0 probes,
# online_costs' plain table) and a measured bump kept short of a full window, A/B against 2b18248 (a worktree in
# /tmp/disco-2b18248 imported first: configs-sweep15-chat.json) on MT-Bench chat at 4 and 8 requests: target-only,
# the closed loop with no profile, the closed loop at 2b18248, interleaved; RUN=b a second pass. Resumable.
[ -d /tmp/disco-2b18248 ] || git worktree add -q /tmp/disco-2b18248 2b18248
SWEEP=sweep15${RUN:+$RUN} SETS=mtbench LEVELS=${LEVELS:-4,8} CHAT_CONFIGS=configs-sweep15-chat.json \
  exec bash "$(dirname "$0")/sweep6.sh"
