"""The measurements of issue 24 (bench/results/mtbench.md, "MT-Bench"): MT-Bench's test questions, both turns, on the
default engine (llama.cpp) and where drafting pays (vLLM), every policy per category and pooled.

    python bench/mtbench_bench.py profile-c1                    vLLM's load profile seen by one request -> bench/vllm/profile-c1.json
    python bench/mtbench_bench.py llamacpp OUT                  disco compare on llama.cpp (run_compare)
    python bench/mtbench_bench.py vllm VLLM_ARTIFACT OUT        disco compare on vLLM at 1 request (run_compare)
    python bench/mtbench_bench.py report OUT/compare.json PROFILE   per-category tables (wall clock, cost model) + oracle windows
    python bench/mtbench_bench.py simulate TRACES ARTIFACT PROFILE W  every policy simulated on test traces, per category,
                                                                      and the oracle's windows there (W: longest window)

Rows are every policy at the setting `disco train` tuned on the validation questions (and the shipped sets'
validation prompts) under that engine's costs, the shipped classifier, and the engine's own speculative
decoding: on llama.cpp the artifact's own tuned record (llama.cpp's exact-verification costs) and
llama-server (-md tuned on the earlier validation prompts), on vLLM the record of the same traces trained
under vLLM's costs at one request without the target's signals (VLLM_ARTIFACT, the policy shipped for vLLM:
bench/mtbench_pipeline.sh) and vLLM's draft-model decoding at k = 3 (tuned at one request in issue 23; one
length only: a fourth vLLM instance does not fit in the 24 GB). Both classifiers (that one, and the llama.cpp
pair's, which reads target signals vLLM cannot give) run their cost rule load-aware, as `vllm serve` would.
Untuned paper defaults, the fast-verification variants and the classifier's other rules are left out: each
row costs minutes of this 2-core machine on 32 prompts x 128 tokens. On llama.cpp, where no drafting pays
here, the live rows are only the tuned threshold, the classifier, the oracle and llama-server -md (tuned);
every policy is simulated on the test prompts' traces instead (`simulate`).
Environment for vLLM: OMP_NUM_THREADS=2, VLLM_CPU_KVCACHE_SPACE=1 (set here when unset).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # whole GiB (vLLM parses an int)

from disco.base.options import PairOptions  # noqa: E402
from disco.core.cost import CostModel  # noqa: E402
from disco.core.stats import GenStats  # noqa: E402
from disco.formats.prompts import load_prompt_sources  # noqa: E402
from disco.jobs.compare import Entry, cost_model_speedups, run_compare, tuned_from_artifact  # noqa: E402
from disco.jobs.server_tuning import tuned_server  # noqa: E402
from disco.loop.decode import DecodeConfig  # noqa: E402
from disco.loop.pair import load_pair  # noqa: E402
from disco.policies.policy_registry import PolicySpec  # noqa: E402

SHIPPED = "models/embedded-qwen2.5-coder-llamacpp"
LOAD_PROFILE = Path("bench/vllm/profile.json")  # disco profile --engine vllm (issue 23), committed copy
C1_PROFILE = Path("bench/vllm/profile-c1.json")
TEST = ["mt-bench:test", "mt-bench-2:test"]
TOKENS, VLLM_WINDOW = 128, 8  # vLLM: the proposer's longest window, as profiled (8 requests x 9 tokens)
OWN_K = 3  # vLLM's draft-model length tuned at one request on issue 23's validation prompts


def tuned_rows(tuned: dict) -> list[Entry]:
    """Every policy at the setting tuned on the validation prompts (`disco train`'s record)."""
    return [
        Entry(f"constant k={tuned['k']} (tuned)", PolicySpec("constant", k=tuned["k"])),
        Entry("heuristic", PolicySpec("heuristic")),
        Entry(f"threshold {tuned['threshold']:g} (tuned)", PolicySpec("threshold", threshold=tuned["threshold"])),
        Entry(f"adaedl λ0={tuned['adaedl_lambda']:g} (tuned)", PolicySpec("adaedl", lam=tuned["adaedl_lambda"])),
        Entry(f"svip h={tuned['svip_h']:g} (tuned)", PolicySpec("svip", h=tuned["svip_h"])),
    ]


def llamacpp(out: Path) -> None:
    from disco.engines.llamacpp.llamacpp_server import server_anchors

    pair = load_pair(PairOptions(engine="llama.cpp"))
    tuned = tuned_from_artifact(SHIPPED)
    entries = [
        Entry(f"threshold {tuned['threshold']:g} (tuned)", PolicySpec("threshold", threshold=tuned["threshold"])),
        Entry("classifier", PolicySpec("classifier", classifier=SHIPPED)),
        Entry("oracle", PolicySpec("oracle")),
    ]
    # llama-server -md at its tuned setting (its target-only and llama.cpp's defaults left out, for time)
    anchors = server_anchors(pair.target_engine, pair.draft, tuned_server(SHIPPED))
    entries += [Entry(a.label, own=a) for a in anchors if "tuned" in a.label]
    run_compare(pair, load_prompt_sources(TEST), entries, DecodeConfig(max_new_tokens=TOKENS), out)


def vllm(artifact: str, out: Path) -> None:
    pair = load_pair(PairOptions(engine="vllm"))
    tuned = tuned_from_artifact(artifact)
    entries = [
        *tuned_rows(tuned),
        Entry(
            f"classifier cost rule ({Path(artifact).name}, load-aware)",
            PolicySpec("classifier", classifier=artifact, classifier_rule="cost"),
        ),
        Entry(
            f"classifier cost rule ({Path(SHIPPED).name}, load-aware)",
            PolicySpec("classifier", classifier=SHIPPED, classifier_rule="cost"),
        ),
    ]
    # one fixed length only: a fourth vLLM instance (target-only, draft-model, disco's proposer) does not fit in 24 GB
    lengths = [(OWN_K, " (tuned in issue 23)")]
    run_compare(
        pair,
        load_prompt_sources(TEST),
        entries,
        DecodeConfig(max_new_tokens=TOKENS, max_window=VLLM_WINDOW),
        out,
        concurrency=[1],
        settings={"fixed_k": lengths},
        load=CostModel.load(LOAD_PROFILE),
    )


def profile_c1() -> None:
    view = CostModel.load(LOAD_PROFILE).at_load(1, VLLM_WINDOW)
    C1_PROFILE.write_text(json.dumps({**view.to_dict(), "source": f"{LOAD_PROFILE} at 1 request"}, indent=1) + "\n")
    print(
        f"wrote {C1_PROFILE}: c_d/c_t(1) = {view.c_d / view.c_t[0]:.3f}, c_t({len(view.c_t)})/c_t(1) = {view.c_t[-1] / view.c_t[0]:.3f}"
    )


def report(compare_json: str, profile: str) -> None:
    """Per category: each row's wall-clock speedup (pooled: total target-only time over total row time) and
    cost-model speedup (its forward counts under `profile`), then the oracle's windows per category."""
    result = json.loads(Path(compare_json).read_text())
    cost = CostModel.load(profile)
    labels = list(result["summary"])
    ref = labels[0]
    tasks = list(dict.fromkeys(p["task"] for p in result["prompts"]))
    groups = {"all": result["prompts"], **{t: [p for p in result["prompts"] if p["task"] == t] for t in tasks}}
    wall: dict[str, dict[str, float]] = defaultdict(dict)
    model: dict[str, dict[str, float | None]] = defaultdict(dict)
    serving = "concurrency" in result  # vLLM: the proposer counts only the steps that drafted
    for g, prompts in groups.items():
        part = {**result, "prompts": prompts}
        cm = _serving_cost_model(part, cost) if serving else cost_model_speedups(part, cost)
        base = sum(p["runs"][ref]["wall_s"] for p in prompts) / sum(p["runs"][ref]["new_tokens"] for p in prompts)
        for label in labels:
            runs = [p["runs"][label] for p in prompts]
            wall[label][g] = base / (sum(r["wall_s"] for r in runs) / sum(r["new_tokens"] for r in runs))
            model[label][g] = None if cm[label] is None else cm[label]["pooled"]
    head = "| row | " + " | ".join(f"{g} ({len(ps)})" for g, ps in groups.items()) + " |"
    rule = "|---|" + "---|" * len(groups)
    for title, table in (("Wall-clock speedup", wall), (f"Cost-model speedup ({cost.source})", model)):
        print(f"\n{title}, pooled per category:\n\n{head}\n{rule}")
        for label in labels:
            cells = ["–" if table[label][g] is None else f"{table[label][g]:.2f}" for g in groups]
            print(f"| {label} | " + " | ".join(cells) + " |")
    oracle = next((label for label in labels if label == "oracle"), None)
    if oracle is None:
        return
    print(
        "\nThe oracle's rounds per category (live: it drafts until the first rejected token; 'accepted' = the"
        " draft's tokens the target keeps before its own):\n\n| category | prompts | tokens | from the draft | "
        "rounds per 100 tokens | mean accepted | median | most | rounds accepting ≥ 8 |\n|---|---|---|---|---|---|---|---|---|"
    )
    for g, prompts in groups.items():
        runs = [p["runs"][oracle] for p in prompts]
        accepted = [n for r in runs for n in r["accepted_per_window"]]
        tokens = sum(r["new_tokens"] for r in runs)
        print(
            f"| {g} | {len(prompts)} | {tokens} | {sum(accepted) / tokens:.0%} | {100 * len(accepted) / tokens:.1f} | "
            f"{statistics.mean(accepted):.2f} | {statistics.median(accepted):g} | {max(accepted):g} | "
            f"{sum(n >= 8 for n in accepted) / len(accepted):.0%} |"
        )


def _serving_cost_model(result: dict, cost: CostModel) -> dict[str, dict | None]:
    """cost_model_speedups for vLLM rows: disco's proposer sees only the steps in which a request drafted, so
    the target-only steps are the tokens its windows did not yield (each window: its accepted tokens + one of
    the target's); vLLM's own rows and target-only expose no windows (None; target-only is 1 by definition)."""
    out: dict[str, dict | None] = {}
    for label in result["summary"]:
        runs = [p["runs"][label] for p in result["prompts"]]
        if label == next(iter(result["summary"])):
            out[label] = {"pooled": 1.0}
        elif not any(r["windows"] for r in runs):
            out[label] = None
        else:
            stats = []
            for r in runs:
                plain = max(0, r["new_tokens"] - sum(a + 1 for a in r["accepted_per_window"]))
                forwards = len(r["windows"]) + plain
                stats.append(GenStats(r["new_tokens"], forwards, r["draft_forwards"], windows=r["windows"]))
            out[label] = {"pooled": sum(map(cost.baseline, stats)) / sum(map(cost.time, stats))}
    return out


def simulate_report(traces: str, artifact: str, profile: str, max_window: int) -> None:
    """Every row's simulated speedup per category on the test prompts' traces (disco collect), each policy at
    the artifact's tuned settings, and the oracle's rounds per category from the traces' labels."""
    import numpy as np

    from disco.policies.artifact import load_artifact
    from disco.training.simulate import replay_policy, simulate_many
    from disco.training.train_data import load_trace_data, traces_for

    cost = CostModel.load(profile)
    data = load_trace_data([traces])
    art = load_artifact(artifact, expect_pair=data.pair)
    tuned = tuned_from_artifact(artifact)
    w = {"max_window": max_window}
    factories = {
        "oracle": replay_policy("oracle", **w),
        f"classifier ({art.rule} rule {art.setting:g})": replay_policy(
            "classifier", classifier_setting=art.setting, model=art, classifier_rule=art.rule, cost=cost, **w
        ),
        f"threshold {tuned['threshold']:g} (tuned)": replay_policy("threshold", threshold=tuned["threshold"], **w),
        f"constant k={tuned['k']} (tuned)": replay_policy("constant", k=tuned["k"], **w),
        "heuristic": replay_policy("heuristic", **w),
        f"adaedl λ0={tuned['adaedl_lambda']:g} (tuned)": replay_policy("adaedl", lam=tuned["adaedl_lambda"], **w),
        f"svip h={tuned['svip_h']:g} (tuned)": replay_policy("svip", h=tuned["svip_h"], **w),
    }
    rows = data.rows
    tasks = list(dict.fromkeys(rows["task"].tolist()))
    masks = {"all": np.ones(len(rows), bool), **{t: (rows["task"] == t).to_numpy() for t in tasks}}
    sims = {g: simulate_many(traces_for(data, m), factories, max_window) for g, m in masks.items()}
    n = {g: rows.loc[m, "prompt_id"].nunique() for g, m in masks.items()}
    print(f"Simulated speedup ({cost.source}, windows of up to {max_window}), test prompts' traces:\n")
    print("| policy | " + " | ".join(f"{g} ({n[g]})" for g in masks) + " |\n|---|" + "---|" * len(masks))
    for label in factories:
        print(f"| {label} | " + " | ".join(f"{sims[g][label].speedup(cost):.2f}" for g in masks) + " |")
    print(
        "\nThe oracle's rounds per category (from the labels: each round drafts until the first rejected token; "
        "'accepted' = the draft's tokens the target keeps before its own):\n\n| category | prompts | tokens | "
        "from the draft | rounds per 100 tokens | mean accepted | median | rounds accepting 0 | accepting ≥ 8 |"
        "\n|---|---|---|---|---|---|---|---|---|"
    )
    for g, m in masks.items():
        sub = rows.loc[m & (rows["window_id"].to_numpy() >= 0)]
        acc = sub.groupby(["prompt_id", "window_id"])["label"].sum().to_numpy()
        tokens = int(m.sum())
        print(
            f"| {g} | {n[g]} | {tokens} | {acc.sum() / tokens:.0%} | {100 * len(acc) / tokens:.1f} | "
            f"{acc.mean():.2f} | {np.median(acc):g} | {(acc == 0).mean():.0%} | {(acc >= 8).mean():.0%} |"
        )


def main() -> None:
    phase = sys.argv[1] if len(sys.argv) > 1 else ""
    if phase == "profile-c1":
        profile_c1()
    elif phase == "llamacpp" and len(sys.argv) == 3:
        llamacpp(Path(sys.argv[2]))
    elif phase == "vllm" and len(sys.argv) == 4:
        vllm(sys.argv[2], Path(sys.argv[3]))
    elif phase == "report" and len(sys.argv) == 4:
        report(sys.argv[2], sys.argv[3])
    elif phase == "simulate" and len(sys.argv) == 6:
        simulate_report(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
