"""The table of a `disco compare` run with cost-model speedups from its forward counts.

On a shared machine single runs stall, so the wall-clock speedup of one run is noisy; the forward
counts are not, and the pair's measured cost model (`disco profile`) turns them into time.
Run: .venv/bin/python bench/cost_model_table.py RUN/compare.json bench/embedded/profile-cpu.json
On llama.cpp, rows verified in fast mode ("(fast verify)") take the fast mode's profile:
     .venv/bin/python bench/cost_model_table.py RUN/compare.json PROFILE-EXACT.json PROFILE-FAST.json
"""

import json
import sys

from disco.compare import FAST_SUFFIX, cost_model_speedups
from disco.simulate import CostModel


def main(compare_json: str, profile: str, fast_profile: str | None = None) -> None:
    result = json.load(open(compare_json))
    model = cost_model_speedups(result, CostModel.load(profile))
    if fast_profile is not None:
        fast = cost_model_speedups(result, CostModel.load(fast_profile))
        model = {label: fast[label] if label.endswith(FAST_SUFFIX) else m for label, m in model.items()}
    fmt = lambda v, spec: "–" if v is None else format(v, spec)  # noqa: E731
    print("| policy | cost-model speedup (pooled) | median per prompt | wall-clock pooled | wall-clock median per prompt "
          "(min–max) | tok/s | target fwd/tok | draft fwd/tok | mean accepted/window | acceptance | = target |")
    print("|" + "---|" * 11)
    for label, s in result["summary"].items():
        m = model[label]
        cm = "– (no windows)" if m is None else f"{m['pooled']:.2f}×"
        med = "–" if m is None else f"{m['median']:.2f}"
        rate = "–" if s["acceptance_rate"] is None else f"{100 * s['acceptance_rate']:.0f}%"
        same = "yes" if s["lossless"] else f"NO ({s.get('mismatched_prompts', '?')}/{s.get('prompts', '?')} differ)"
        print(f"| {label} | {cm} | {med} | {s['speedup']:.2f}× | {s['speedup_median']:.2f} ({s['speedup_min']:.2f}–"
              f"{s['speedup_max']:.2f}) | {s['tokens_per_s']:.2f} | {fmt(s['target_forwards_per_token'], '.3f')} "
              f"| {fmt(s['draft_forwards_per_token'], '.3f')} | {fmt(s['mean_accepted_window'], '.2f')} | {rate} | {same} |")


if __name__ == "__main__":
    main(*sys.argv[1:4])
