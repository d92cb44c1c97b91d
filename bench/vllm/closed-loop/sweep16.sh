#!/bin/bash
# The sixteenth closed-loop sweep (2026-12-07, bench/results/closed-loop.md, "2026-12-07, sixteenth sweep"), from the
# repository root, on the 2-core AMD EPYC Zen 4: a policy spell judged on its steps at a new band alone, a band's
# warm-up probes believed as its lengths' measurements, a trial cut short where it runs clearly below k = 0; A/B
# against 85d5736 (a worktree in /tmp/disco-85d5736 imported first: configs-sweep16-chat.json) on MT-Bench chat at 4
# and 8 requests: target-only, the closed loop with no profile, the closed loop at 85d5736, interleaved; RUN=b a
# second pass; SETS=code LEVELS=1,4 the same rows on the code test prompts (where drafting pays). Resumable.
[ -d /tmp/disco-85d5736 ] || git worktree add -q /tmp/disco-85d5736 85d5736
SWEEP=sweep16${RUN:+$RUN} SETS=${SETS:-mtbench} LEVELS=${LEVELS:-4,8} CHAT_CONFIGS=configs-sweep16-chat.json \
  CODE_CONFIGS=configs-sweep16-chat.json \
  exec bash "$(dirname "$0")/sweep6.sh"
