"""What a classifier that reads the target's signals (last_*) loses inside vLLM, where its proposer never sees
them (bench/results/mtbench.md, "MT-Bench"): simulated speedup on the validation prompts of `disco train`'s split,
each artifact under its cost rule and the given cost model, once with the signals the traces hold (disco's own
loop) and once with none (vLLM: they stay at their before-any-window values, features.NO_SIGNALS).

    python bench/signals_in_vllm.py PROFILE TRACES[,TRACES…] ARTIFACT [ARTIFACT…]
"""

from __future__ import annotations

import sys
from dataclasses import replace

from disco.base.defaults import DEFAULT_VAL_FRACTION  # noqa: E402
from disco.core.cost import CostModel
from disco.policies.artifact import load_artifact
from disco.training.simulate import SIGNAL_COLUMNS, replay_policy, simulate_many
from disco.training.train_data import load_trace_data, row_tasks, split_by_prompt, traces_for

MAX_WINDOW = 8  # as the vLLM rows run (the proposer's longest window)


def main(profile: str, traces: str, artifacts: list[str]) -> None:
    cost = CostModel.load(profile)
    data = load_trace_data(traces.split(","))
    _, val = split_by_prompt(data.rows["prompt_id"].to_numpy(), DEFAULT_VAL_FRACTION, 0, row_tasks(data.rows))
    blind = replace(data, rows=data.rows.drop(columns=[*SIGNAL_COLUMNS, "target_top1"], errors="ignore"))
    seen, unseen = traces_for(data, val), traces_for(blind, val)
    print(f"{len(seen)} validation prompts, cost model {cost.source}, windows of up to {MAX_WINDOW}\n")
    print(
        "| artifact | reads last_* | cost rule, signals seen | signals unseen (vLLM) | change |\n|---|---|---|---|---|"
    )
    for path in artifacts:
        art = load_artifact(path, expect_pair=data.pair)
        setting = art.rule_settings.get("cost", art.setting)
        factory = {
            "c": replay_policy(
                "classifier",
                classifier_setting=setting,
                model=art,
                classifier_rule="cost",
                cost=cost,
                max_window=MAX_WINDOW,
            )
        }
        a = simulate_many(seen, factory, MAX_WINDOW)["c"].speedup(cost)
        b = simulate_many(unseen, factory, MAX_WINDOW)["c"].speedup(cost)
        reads = any(c.startswith("last_") for c in art.manifest["columns"])
        print(f"| {path} | {'yes' if reads else 'no'} | {a:.3f} | {b:.3f} | {b / a - 1:+.1%} |")


if __name__ == "__main__":
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
