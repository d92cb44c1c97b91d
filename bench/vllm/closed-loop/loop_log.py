"""What a closed loop did in a serving process, from its DISCO_CLOSED_LOOP_LOG (online/closed_loop.py: one JSON line
per judged step): per batch band, the steps and seconds each kind of decision took (warm-up probes, the policy, the
governor's fixed lengths, off, stale rejoins; steps that also ran a prefill apart) and the tokens per second each
produced, then the governor's moves.

    python bench/vllm/closed-loop/loop_log.py RAW_DIR/disco-closed-none.loop.jsonl [...]
    python bench/vllm/closed-loop/loop_log.py LOG --profile-out serve-profile.json   # the costs the server measured

--profile-out writes the step costs the serving process measured, as a `disco profile --engine vllm` file (c_step by
the step's tokens, c_draft by batch size, medians of its decode steps; sizes it never ran interpolated, and past the
largest continued along the line through the last two), for the simulators (bench/batch_bound.py --profile): a
bound computed under the costs of `vllm serve`, not of an in-process profile.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict
from itertools import accumulate
from pathlib import Path


def read_lines(path: Path) -> list[str]:
    """A log's lines, gzipped (as the sweeps keep them: sweep*-loops/*.loop.jsonl.gz) or not."""
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    return [x for x in text.splitlines() if x.strip()]


def band(batch: int) -> int:
    return 1 << (max(batch, 1).bit_length() - 1)


def summarize(path: Path) -> str:
    lines = [json.loads(x) for x in read_lines(path)]
    # band -> kind -> [steps, seconds, tokens]
    table: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0, 0.0, 0]))
    moves = []
    last = None
    for x in lines:
        decode = sum(x["drafted"]) + len(x["drafted"])
        kind = "prefill" if x["tokens"] > decode else x["decided"].split()[0]
        cell = table[band(x["batch"])][kind]
        cell[0] += 1
        cell[1] += x["seconds"]
        cell[2] += sum(a + 1 for a in x["accepted"])
        mode = (x["governor"], x["trial"])
        if mode != last:
            moves.append(
                f"step {x['step']} (batch {x['batch']}): {x['governor']}"
                + (" (trial)" if x["trial"] and x["governor"] == "policy" else "")
            )
            last = mode
    out = [
        f"## {path.name}: {len(lines)} steps",
        "",
        "| band | kind | steps | seconds | share of the band's time | tok/s |",
    ]
    out.append("|---|---|---|---|---|---|")
    for b in sorted(table):
        total = sum(c[1] for c in table[b].values())
        for kind, (steps, seconds, tokens) in sorted(table[b].items(), key=lambda kv: -kv[1][1]):
            rate = tokens / seconds if seconds else 0.0
            out.append(f"| {b} | {kind} | {steps} | {seconds:.1f} | {100 * seconds / total:.0f} % | {rate:.1f} |")
    out += ["", "the governor (policy: the policy decides; k: a fixed length): " + "; ".join(moves), ""]
    return "\n".join(out)


def _filled(medians: dict[int, float], n: int) -> list[float]:
    """Sizes 1 .. n: the measured medians, interpolated between them, flat before the first, and past the last along
    the line through the last two; made non-decreasing (a running maximum: noise must not make a size cheaper)."""
    sizes = sorted(medians)
    out = []
    for x in range(1, n + 1):
        if x <= sizes[0]:
            out.append(medians[sizes[0]])
        elif x >= sizes[-1]:
            lo, hi = (sizes[-2], sizes[-1]) if len(sizes) > 1 else (sizes[-1], sizes[-1])
            slope = max(0.0, (medians[hi] - medians[lo]) / (hi - lo)) if hi > lo else 0.0
            out.append(medians[hi] + slope * (x - hi))
        else:
            lo = max(s for s in sizes if s <= x)
            hi = min(s for s in sizes if s >= x)
            w = 0.0 if hi == lo else (x - lo) / (hi - lo)
            out.append(medians[lo] + w * (medians[hi] - medians[lo]))
    return list(accumulate(out, max))


def serve_profile(paths: list[Path], max_window: int = 8, max_batch: int = 8) -> dict:
    """The costs the logged steps measured: a target step by its tokens (its target_s), a batched draft position by
    batch size (the step's other seconds, the proposer's drafting and decisions, over its positions: the longest
    window, at least vLLM's catch-up pass), medians of the decode steps (no prefill in them)."""
    steps: dict[int, list[float]] = defaultdict(list)
    drafts: dict[int, list[float]] = defaultdict(list)
    for path in paths:
        for x in (json.loads(line) for line in read_lines(path)):
            if x["target_s"] is None or x["tokens"] > sum(x["drafted"]) + len(x["drafted"]):
                continue
            steps[x["tokens"]].append(x["target_s"])
            drafts[x["batch"]].append((x["seconds"] - x["target_s"]) / max(max(x["drafted"]), 1))
    median = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    c_step = _filled({t: median(v) for t, v in steps.items() if len(v) >= 3}, max_batch * (max_window + 1))
    c_draft = _filled({b: median(v) for b, v in drafts.items() if len(v) >= 3}, max_batch)
    return {
        "c_d": c_draft[0], "c_t": c_step[: max_window + 1], "c_step": c_step, "c_draft": c_draft,
        "source": "vllm serve (closed-loop log)", "unit": "s", "max_window": max_window, "max_batch": max_batch,
        "logs": [str(p) for p in paths], "timed_sizes": {"tokens": sorted(steps), "batch": sorted(drafts)},
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+", type=Path)
    ap.add_argument("--profile-out", type=Path, help="write the logs' measured step costs as a profile JSON")
    args = ap.parse_args()
    if args.profile_out:
        args.profile_out.write_text(json.dumps(serve_profile(args.logs), indent=1) + "\n")
        print(f"wrote {args.profile_out}")
        return
    for path in args.logs:
        print(summarize(path))


if __name__ == "__main__":
    main()
