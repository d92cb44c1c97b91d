"""Simulated serving at 1-64 requests (issue 45): vLLM's fixed lengths, vLLM 0.32's adaptive verification
(re-implemented: the online estimator, the stale-budget split), disco's learned budget and the oracle bound, in
lockstep on held-out traces of vLLM's draft, under a load profile extrapolated past the sizes it timed.

    python bench/vllm/adaptive/simulate.py --traces TRACES [TRACES ...] --profile bench/vllm/serve/profile-draft.json \
        --classifier models/embedded-qwen2.5-coder-vllm --prompts test --out bench/vllm/adaptive/simulated.json

--prompts test keeps the prompts whose id is in data/*-test.jsonl (never used to fit or tune); `all` keeps every one.
Extrapolation (verify_budget.extrapolated): as vLLM's own cost-table builder, the profile's step cost by
tokens and its batched draft position by batch size each continue in a straight line through their last two
profiled points (a CPU's step is compute-bound: time grows with tokens). Every row is tokens per second of the
load profile's time; ratios are to the adaptive verification row at the same concurrency.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from disco.core.cost import CostModel  # noqa: E402
from disco.policies.adaptive_verification import BatchLearnedBudget  # noqa: E402
from disco.policies.artifact import load_artifact  # noqa: E402
from disco.policies.batch_policy import BatchConstant  # noqa: E402
from disco.policies.verify_budget import extrapolated  # noqa: E402
from disco.training.simulate import prompt_traces, simulate_adaptive_verification, simulate_batched  # noqa: E402
from disco.training.train_data import load_trace_data  # noqa: E402


def test_ids(data: Path) -> set[str]:
    ids = set()
    for f in data.glob("*-test.jsonl"):
        ids |= {json.loads(line)["id"] for line in f.read_text().splitlines() if line.strip()}
    return ids


def rows(traces, load: CostModel, batch: int, k: int, adaptive_k: list[int], predict) -> dict[str, float]:
    out = {}
    fixed = {j: simulate_batched(traces, BatchConstant(j), load, batch, k).tokens_per_s for j in range(1, k + 1)}
    best = max(fixed, key=fixed.get)
    out[f"vllm fixed k (best: {best})"] = fixed[best]
    # vLLM's method drafts every request to its num_speculative_tokens: that length is tuned as the fixed one is
    adaptive = {j: simulate_adaptive_verification(traces, load, batch, j).tokens_per_s for j in adaptive_k}
    best = max(adaptive, key=adaptive.get)
    out["adaptive verification (vLLM 0.32 method)"] = adaptive[best]
    out["adaptive verification k (best)"] = best
    if predict is not None:
        out["learned budget"] = simulate_batched(traces, BatchLearnedBudget(predict, k), load, batch, k).tokens_per_s
    # the bound: each slot's confidence its label (1 accepted, 0 not) and the learned budget's draft stopping, so a
    # request drafts up to its first rejection and the batch verifies the slots that pay
    oracle = simulate_adaptive_verification(traces, load, batch, k, "oracle", stop_drafting=True)
    out["oracle bound"] = oracle.tokens_per_s
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", nargs="+", required=True)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--classifier")
    ap.add_argument("--prompts", choices=("test", "all"), default="test")
    ap.add_argument("--batches", default="1,2,4,8,16,32,64")
    ap.add_argument("--k", type=int, default=8, help="the longest draft (fixed k 1..K, learned budget, oracle)")
    ap.add_argument("--adaptive-k", default="1,2,3,4,6,8", help="vLLM's method: its best of these lengths")
    ap.add_argument("--out")
    a = ap.parse_args()
    data = load_trace_data(a.traces)
    df = data.rows
    if a.prompts == "test":
        df = df[df["prompt_id"].isin(test_ids(ROOT / "data"))]
        if df.empty:
            sys.exit("no held-out test prompts in these traces (data/*-test.jsonl ids)")
    traces = prompt_traces(df, with_hidden=False)
    batches = [int(b) for b in a.batches.split(",")]
    load = extrapolated(CostModel.load(a.profile), max(batches), a.k)
    predict = load_artifact(a.classifier).torch_predictor(torch.device("cpu")) if a.classifier else None
    result = {"traces": a.traces, "prompts": len(traces), "profile": load.source, "k": a.k, "levels": {}}
    for b in batches:
        r = rows(traces, load, b, a.k, [int(j) for j in a.adaptive_k.split(",")], predict)
        best_k = r.pop("adaptive verification k (best)")
        base = r["adaptive verification (vLLM 0.32 method)"]
        level = {name: {"tokens_per_s": v, "vs_adaptive": v / base} for name, v in r.items()}
        result["levels"][str(b)] = {**level, "adaptive_best_k": best_k}
        line = "; ".join(f"{name} {v:.2f} tok/s ({v / base:.3f}x)" for name, v in r.items())
        print(f"{b:>3} requests (adaptive k = {best_k}): {line}")
    result["created"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
