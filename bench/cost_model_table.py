"""The table of a `disco compare` run with cost-model speedups from its forward counts.

On a shared machine single runs stall, so the wall-clock speedup of one run is noisy; the forward
counts are not, and the pair's measured cost model (`disco profile`) turns them into time.
Run: .venv/bin/python bench/cost_model_table.py RUN/compare.json bench/embedded/profile-cpu.json
On llama.cpp, rows verified in fast mode ("(fast verify)") take the fast mode's profile:
     .venv/bin/python bench/cost_model_table.py RUN/compare.json PROFILE-EXACT.json PROFILE-FAST.json
"""

import json
import sys

from disco.core.cost import CostModel
from disco.engines.llamacpp.llamacpp import FAST_SUFFIX
from disco.jobs.compare import cost_model_speedups, spread


def main(compare_json: str, profile: str, fast_profile: str | None = None) -> None:
    result = json.load(open(compare_json))
    model = cost_model_speedups(result, CostModel.load(profile))
    if fast_profile is not None:
        fast = cost_model_speedups(result, CostModel.load(fast_profile))
        model = {label: fast[label] if label.endswith(FAST_SUFFIX) else m for label, m in model.items()}
    fmt = lambda v, spec: "–" if v is None else format(v, spec)  # noqa: E731
    sampled = result.get("config", {}).get("temperature", 0) > 0
    # sampling: each speedup with its spread over seeds, and the mean target log-prob instead of "= target"
    print(
        "| policy | cost-model speedup (pooled) | median per prompt | wall-clock pooled | wall-clock median per prompt "
        f"(min–max) | tok/s | target fwd/tok | draft fwd/tok | mean accepted/window | acceptance | "
        f"{'target log-prob/token' if sampled else '= target'} |"
    )
    print("|" + "---|" * 11)
    for label, s in result["summary"].items():
        m = model[label]
        cm = "– (no windows)" if m is None else f"{m['pooled']:.2f}×"
        wall = f"{s['speedup']:.2f}×"
        if sampled:
            cm += "" if m is None else f" ({spread(m['by_seed'])})"
            wall += f" ({spread(s['speedup_by_seed'])})"
        med = "–" if m is None else f"{m['median']:.2f}"
        rate = "–" if s["acceptance_rate"] is None else f"{100 * s['acceptance_rate']:.0f}%"
        if sampled:
            last = fmt(s["target_logprob"], ".3f")
        else:
            last = "yes" if s["lossless"] else f"NO ({s.get('mismatched_prompts', '?')}/{s.get('prompts', '?')} differ)"
        print(
            f"| {label} | {cm} | {med} | {wall} | {s['speedup_median']:.2f} ({s['speedup_min']:.2f}–"
            f"{s['speedup_max']:.2f}) | {s['tokens_per_s']:.2f} | {fmt(s['target_forwards_per_token'], '.3f')} "
            f"| {fmt(s['draft_forwards_per_token'], '.3f')} | {fmt(s['mean_accepted_window'], '.2f')} | {rate} | {last} |"
        )


if __name__ == "__main__":
    main(*sys.argv[1:4])
