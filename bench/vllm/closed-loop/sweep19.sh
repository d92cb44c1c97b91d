#!/bin/bash
# The nineteenth closed-loop sweep (2026-12-08, bench/results/closed-loop.md, "2026-12-08, nineteenth sweep"), from
# the repository root, on the 2-core AMD EPYC Zen 4 (family 25 model 17) the issue was filed on, the code as it
# stands: every row issue 47 asks for, interleaved, one server each (configs-sweep19.json, after target-only): the
# closed loop with no profile, vLLM k = 3, the closed loop seeded with this machine kind's in-process profile
# (bench/vllm/serve/profile-draft-zen4.json, the fifth sweep's), vLLM k = 2, the closed loop seeded with the Xeon's
# (another machine's: the wrong seed), vLLM k = 1, disco as shipped with that in-process profile, vLLM's
# Dynamic SD as tuned on validation, disco as shipped with no profile, target-only again (the drift check); 8 code
# test prompts x 128 tokens at 1 / 2 / 4 / 8 requests (the fifth sweep's rows and order, with the Xeon's seed as in
# the eighteenth). Resumable; RUN=b names a second pass; SETS=mtbench the chat set, LEVELS other levels.
set -e
here=$(dirname "$0")
SWEEP=sweep19${RUN:+$RUN} SETS=${SETS:-code} LEVELS=${LEVELS:-1,2,4,8} CODE_CONFIGS=configs-sweep19.json \
  CHAT_CONFIGS=configs-sweep19.json bash "$here/sweep6.sh"
