#!/bin/bash
# The eighteenth closed-loop sweep (2026-12-07, bench/results/closed-loop.md, "2026-12-07, eighteenth sweep"), from
# the repository root, on the 2-core AMD EPYC Zen 4 (family 25 model 17) the issue was filed on, the code as it
# stands: target-only and, interleaved, the closed loop with no profile, vLLM k = 2 and 3 (code) or 1 and 2 (chat),
# and the closed loop seeded with the Xeon's in-process profile (another machine's: the wrong seed)
# (configs-sweep18-code.json, configs-sweep18-chat.json), 8 test prompts x 128 tokens: code at 1 / 2 / 8 requests
# and MT-Bench chat at 2, the cells no sweep had measured on this machine with the governor of the sixteenth
# sweep. Resumable; RUN=b names a second pass; CODE_LEVELS, CHAT_LEVELS other levels.
set -e
here=$(dirname "$0")
SWEEP=sweep18${RUN:+$RUN} SETS=code LEVELS=${CODE_LEVELS:-1,2,8} CODE_CONFIGS=configs-sweep18-code.json \
  bash "$here/sweep6.sh"
SWEEP=sweep18${RUN:+$RUN} SETS=mtbench LEVELS=${CHAT_LEVELS:-2} CHAT_CONFIGS=configs-sweep18-chat.json \
  bash "$here/sweep6.sh"
