"""Recompute a compare.json's per-run and summary speedups (and its table.md) from the raw per-run
times and token counts it holds, with the current disco.jobs.compare: for runs written before speedups
were taken per token (under sampling, outputs differ in length, so whole-run times do not compare).

Run: .venv/bin/python bench/resummarise.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from disco.base.files import atomic_write_json, atomic_write_text
from disco.jobs.compare import TARGET_LABEL, _per_token_speedup, format_tables, summarise


def main(*dirs: str) -> None:
    for d in map(Path, dirs):
        result = json.loads((d / "compare.json").read_text())
        for p in result["prompts"]:
            base = p["runs"][TARGET_LABEL]
            for run in p["runs"].values():
                run["speedup"] = _per_token_speedup(
                    base["wall_s"], base["new_tokens"], run["wall_s"], run["new_tokens"]
                )
        result["summary"], result["summary_by_task"] = summarise(list(result["summary"]), result["prompts"])
        atomic_write_json(d / "compare.json", result)
        atomic_write_text(d / "table.md", format_tables(result) + "\n")
        print(f"rewrote {d}/compare.json and table.md")


if __name__ == "__main__":
    main(*sys.argv[1:])
