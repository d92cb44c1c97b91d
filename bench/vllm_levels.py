"""disco's load-aware classifier against vLLM target-only at 2 and 4 concurrent requests, on the test prompts
of bench/vllm_bench.py (15 x 128 tokens): where the cost rule stops drafting
(bench/results/vllm-serving.md, "vLLM serving engine"). Usage: python bench/vllm_levels.py OUT"""

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
from pathlib import Path  # noqa: E402

from disco.base.options import PairOptions  # noqa: E402
from disco.core.cost import CostModel  # noqa: E402
from disco.formats.prompts import load_prompt_sources  # noqa: E402
from disco.jobs.compare import Entry, format_table, run_compare  # noqa: E402
from disco.loop.decode import DecodeConfig  # noqa: E402
from disco.loop.pair import load_pair  # noqa: E402
from disco.policies.policy_registry import PolicySpec  # noqa: E402

ARTIFACT = "models/embedded-qwen2.5-coder-llamacpp"
pair = load_pair(PairOptions(engine="vllm"))
prompts = load_prompt_sources(["code-test", "explain-test", "write-test"], 5)
entries = [
    Entry("classifier cost rule (load-aware)", PolicySpec("classifier", classifier=ARTIFACT, classifier_rule="cost"))
]
load = CostModel.load("bench/out/vllm/profile.json")
config = DecodeConfig(max_new_tokens=128, max_window=8)
result = run_compare(
    pair,
    prompts,
    entries,
    config,
    Path(sys.argv[1]),
    concurrency=[2, 4],
    settings={"fixed_k": []},
    load=load,
    progress=False,
)
for c, r in result["concurrency"].items():
    print(f"\n{c} requests at a time:\n" + format_table(r["summary"]))
