"""The measurements of issue 24 (bench/RESULTS.md, "MT-Bench"): MT-Bench's test questions, both turns, on the
default engine (llama.cpp) and where drafting pays (vLLM), every policy per category and pooled.

    python bench/mtbench_bench.py profile-c1                    vLLM's load profile seen by one request -> bench/vllm/profile-c1.json
    python bench/mtbench_bench.py llamacpp OUT                  disco compare on llama.cpp (run_compare)
    python bench/mtbench_bench.py vllm VLLM_ARTIFACT OUT        disco compare on vLLM at 1 request (run_serving_compare)
    python bench/mtbench_bench.py report OUT/compare.json PROFILE   per-category tables (wall clock, cost model) + oracle windows

Rows are every policy at the setting `disco train` tuned on the validation questions (and the shipped sets'
validation prompts) under that engine's costs, the shipped classifier, and the engine's own speculative
decoding: on llama.cpp the artifact's own tuned record (llama.cpp's exact-verification costs) and llama-server
(-md tuned on the earlier validation prompts), on vLLM the record of the same traces trained under vLLM's
costs at one request without the target's signals (VLLM_ARTIFACT, the policy shipped for vLLM:
bench/mtbench_pipeline.sh) and vLLM's draft-model decoding at k = 3 (tuned at one request in issue 23) and at
the constant k tuned there. Both classifiers (that one, and the llama.cpp pair's, which reads target signals
vLLM cannot give) run their cost rule load-aware, as `vllm serve` would. Untuned paper defaults, the fast-verification variants and the
classifier's other rules are left out: each row costs ~3 min of this 2-core machine on 32 prompts x 128 tokens.
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

from disco.compare import Entry, cost_model_speedups, run_compare, tuned_from_artifact, tuned_server  # noqa: E402
from disco.cost import CostModel  # noqa: E402
from disco.decode import DecodeConfig  # noqa: E402
from disco.options import PairOptions  # noqa: E402
from disco.pair import load_pair  # noqa: E402
from disco.policies import PolicySpec  # noqa: E402
from disco.prompts import load_prompt_sources  # noqa: E402

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
    from disco.engines.llamacpp_server import server_anchors

    pair = load_pair(PairOptions(engine="llama.cpp"))
    entries = [
        *tuned_rows(tuned_from_artifact(SHIPPED)),
        Entry("classifier", PolicySpec("classifier", classifier=SHIPPED)),
    ]
    entries.append(Entry("oracle", PolicySpec("oracle")))
    entries += [Entry(a.label, own=a) for a in server_anchors(pair.target_engine, pair.draft, tuned_server(SHIPPED))]
    entries = [e for e in entries if "defaults" not in e.label]  # llama-server: target-only and -md tuned
    run_compare(pair, load_prompt_sources(TEST), entries, DecodeConfig(max_new_tokens=TOKENS), out)


def vllm(artifact: str, out: Path) -> None:
    from disco.serving import run_serving_compare

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
    lengths = [(OWN_K, " (tuned in issue 23)")] + ([(tuned["k"], " (tuned k)")] if tuned["k"] != OWN_K else [])
    run_serving_compare(
        pair,
        load_prompt_sources(TEST),
        entries,
        DecodeConfig(max_new_tokens=TOKENS, max_window=VLLM_WINDOW),
        out,
        [1],
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
    for g, prompts in groups.items():
        part = {**result, "prompts": prompts}
        cm = cost_model_speedups(part, cost)
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
        "\nThe oracle's windows per category (windows of the draft's tokens the target accepts, from its own"
        " output):\n\n| category | prompts | tokens | share drafted | windows per 100 tokens | mean window "
        "| median | longest | windows ≥ 8 |\n|---|---|---|---|---|---|---|---|---|"
    )
    for g, prompts in groups.items():
        runs = [p["runs"][oracle] for p in prompts]
        lengths = [n for r in runs for n in r["windows"]]  # the oracle drafts exactly what is accepted
        tokens = sum(r["new_tokens"] for r in runs)
        print(
            f"| {g} | {len(prompts)} | {tokens} | {sum(lengths) / tokens:.0%} | {100 * len(lengths) / tokens:.1f} | "
            f"{statistics.mean(lengths):.2f} | {statistics.median(lengths):g} | {max(lengths)} | "
            f"{sum(n >= 8 for n in lengths) / len(lengths):.0%} |"
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
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
