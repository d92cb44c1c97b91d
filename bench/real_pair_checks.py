"""Two checks on the real pair that need model runs (issues 4 and 5), one model load:

1. collection cost: per prompt, plain target-only generation of y vs `disco collect`'s work for the
   same prompt (speculative generation of y + teacher-forced forwards + features), interleaved
   so that machine drift hits both alike; the median ratio per prompt.
2. simulated vs real counts: on prompts of a trace, each policy run for real through
   speculative_generate and replayed by the simulator over the trace rows; target and draft
   forwards compared (error in %).

Run: .venv/bin/python bench/real_pair_checks.py --traces traces/embedded-train-128 \
        --classifier models/embedded-qwen2.5-coder --prompts 3 --json bench/embedded/real-checks.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from disco.base.options import PairOptions
from disco.formats.prompts import load_prompt_sources
from disco.formats.trace import read_traces
from disco.jobs.collect import trace_prompt
from disco.loop.decode import DecodeConfig, speculative_generate, target_generate
from disco.loop.pair import load_pair
from disco.policies.artifact import load_artifact
from disco.policies.classifier import ClassifierPolicy
from disco.training.simulate import prompt_traces, replay_policy, simulate_many


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", required=True, help="trace folder of the embedded pair (disco collect)")
    ap.add_argument("--classifier", required=True, help="artifact folder (disco train)")
    ap.add_argument("--prompts", type=int, default=3, help="prompts of the trace to check (one per task first)")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()

    src = read_traces([args.traces])[0]
    manifest = src.manifest
    config = DecodeConfig(
        max_new_tokens=manifest["generation"]["max_new_tokens"], max_window=manifest["generation"]["max_window"]
    )
    chat = manifest["generation"]["chat"]
    traced = {tr.prompt_id: tr for tr in prompt_traces(src.rows, config.max_new_tokens)}
    # the prompts behind the trace, one per task in turn (the collector's own order)
    texts = {p.id: p for p in load_prompt_sources(manifest["prompts"]["sources"], None)}
    ids = list(dict.fromkeys(src.rows["prompt_id"]))[: args.prompts]

    pair = load_pair(PairOptions(engine="torch"))
    art = load_artifact(args.classifier, expect_pair=pair)
    tuned = art.manifest["tuned"]
    policies = {
        "threshold (tuned)": (lambda: replay_policy("threshold", threshold=tuned["threshold"])),
        "constant (tuned)": (lambda: replay_policy("constant", k=tuned["k"])),
        "classifier": (lambda: lambda tr: ClassifierPolicy(art, art.setting)),
    }
    table = pair.token_classes()
    out = {"prompts": ids, "max_new_tokens": config.max_new_tokens, "collect": [], "counts": []}
    for pid in ids:
        prompt_ids = pair.encode(texts[pid].prompt, chat)
        # 1. collection vs plain generation, same prompt, back to back
        t0 = time.perf_counter()
        plain = target_generate(pair.target, prompt_ids, config, pair.eos_token_ids).tokens
        t1 = time.perf_counter()
        y = trace_prompt(pair, prompt_ids, config, table, pid, texts[pid].task)["target_token"].to_pylist()
        t2 = time.perf_counter()
        out["collect"].append(
            {
                "prompt": pid,
                "plain_s": t1 - t0,
                "collect_s": t2 - t1,
                "ratio": (t2 - t1) / (t1 - t0),
                "same_y": plain == y,
            }
        )
        print(
            f"{pid}: plain {t1 - t0:.1f}s, collect {t2 - t1:.1f}s (x{(t2 - t1) / (t1 - t0):.2f}), same y: {plain == y}",
            flush=True,
        )
        # 2. real vs simulated counts
        tr = traced[pid]
        sims = simulate_many([tr], {name: make() for name, make in policies.items()}, config.max_window)
        for name, make in policies.items():
            policy = make()(tr) if name != "classifier" else ClassifierPolicy.for_pair(art, pair)
            real = speculative_generate(pair.target, pair.draft, prompt_ids, policy, config, pair.eos_token_ids).stats
            sim = sims[name].totals
            row = {
                "prompt": pid,
                "policy": name,
                "real_target": real.target_forwards,
                "sim_target": sim.target_forwards,
                "real_draft": real.draft_forwards,
                "sim_draft": sim.draft_forwards,
                "approx_drafts": sims[name].approx_drafts,
            }
            out["counts"].append(row)
            print(
                f"  {name}: target forwards real {real.target_forwards} / sim {sim.target_forwards}, "
                f"draft forwards real {real.draft_forwards} / sim {sim.draft_forwards}",
                flush=True,
            )

    out["collect_ratio_median"] = statistics.median(r["ratio"] for r in out["collect"])
    for name in policies:
        rows = [r for r in out["counts"] if r["policy"] == name]
        rt, st = sum(r["real_target"] for r in rows), sum(r["sim_target"] for r in rows)
        rd, sd = sum(r["real_draft"] for r in rows), sum(r["sim_draft"] for r in rows)
        out.setdefault("error_pct", {})[name] = {"target": 100 * (st - rt) / rt, "draft": 100 * (sd - rd) / rd}
    print(json.dumps({"collect_ratio_median": out["collect_ratio_median"], "error_pct": out["error_pct"]}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
