"""Tune llama.cpp's own speculative decoding (llama-server -md: --spec-draft-n-max, --draft-p-min) on the
classifier's validation prompts, as `disco train` tunes disco's baselines, and write the best setting
beside the artifact (server-tuned.json), where `disco compare` and `disco demo` pick it up.

    .venv/bin/python bench/tune_llama_server.py --classifier models/embedded-qwen2.5-coder-llamacpp

The validation prompts are the artifact's (manifest training.val_prompt_ids, looked up in the shipped
prompt sets), up to --per-task of each task; the criterion is total wall time over them, measured
by llama-server itself on the same GGUF pair (the draft as disco runs it) and thread count.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from disco.decode import DecodeConfig  # noqa: E402
from disco.engines.llamacpp_server import LlamaServer, server_binary  # noqa: E402
from disco.engines.registry import as_engine  # noqa: E402
from disco.files import atomic_write_json  # noqa: E402
from disco.options import PairOptions
from disco.pair import load_pair  # noqa: E402
from disco.prompts import DATA_DIR, load_prompts  # noqa: E402


def validation_prompts(artifact: Path, per_task: int) -> list:
    manifest = json.loads((artifact / "manifest.json").read_text())
    ids = set(manifest["training"]["val_prompt_ids"])
    picked, count = [], {}
    for task in ("code", "explain", "write"):
        for p in load_prompts(DATA_DIR / f"{task}-train.jsonl"):
            if p.id in ids and count.get(task, 0) < per_task:
                picked.append(p)
                count[task] = count.get(task, 0) + 1
    return picked


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--classifier", type=Path, required=True, help="artifact folder (its validation prompts)")
    ap.add_argument("--per-task", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--n-max", default="4,8,16", help="comma list of --spec-draft-n-max values")
    ap.add_argument("--p-min", default="0.5,0.7,0.8,0.9", help="comma list of --draft-p-min values")
    args = ap.parse_args()

    pair = load_pair(PairOptions(engine="llama.cpp"))
    target, draft = as_engine(pair.target), as_engine(pair.draft)
    prompts = validation_prompts(args.classifier, args.per_task)
    encoded = [pair.encode(p.prompt) for p in prompts]
    config = DecodeConfig(max_new_tokens=args.max_new_tokens)
    grid = list(itertools.product([int(x) for x in args.n_max.split(",")], [float(x) for x in args.p_min.split(",")]))
    print(f"{len(prompts)} validation prompts x {len(grid)} settings", file=sys.stderr)
    binary = server_binary()
    results = []
    for n_max, p_min in grid:
        with LlamaServer(
            target.path,
            draft.path,
            threads=target.threads,
            ctx=target.n_ctx,
            binary=binary,
            n_max=n_max,
            p_min=p_min,
            progress=False,
        ) as srv:
            wall = tokens = drafted = accepted = 0
            for ids in encoded:
                r = srv.complete(ids, config.max_new_tokens)
                wall += r["wall_s"]
                tokens += len(r["tokens"])
                drafted += r["draft_n"] or 0
                accepted += r["draft_n_accepted"] or 0
        row = {
            "n_max": n_max,
            "p_min": p_min,
            "wall_s": wall,
            "tokens": tokens,
            "tok_s": tokens / wall,
            "acceptance": accepted / drafted if drafted else None,
        }
        results.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    best = max(results, key=lambda r: r["tok_s"])
    out = {
        "n_max": best["n_max"],
        "p_min": best["p_min"],
        "criterion": "tokens/s over the validation prompts",
        "prompts": [p.id for p in prompts],
        "max_new_tokens": args.max_new_tokens,
        "grid": results,
        "engine": pair.describe()["engine"],
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    atomic_write_json(args.classifier / "server-tuned.json", out)
    print(
        f"best: n-max {best['n_max']}, p-min {best['p_min']} ({best['tok_s']:.2f} tok/s); "
        f"wrote {args.classifier / 'server-tuned.json'}"
    )


if __name__ == "__main__":
    main()
