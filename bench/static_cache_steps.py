"""Static vs dynamic KV cache, interleaved in one process (issue 15 on the CPU): the draft's one-token
step and the target's verify of k tokens, timed alternately on each cache over several rounds so that
machine drift hits both alike; medians per cache and their ratio.

Run: .venv/bin/python bench/static_cache_steps.py [ROUNDS]   (torch float32, onednn, embedded pair)
"""

from __future__ import annotations

import statistics
import sys

import torch

from disco.base.options import PairOptions
from disco.jobs.profile import _median_time, context_ids
from disco.loop.engine_registry import as_engine
from disco.loop.pair import load_pair

CONTEXT, WIDTHS, REPEATS = 100, (1, 2, 4, 8, 16, 21), 5


@torch.inference_mode()
def main(rounds: int = 4) -> None:
    pair = load_pair(PairOptions(engine="torch", cache="dynamic"))
    ids = torch.tensor(context_ids(pair.tokenizer, CONTEXT + max(WIDTHS)))
    times = {(c, role, k): [] for c in ("dynamic", "static") for role in ("draft", "target") for k in WIDTHS}
    for _ in range(rounds):
        for cache in ("dynamic", "static"):
            for role, model in (("draft", pair.draft), ("target", pair.target)):
                engine = as_engine(model).set_cache(cache)
                session = engine.session(ids[:CONTEXT], capacity=len(ids))
                session.prefill()
                session.forward(ids[CONTEXT - 1 : CONTEXT], 1)
                for k in WIDTHS if role == "target" else (1,):
                    times[cache, role, k].append(
                        _median_time(session, ids[CONTEXT : CONTEXT + k], CONTEXT, REPEATS, 1, pair.device)
                    )
    med = {key: statistics.median(v) * 1e3 for key, v in times.items() if v}
    print(f"{rounds} rounds, each cache in turn; medians of per-round medians ({REPEATS} timed forwards), ms")
    print("| cache | draft step | target step | " + " | ".join(f"verify({k})" for k in WIDTHS[1:]) + " |")
    print("|---|---|---|" + "---|" * (len(WIDTHS) - 1))
    for c in ("dynamic", "static"):
        print(
            f"| {c} | {med[c, 'draft', 1]:.1f} | {med[c, 'target', 1]:.1f} | "
            + " | ".join(f"{med[c, 'target', k]:.1f}" for k in WIDTHS[1:])
            + " |"
        )
    print(
        "| static / dynamic | "
        + " | ".join(
            f"{med['static', r, k] / med['dynamic', r, k]:.3f}"
            for r, k in [("draft", 1), ("target", 1)] + [("target", k) for k in WIDTHS[1:]]
        )
        + " |"
    )


if __name__ == "__main__":
    main(*map(int, sys.argv[1:]))
