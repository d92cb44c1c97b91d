"""llama.cpp's own speculative decoding (llama-server -md: --spec-draft-n-max, --draft-p-min) tuned on a
classifier's validation prompts, as `disco train` tunes disco's baselines; the best setting is kept beside
the artifact (TUNED_FILE), where `disco compare` and `disco demo` read it (`tuned_server`) for their
"llama-server -md (tuned)" row. The file's one writer and one reader are here.

The validation prompts are the artifact's (manifest training.val_prompt_ids, looked up in the shipped
prompt sets), up to `per_task` of each task; the criterion is tokens/s over them, measured by
llama-server itself on the same GGUF pair (the draft as disco runs it) and thread count.
Run it with bench/tune_llama_server.py.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from disco.base.defaults import SERVER_TUNING_N_MAX, SERVER_TUNING_P_MIN
from disco.base.files import atomic_write_json
from disco.formats.prompts import DATA_DIR, Prompt, load_prompts

TUNED_FILE = "server-tuned.json"  # beside the artifact
TASKS = ("code", "explain", "write")  # the shipped prompt sets the validation prompts are looked up in
CRITERION = "tokens/s over the validation prompts"


def tuned_server(artifact: str | Path) -> dict | None:
    """llama-server's -md settings tuned beside the artifact, if recorded: {n_max, p_min}."""
    file = Path(artifact) / TUNED_FILE
    if not file.is_file():
        return None
    data = json.loads(file.read_text())
    return {"n_max": int(data["n_max"]), "p_min": float(data["p_min"])}


def validation_prompts(artifact: Path, per_task: int) -> list[Prompt]:
    """The artifact's validation prompts, up to `per_task` of each task, in the shipped sets' order."""
    manifest = json.loads((Path(artifact) / "manifest.json").read_text())
    ids = set(manifest["training"]["val_prompt_ids"])
    picked: list[Prompt] = []
    count: dict[str, int] = {}
    for task in TASKS:
        for p in load_prompts(DATA_DIR / f"{task}-train.jsonl"):
            if p.id in ids and count.get(task, 0) < per_task:
                picked.append(p)
                count[task] = count.get(task, 0) + 1
    return picked


def tuning_record(results: list[dict], prompts: Sequence[Prompt], max_new_tokens: int, engine: dict) -> dict:
    """What TUNED_FILE holds: the fastest setting of the grid `results` (rows of measure()), and the grid."""
    best = max(results, key=lambda r: r["tok_s"])
    return {
        "n_max": best["n_max"],
        "p_min": best["p_min"],
        "criterion": CRITERION,
        "prompts": [p.id for p in prompts],
        "max_new_tokens": max_new_tokens,
        "grid": results,
        "engine": engine,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def tune_server(
    artifact: Path,
    per_task: int = 3,
    max_new_tokens: int = 128,
    n_max: Sequence[int] = SERVER_TUNING_N_MAX,
    p_min: Sequence[float] = SERVER_TUNING_P_MIN,
) -> dict:
    """Measure llama-server -md at every (n_max, p_min) on the embedded pair (llama.cpp), write the record
    beside `artifact` and return it. Each grid row is printed to stderr as it is measured."""
    from disco.base.options import PairOptions
    from disco.engines.llamacpp.llamacpp_server import LlamaServer, server_binary
    from disco.loop.engine_registry import as_engine
    from disco.loop.pair import load_pair

    pair = load_pair(PairOptions(engine="llama.cpp"))
    target, draft = as_engine(pair.target), as_engine(pair.draft)
    prompts = validation_prompts(artifact, per_task)
    encoded = [pair.encode(p.prompt) for p in prompts]
    grid = list(itertools.product(n_max, p_min))
    print(f"{len(prompts)} validation prompts x {len(grid)} settings", file=sys.stderr)
    binary = server_binary()
    results = []
    for n, p in grid:
        with LlamaServer(
            target.path,
            draft.path,
            threads=target.threads,
            ctx=target.n_ctx,
            binary=binary,
            n_max=n,
            p_min=p,
            progress=False,
        ) as srv:
            wall = tokens = drafted = accepted = 0
            for ids in encoded:
                r = srv.complete(ids, max_new_tokens)
                wall += r["wall_s"]
                tokens += len(r["tokens"])
                drafted += r["draft_n"] or 0
                accepted += r["draft_n_accepted"] or 0
        row = {
            "n_max": n,
            "p_min": p,
            "wall_s": wall,
            "tokens": tokens,
            "tok_s": tokens / wall,
            "acceptance": accepted / drafted if drafted else None,
        }
        results.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    record = tuning_record(results, prompts, max_new_tokens, pair.describe()["engine"])
    atomic_write_json(Path(artifact) / TUNED_FILE, record)
    return record
