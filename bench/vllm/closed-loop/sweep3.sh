#!/bin/bash
# The third closed-loop sweep (2026-12-03, bench/results/closed-loop.md, "2026-12-03, third sweep"), from the
# repository root: target-only, then every configuration of configs-sweep2.json (its last row: target-only again,
# the drift check), one server each, on the code test prompts and then on MT-Bench chat. Goals:
# python bench/vllm/closed-loop/goals.py bench/vllm/closed-loop/{code,mtbench}-sweep3.json
E=~/.cache/disco/embedded
for set in code:code-test-8 mtbench:mtbench-chat-8; do
  name=${set%%:*}; file=${set#*:}
  .venv/bin/python bench/serve_sweep.py run --target $E/qwen2.5-coder-1.5b-instruct --draft $E/qwen2.5-coder-0.5b-instruct \
    --prompts bench/vllm/closed-loop/$file.jsonl --num-prompts 8 --output-len 32 --concurrency 1,2,4,8 \
    --configs target-only --config-file bench/vllm/closed-loop/configs-sweep2.json --out bench/vllm/closed-loop/$name-sweep3.json
done
