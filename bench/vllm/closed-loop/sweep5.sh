#!/bin/bash
# The fifth closed-loop sweep (2026-12-04, bench/results/closed-loop.md, "2026-12-04, fifth sweep"), from the
# repository root, on the 2-core AMD EPYC Zen 4 the issue was filed on: every row issue 47 asks for, one server
# each, at 1, 2, 4 and 8 requests, 8 test prompts x 128 tokens, on the code test prompts and on MT-Bench chat.
# As run: vLLM's rows first (target-only, then configs-sweep5-vllm.json: k = 3, 2, 1 and Dynamic SD as tuned on
# validation, [[1,3,3],[4,256,2]]), both sets; then disco's rows with the final code (configs-sweep5-disco.json:
# the closed loop with no profile, seeded with this machine's in-process profile (profile-draft-zen4.json), seeded
# with an AVX2 EPYC's (profile-draft-amd-avx2.json), disco as shipped with this machine's profile and with none)
# and target-only again (the drift check), both sets. (configs-sweep5.json holds all of them interleaved, the
# order of the first two, stopped, runs.) Each disco server logs its loop (DISCO_CLOSED_LOOP_LOG) beside the raw
# files. The third run (the tables that count, after the second run's files were lost) ran every row in one pass
# per set instead: --configs target-only --config-file bench/vllm/closed-loop/configs-sweep5.json (interleaved).
# Goals: python bench/vllm/closed-loop/goals.py bench/vllm/closed-loop/{code,mtbench}-sweep5.json
E=~/.cache/disco/embedded
PY=${PY:-.venv/bin/python}
for part in "target-only:configs-sweep5-vllm.json" ":configs-sweep5-disco.json"; do
  for set in code:code-test-8 mtbench:mtbench-chat-8; do
    name=${set%%:*}; file=${set#*:}
    $PY bench/serve_sweep.py run --target $E/qwen2.5-coder-1.5b-instruct --draft $E/qwen2.5-coder-0.5b-instruct \
      --prompts bench/vllm/closed-loop/$file.jsonl --num-prompts 8 --output-len 128 --concurrency 1,2,4,8 \
      --configs "${part%%:*}" --config-file bench/vllm/closed-loop/${part#*:} \
      --out bench/vllm/closed-loop/$name-sweep5.json
  done
done
