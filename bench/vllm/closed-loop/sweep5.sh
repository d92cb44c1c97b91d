#!/bin/bash
# The fifth closed-loop sweep (2026-12-04, bench/results/closed-loop.md, "2026-12-04, fifth sweep"), from the
# repository root, on the 2-core AMD EPYC Zen 4 the issue was filed on: every row issue 47 asks for, one server
# each, at 1, 2, 4 and 8 requests, 8 test prompts x 128 tokens, on the code test prompts and then on MT-Bench chat:
# target-only, then configs-sweep5.json interleaved (disco's closed loop with no profile, vLLM k = 3, the closed loop
# seeded with this machine's in-process profile (profile-draft-zen4.json), k = 2, the closed loop seeded with an AVX2
# EPYC's (profile-draft-amd-avx2.json), k = 1, disco as shipped with this machine's profile, vLLM's Dynamic SD as
# tuned on validation ([[1,3,3],[4,256,2]]), disco as shipped with no profile). Each disco server logs its loop
# (DISCO_CLOSED_LOOP_LOG) beside the raw files. Goals:
# python bench/vllm/closed-loop/goals.py bench/vllm/closed-loop/{code,mtbench}-sweep5.json
E=~/.cache/disco/embedded
PY=${PY:-.venv/bin/python}
for set in code:code-test-8 mtbench:mtbench-chat-8; do
  name=${set%%:*}; file=${set#*:}
  $PY bench/serve_sweep.py run --target $E/qwen2.5-coder-1.5b-instruct --draft $E/qwen2.5-coder-0.5b-instruct \
    --prompts bench/vllm/closed-loop/$file.jsonl --num-prompts 8 --output-len 128 --concurrency 1,2,4,8 \
    --configs target-only --config-file bench/vllm/closed-loop/configs-sweep5.json \
    --out bench/vllm/closed-loop/$name-sweep5.json
done
