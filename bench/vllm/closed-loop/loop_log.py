"""What a closed loop did in a serving process, from its DISCO_CLOSED_LOOP_LOG (online/closed_loop.py: one JSON line
per judged step): per batch band, the steps and seconds each kind of decision took (warm-up probes, the policy, the
governor's fixed lengths, off, stale rejoins; steps that also ran a prefill apart) and the tokens per second each
produced, then the governor's moves.

    python bench/vllm/closed-loop/loop_log.py RAW_DIR/disco-closed-none.loop.jsonl [...]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def band(batch: int) -> int:
    return 1 << (max(batch, 1).bit_length() - 1)


def summarize(path: Path) -> str:
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+", type=Path)
    for path in ap.parse_args().logs:
        print(summarize(path))


if __name__ == "__main__":
    main()
