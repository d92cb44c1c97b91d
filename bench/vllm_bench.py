"""The vLLM benchmark of issue 23 on the embedded pair (bench/results/vllm-serving.md, "vLLM serving engine").

    python bench/vllm_bench.py tune-k  K,K,... OUT      vLLM's draft-model decoding at fixed lengths, validation prompts
    python bench/vllm_bench.py tune-policy OUT          disco's proposer: threshold grid + classifier rules, validation
    python bench/vllm_bench.py test-own K1,K8 OUT       test prompts: target-only and vLLM's fixed lengths tuned at c=1, c=8
    python bench/vllm_bench.py test-disco TAU OUT       test prompts: target-only and disco's rows (tuned threshold, classifier)
    python bench/vllm_bench.py exact OUT                float32 instead of bf16: is vLLM's verification exact then?

Every phase is one disco compare run (compare.run_compare: rows interleaved per group of prompts,
at concurrency 1 and 8) in its own process, so that only its vLLM instances hold memory: a bf16 instance of
the embedded target holds ~6 GB of anonymous memory here, disco's proposer instance ~9 GB with its 8 llama.cpp
draft contexts, so at most three instances fit in the 24 GB (the test table is two runs, each with its own
target-only reference). Validation prompts: bench/vllm_prompts.py (the shipped classifier's validation
prompts); test prompts: the first 5 of each shipped test set. Environment: OMP_NUM_THREADS=2 (vLLM otherwise
drops torch to one thread), VLLM_CPU_KVCACHE_SPACE=1.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # whole GiB (vLLM parses an int)

from disco.base.options import PairOptions  # noqa: E402
from disco.core.cost import CostModel  # noqa: E402
from disco.formats.prompts import load_prompt_sources  # noqa: E402
from disco.jobs.compare import Entry, run_compare  # noqa: E402
from disco.loop.decode import DecodeConfig  # noqa: E402
from disco.loop.pair import load_pair  # noqa: E402
from disco.policies.policy_registry import PolicySpec  # noqa: E402

ARTIFACT = "models/embedded-qwen2.5-coder-llamacpp"
PROFILE = Path("bench/out/vllm/profile.json")
VAL = "bench/out/vllm/val.jsonl"
TEST = ["code-test", "explain-test", "write-test"]
LEVELS = [1, 8]


def classifier_rows() -> list[Entry]:
    return [
        Entry(
            "classifier cost rule (load-aware)", PolicySpec("classifier", classifier=ARTIFACT, classifier_rule="cost")
        ),
        Entry(
            "classifier cost-adaptive (load-aware)",
            PolicySpec("classifier", classifier=ARTIFACT, classifier_rule="cost-adaptive"),
        ),
    ]


def main() -> None:
    phase, out = sys.argv[1], Path(sys.argv[-1])
    pair = load_pair(PairOptions(engine="vllm", dtype="float32" if phase == "exact" else "auto"))
    load = CostModel.load(PROFILE)
    if phase == "tune-k":
        lengths = [int(k) for k in sys.argv[2].split(",")]
        prompts, tokens, entries = load_prompt_sources([VAL], None), 64, []
    elif phase == "tune-policy":
        lengths = []
        prompts, tokens = load_prompt_sources([VAL], None), 64
        entries = [Entry(f"threshold {t:g}", PolicySpec("threshold", threshold=t)) for t in (0.3, 0.5, 0.7, 0.8, 0.9)]
        entries += classifier_rows()
    elif phase == "test-own":
        lengths = [int(k) for k in sys.argv[2].split(",")]
        prompts, tokens, entries = load_prompt_sources(TEST, 5), 128, []
    elif phase == "test-disco":
        lengths, tau = [], float(sys.argv[2])
        prompts, tokens = load_prompt_sources(TEST, 5), 128
        entries = [Entry(f"threshold {tau:g} (tuned)", PolicySpec("threshold", threshold=tau)), *classifier_rows()]
    elif phase == "exact":
        lengths = [3]
        prompts, tokens = load_prompt_sources([VAL], None)[::2], 64
        entries = []  # memory: two float32 instances (6.6 GB each) are what fits beside the rest
    else:
        raise SystemExit(__doc__)
    config = DecodeConfig(max_new_tokens=tokens, max_window=8)
    # test: the lengths tuned on the validation prompts at 1 and at 8 requests (tune-k), in that order
    tags = [" (tuned at c=1)", " (tuned at c=8)"] if phase == "test-own" else [""] * len(lengths)
    settings = {"fixed_k": [(k, tag) for k, tag in zip(lengths, tags)]}
    result = run_compare(pair, prompts, entries, config, out, concurrency=LEVELS, settings=settings, load=load)
    from disco.jobs.compare import format_table

    for c, r in result["concurrency"].items():
        print(f"\n{c} request(s) at a time, {len(prompts)} prompts x {tokens} tokens:\n" + format_table(r["summary"]))
        for label, s in r["summary"].items():
            if "decide_ms_per_draft" in s:
                print(
                    f"  {label}: deciding {s['decide_ms_per_draft']:.3f} ms, drafting {s['draft_ms_per_draft']:.3f} ms per draft token"
                )


if __name__ == "__main__":
    main()
