#!/bin/bash
# The seventeenth closed-loop sweep (2026-12-07, bench/results/closed-loop.md, "2026-12-07, seventeenth sweep"), from
# the repository root, on a 2-core AMD EPYC Zen 5 (family 26) no earlier sweep ran on: target-only and, interleaved,
# the closed loop with no profile, vLLM k = 2 and the closed loop seeded with the Zen 4's profile (a wrong seed:
# another machine) (configs-sweep17.json), on the code test prompts and MT-Bench chat at 1 and 4 requests, 8 prompts
# x 128 tokens. Resumable; RUN=b names a second pass, RUN=c8 LEVELS=8 the eight-request pass.
SWEEP=sweep17${RUN:+$RUN} SETS=${SETS:-code mtbench} LEVELS=${LEVELS:-1,4} CODE_CONFIGS=configs-sweep17.json \
  CHAT_CONFIGS=configs-sweep17.json exec bash "$(dirname "$0")/sweep6.sh"
