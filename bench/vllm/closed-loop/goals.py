"""Issues 45 and 47's goals read off one serve sweep (bench/serve_sweep.py's JSON), as ratios within that sweep.

    python bench/vllm/closed-loop/goals.py bench/vllm/closed-loop/code-sweep3.json [--md OUT.md]

Per configuration and concurrency: tok/s, × target-only (the mean of the sweep's target-only rows: the first and
the "target-only (again)" drift check at the end), × the best fixed-k vLLM row at that concurrency (vLLM's k = 1,
2, 3: issue 47's anchor), and for disco's rows × the re-implemented adaptive verification (the better of its rows
at that concurrency: issue 45's anchor). The drift between the two target-only rows is printed: a ratio within it
is no difference. Goals checked (a row passes where every concurrency passes):
- 47: each disco closed-loop row >= 1.0 × the best fixed k and >= 1.0 × target-only at every concurrency, and
  >= 1.10 × the best fixed k at one request;
- 45: the best disco row >= 1.05 × adaptive verification at every concurrency.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import mean

FIXED_K = ("vllm draft k=1", "vllm draft k=2", "vllm draft k=3")


def speeds(data: dict) -> dict[str, dict[int, float]]:
    """{configuration: {concurrency: output tok/s}} of the runs that completed."""
    out: dict[str, dict[int, float]] = {}
    for name, levels in data["runs"].items():
        got = {int(c): r["output_throughput"] for c, r in levels.items() if r.get("ok")}
        if got:
            out[name] = got
    return out


def report(data: dict) -> list[str]:
    tps = speeds(data)
    levels = sorted({c for row in tps.values() for c in row})
    targets = [row for name, row in tps.items() if name.startswith("target-only")]
    base = {c: mean(r[c] for r in targets if c in r) for c in levels}
    drift = {c: max(r[c] for r in targets if c in r) / min(r[c] for r in targets if c in r) - 1 for c in levels}
    fixed = {c: max((tps[k][c], k) for k in FIXED_K if k in tps and c in tps[k]) for c in levels}
    av_rows = [n for n in tps if "adaptive-verification" in n]
    av = {c: max(tps[n][c] for n in av_rows if c in tps[n]) for c in levels} if av_rows else {}

    lines = [
        "| configuration | "
        + " | ".join(f"c={c} tok/s (×target, ×best k{', ×AV' if av else ''})" for c in levels)
        + " |",
        "|---|" + "---|" * len(levels),
    ]
    for name, row in tps.items():
        cells = []
        for c in levels:
            if c not in row:
                cells.append("–")
                continue
            ratios = [row[c] / base[c], row[c] / fixed[c][0]] + ([row[c] / av[c]] if av else [])
            cells.append(f"{row[c]:.2f} (" + ", ".join(f"{r:.2f}×" for r in ratios) + ")")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("target-only drift between its rows: " + ", ".join(f"c={c} {100 * drift[c]:.1f} %" for c in levels))
    lines.append("best fixed k per concurrency: " + ", ".join(f"c={c} {fixed[c][1]}" for c in levels))

    lines.append("")
    lines.append(
        "Issue 47 goals (closed-loop rows: >= 1.0× best fixed k and target-only everywhere, >= 1.10× best k at c=1):"
    )
    for name, row in tps.items():
        if "closed" not in name:
            continue
        misses = [
            f"c={c} {row[c] / fixed[c][0]:.2f}× k / {row[c] / base[c]:.2f}× target"
            for c in levels
            if c in row and (row[c] < fixed[c][0] or row[c] < base[c] or (c == 1 and row[c] < 1.10 * fixed[c][0]))
        ]
        lines.append(f"- {name}: " + ("met" if not misses else "missed at " + "; ".join(misses)))
    if av:
        disco_rows = [n for n in tps if n.startswith("disco")]
        best = {c: max((tps[n][c], n) for n in disco_rows if c in tps[n]) for c in levels}
        lines.append("")
        lines.append("Issue 45 goal (the best disco row >= 1.05× adaptive verification at every concurrency):")
        for c in levels:
            r = best[c][0] / av[c]
            lines.append(f"- c={c}: {best[c][1]} {r:.2f}× ({'met' if r >= 1.05 else 'missed'})")
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep", type=Path, help="a serve_sweep.py JSON")
    p.add_argument("--md", type=Path, help="also write the lines here")
    a = p.parse_args(argv)
    text = "\n".join(report(json.loads(a.sweep.read_text()))) + "\n"
    print(text, end="")
    if a.md:
        a.md.write_text(text)


if __name__ == "__main__":
    main()
