"""Do two `disco compare` runs count the same? For every row and prompt both runs hold: the generated
tokens, target and draft forwards, every window's drafted and accepted tokens, and whether the output
equals target-only decoding. Timings are ignored (they are the machine's, not the code's).

Run: python bench/same_counts.py BEFORE/compare.json AFTER/compare.json
Exit 0 when every shared row counts the same; prints the rows that differ (and those only one run has).
"""

import json
import sys

FIELDS = (
    "new_tokens",
    "target_forwards",
    "draft_forwards",
    "drafted",
    "accepted",
    "windows",
    "accepted_per_window",
    "lossless",
    "first_mismatch",
)


def counts(result: dict) -> dict[tuple[str, str], dict]:
    return {
        (p["id"], label): {f: run.get(f) for f in FIELDS} for p in result["prompts"] for label, run in p["runs"].items()
    }


def main(before_path: str, after_path: str) -> int:
    before, after = (counts(json.load(open(p))) for p in (before_path, after_path))
    shared = sorted(before.keys() & after.keys())
    differ = [key for key in shared if before[key] != after[key]]
    only = sorted(before.keys() ^ after.keys())
    rows = sorted({label for _, label in shared})
    print(
        f"{len(rows)} rows x {len({pid for pid, _ in shared})} prompts compared: {len(shared) - len(differ)} of "
        f"{len(shared)} runs count the same"
    )
    for pid, label in differ:
        changed = {
            f: (before[pid, label][f], after[pid, label][f])
            for f in FIELDS
            if before[pid, label][f] != after[pid, label][f]
        }
        print(f"DIFFERS {pid} / {label}: {changed}")
    for pid, label in only:
        print(f"only in {'before' if (pid, label) in before else 'after'}: {pid} / {label}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
