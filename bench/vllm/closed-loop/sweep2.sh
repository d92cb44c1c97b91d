#!/bin/bash
# The second closed-loop sweep (2026-12-03, bench/results/closed-loop.md, "2026-12-03, second sweep"), from the
# repository root: every configuration of configs-sweep2.json after target-only, one server each.
E=~/.cache/disco/embedded
.venv/bin/python bench/serve_sweep.py run --target $E/qwen2.5-coder-1.5b-instruct --draft $E/qwen2.5-coder-0.5b-instruct \
  --prompts bench/vllm/closed-loop/code-test-8.jsonl --num-prompts 8 --output-len 32 --concurrency 1,2,4,8 \
  --configs target-only --config-file bench/vllm/closed-loop/configs-sweep2.json --out bench/vllm/closed-loop/code-sweep2.json
