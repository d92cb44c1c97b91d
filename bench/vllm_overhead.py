"""A never-drafting disco proposer inside vLLM against vLLM target-only, 16 prompts x 64 tokens at 8 requests:
what vLLM's speculative path costs when nothing is proposed (bench/results/vllm-serving.md, "vLLM serving engine").
Usage: python bench/vllm_overhead.py  (after bench/vllm_prompts.py bench/out/vllm/val.jsonl 3 8)."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
from pathlib import Path

from disco.base.options import PairOptions
from disco.formats.prompts import load_prompt_sources
from disco.jobs.compare import Entry, format_tables, run_compare
from disco.loop.decode import DecodeConfig
from disco.loop.pair import load_pair
from disco.policies.policy_registry import PolicySpec

pair = load_pair(PairOptions(engine="vllm"))
prompts = (
    load_prompt_sources(["bench/out/vllm/val.jsonl"], None)
    + load_prompt_sources(["code-test"], 5)[:5]
    + load_prompt_sources(["explain-test"], 3)
)
entries = [Entry("proposer that never drafts", PolicySpec("target"))]
r = run_compare(
    pair,
    prompts,
    entries,
    DecodeConfig(max_new_tokens=64, max_window=8),
    Path("bench/out/vllm/overhead"),
    concurrency=[8],
    settings={"fixed_k": []},
    progress=False,
)
print(len(prompts), "prompts x 64 tokens at 8 requests\n" + format_tables(r["concurrency"][8]))
