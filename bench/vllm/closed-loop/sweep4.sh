#!/bin/bash
# The fourth closed-loop sweep (2026-12-03, bench/results/closed-loop.md, "2026-12-03, fourth sweep"), from the
# repository root: 128 tokens a request (the third sweep's 32 measured mostly the loop's warm-up), target-only, then
# every configuration of configs-sweep4.json (the closed loop with no / this machine's in-process / another
# machine's profile, interleaved with vLLM's k = 2, 1 and 3), one server each, at 1, 4 and 8 requests,
# on the code test prompts and then on MT-Bench chat. Each disco server logs its closed loop's steps
# (DISCO_CLOSED_LOOP_LOG) beside the sweep's raw files. Goals:
# python bench/vllm/closed-loop/goals.py bench/vllm/closed-loop/{code,mtbench}-sweep4.json
E=~/.cache/disco/embedded
for set in code:code-test-8 mtbench:mtbench-chat-8; do
  name=${set%%:*}; file=${set#*:}
  .venv/bin/python bench/serve_sweep.py run --target $E/qwen2.5-coder-1.5b-instruct --draft $E/qwen2.5-coder-0.5b-instruct \
    --prompts bench/vllm/closed-loop/$file.jsonl --num-prompts 8 --output-len 128 --concurrency 1,4,8 \
    --configs target-only --config-file bench/vllm/closed-loop/configs-sweep4.json \
    --out bench/vllm/closed-loop/$name-sweep4.json
done
