#!/bin/bash
# The eleventh closed-loop sweep (2026-12-06, bench/results/closed-loop.md, "2026-12-06, eleventh sweep"), from the
# repository root, on the 2-core AMD EPYC Zen 4: the cost table that keeps a measured bump (a bucket timed a full
# window keeps its own estimate where the monotone fit moves it more than ONLINE_COST_BUMP) on MT-Bench chat at 1
# and 4 requests, the closed loop with no profile against vLLM k = 1 (configs-sweep10-chat.json), no target-only
# row (the tenth sweep's, an hour earlier, is the reference). Resumable.
E=~/.cache/disco/embedded
PY=${PY:-.venv/bin/python}
$PY bench/serve_sweep.py run --target $E/qwen2.5-coder-1.5b-instruct --draft $E/qwen2.5-coder-0.5b-instruct \
  --prompts bench/vllm/closed-loop/mtbench-chat-8.jsonl --num-prompts 8 --output-len 128 --concurrency ${LEVELS:-1,4} \
  --configs "" --config-file bench/vllm/closed-loop/configs-sweep10-chat.json \
  --out bench/vllm/closed-loop/mtbench-sweep11.json
