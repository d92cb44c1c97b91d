"""Simulated vs live speedups on the same prompts: checks the simulator (and, under sampling, the
teacher-forced approximation of sampled traces, collect.coupled_draft) against a `disco compare` run.

Traces of the compare run's own prompts (`disco collect` with the same settings) are replayed for
every disco row of compare.json whose policy the simulator can build; each row's live cost-model
speedup (its forward counts under the profile) is printed beside the simulated one: with expected
acceptance and, for sampled traces, with the trace's sampled outcomes.

Run: .venv/bin/python bench/sim_vs_live.py TRACES RUN/compare.json PROFILE.json [ARTIFACT ...]
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from disco.core.cost import CostModel
from disco.formats.trace import read_traces
from disco.jobs.compare import cost_model_speedups
from disco.policies.artifact import load_artifact
from disco.training.simulate import prompt_traces, replay_policy, simulate_many


def factories(labels: list[str], artifacts: dict[str, object], cost: CostModel, max_window: int) -> dict:
    """The replayable policy behind each compare label (rows the simulator cannot build are left out)."""
    out = {}
    for label in labels:
        if label.endswith("(fast verify)"):
            continue
        if m := re.fullmatch(r"constant k=(\d+)( \(tuned\))?", label):
            out[label] = replay_policy("constant", k=int(m[1]))
        elif label == "heuristic":
            out[label] = replay_policy("heuristic")
        elif m := re.fullmatch(r"threshold ([\d.]+)( \(tuned\))?", label):
            out[label] = replay_policy("threshold", threshold=float(m[1]))
        elif label == "threshold adaptive":
            out[label] = replay_policy("threshold", threshold=0.4, adaptive=True)
        elif m := re.fullmatch(r"adaedl λ0=([\d.]+)( \(tuned\))?", label):
            out[label] = replay_policy("adaedl", lam=float(m[1]), max_window=max_window)
        elif m := re.fullmatch(r"svip h=([\d.]+)( \(tuned\))?", label):
            out[label] = replay_policy("svip", h=float(m[1]))
        elif label == "oracle":
            out[label] = replay_policy("oracle")
        elif label == "classifier" or label.startswith("classifier ("):
            art = artifacts[label]
            if art.choice["policy"] == "threshold":
                out[label] = replay_policy("threshold", threshold=float(art.choice["setting"]))
            else:
                out[label] = replay_policy(
                    "classifier",
                    classifier_setting=art.setting,
                    model=art.model,
                    classifier_rule=art.rule,
                    cost=art.cost_model() or cost,
                )
    return out


def main(traces: str, compare_json: str, profile: str, *artifact_paths: str) -> None:
    result = json.loads(Path(compare_json).read_text())
    cost = CostModel.load(profile)
    live = cost_model_speedups(result, cost)
    src = read_traces([traces])[0]
    sampled = src.sampling["temperature"] > 0
    ids = {p["id"] for p in result["prompts"]}
    rows = src.rows[src.rows["prompt_id"].isin(ids)]
    max_window = result["config"]["max_window"]
    artifacts = {}
    for i, path in enumerate(artifact_paths):
        label = "classifier" if i == 0 else f"classifier ({Path(path).name})"
        artifacts[label] = load_artifact(path)
    made = factories(list(result["summary"]), artifacts, cost, max_window)
    expected = simulate_many(prompt_traces(rows, src.max_new_tokens, expected=sampled), made, max_window)
    outcomes = simulate_many(prompt_traces(rows, src.max_new_tokens), made, max_window) if sampled else None
    print(f"{len(ids)} prompts; traces {traces} ({'sampled' if sampled else 'greedy'}); cost model {profile}")
    print(
        "| policy | live (cost model, pooled) | simulated"
        + (" (expected) | simulated (sampled outcomes) |" if sampled else " |")
    )
    print("|---|---|---|" + ("---|" if sampled else ""))
    for label in made:
        line = f"| {label} | {live[label]['pooled']:.3f} | {expected[label].speedup(cost):.3f} |"
        if sampled:
            line += f" {outcomes[label].speedup(cost):.3f} |"
        print(line)


if __name__ == "__main__":
    main(*sys.argv[1:])
