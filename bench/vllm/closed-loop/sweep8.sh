#!/bin/bash
# The eighth closed-loop sweep (2026-12-05, bench/results/closed-loop.md, "2026-12-05, eighth sweep"), from the
# repository root, on a 2-core Intel Xeon with AMX (the machine bench/vllm/serve/profile-draft.json was measured on
# is of this model), after the stale-rejoin fix (a batch whose every request missed the draft's pass keeps it
# skipped): sweep6.sh's rows with the profiles renamed for this machine: target-only and, interleaved, the closed
# loop with no profile / this machine's in-process profile (settings-closed-xeon.json) / a Zen 4's and vLLM k = 3,
# 2, 1 (configs-sweep8.json) on the code test prompts; then target-only, the closed loop with no profile and with
# the Zen 4's and vLLM k = 3 and 1 (configs-sweep8-chat.json) on MT-Bench chat. Resumable (serve_sweep.py run).
# Goals: python bench/vllm/closed-loop/goals.py bench/vllm/closed-loop/{code,mtbench}-sweep8.json
SWEEP=sweep8 CODE_CONFIGS=configs-sweep8.json CHAT_CONFIGS=configs-sweep8-chat.json exec bash "$(dirname "$0")/sweep6.sh"
