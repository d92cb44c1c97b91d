"""The table of a `disco compare` run with cost-model speedups from its forward counts.

On a shared machine single runs stall, so the wall-clock speedup of one run is noisy; the forward
counts are not, and the pair's measured cost model (`disco profile`) turns them into time.
Run: .venv/bin/python bench/cost_model_table.py RUN/compare.json bench/embedded/profile-cpu.json
"""

import json
import sys

from disco.compare import cost_model_speedups
from disco.simulate import CostModel


def main(compare_json: str, profile: str) -> None:
    result = json.load(open(compare_json))
    cost = CostModel.load(profile)
    model = cost_model_speedups(result, cost)
    print("| policy | cost-model speedup (pooled) | median per prompt | wall-clock median per prompt (min–max) "
          "| target fwd/tok | draft fwd/tok | mean accepted/window | acceptance | = target |")
    print("|" + "---|" * 9)
    for label, s in result["summary"].items():
        m = model[label]
        cm = "– (no windows)" if m is None else f"{m['pooled']:.2f}×"
        med = "–" if m is None else f"{m['median']:.2f}"
        acc = "–" if s["mean_accepted_window"] is None else f"{s['mean_accepted_window']:.2f}"
        rate = "–" if s["acceptance_rate"] is None else f"{100 * s['acceptance_rate']:.0f}%"
        print(f"| {label} | {cm} | {med} | {s['speedup_median']:.2f} ({s['speedup_min']:.2f}–{s['speedup_max']:.2f}) "
              f"| {s['target_forwards_per_token']:.3f} | {s['draft_forwards_per_token']:.3f} | {acc} | {rate} "
              f"| {'yes' if s['lossless'] else 'NO'} |")


if __name__ == "__main__":
    main(*sys.argv[1:3])
