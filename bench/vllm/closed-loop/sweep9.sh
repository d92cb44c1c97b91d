#!/bin/bash
# The ninth closed-loop sweep (2026-12-05, bench/results/closed-loop.md, "2026-12-05, ninth sweep"), from the
# repository root, on a 2-core Intel Xeon with AMX: every row of issue 47 on the code test prompts at 1/2/4/8
# requests (configs-sweep9.json: target-only and, interleaved, the closed loop with no profile / this machine's
# in-process profile, bench/vllm/serve/profile-draft.json / the Zen 4's, vLLM k = 1, 2, 3 and Dynamic SD, disco as
# shipped with and without a profile), then on MT-Bench chat the closed loop's three settings against target-only
# and vLLM k = 1, 2, 3 (configs-sweep9-chat.json). sweep6.sh's commands; resumable.
# Goals: python bench/vllm/closed-loop/goals.py bench/vllm/closed-loop/{code,mtbench}-sweep9.json
SWEEP=sweep9 CODE_CONFIGS=configs-sweep9.json CHAT_CONFIGS=configs-sweep9-chat.json \
  exec bash "$(dirname "$0")/sweep6.sh"
