#!/bin/bash
# The seventh closed-loop sweep (2026-12-04, bench/results/closed-loop.md, "2026-12-04, seventh sweep"), from the
# repository root, on the 2-core AMD EPYC Zen 4 the issue was filed on, after the governor's third fix (a band's
# lengths not yet run are believed at the shortfall its run ones measured), with the sixth sweep's rows: target-only and,
# interleaved, the closed loop with no profile / this machine's in-process profile / an AVX2 EPYC's and vLLM k = 3,
# 2, 1 (configs-sweep6.json) on the code test prompts; then target-only, the closed loop with no profile and with
# the AVX2 EPYC's and vLLM k = 3 and 1 (the chat set's best lengths in the fifth sweep: configs-sweep6-chat.json) on
# MT-Bench chat. One server per row, 1/2/4/8 requests, 8 prompts x 128 tokens. Resumable (serve_sweep.py run).
# The rows and commands are sweep6.sh's, with outputs named sweep7.
# Goals: python bench/vllm/closed-loop/goals.py bench/vllm/closed-loop/{code,mtbench}-sweep7.json
SWEEP=sweep7 exec bash "$(dirname "$0")/sweep6.sh"
