"""Collection rate (issue 32): `disco collect` on each engine (default vllm, then llama.cpp) over the first N shipped train prompts (round-robin over code/explain/write) x 128 tokens, each in its own process; prompts/hour and the share of time in generation vs teacher-forced features. Rerun: python bench/collect_rate.py [--n 24] [--engines vllm,llama.cpp] [--max-batch 32] [--target T --draft D] [--json OUT.json]"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from disco.base.defaults import DEFAULT_COLLECT_MAX_BATCH  # noqa: E402
from disco.base.machine import this_machine  # noqa: E402
from disco.formats.prompts import load_prompt_sources  # noqa: E402
from disco.jobs.collect import round_robin  # noqa: E402

TRAIN_SETS = ("code-train", "explain-train", "write-train")  # the 273 shipped train prompts
SUMMARY = re.compile(
    r"traced (\d+) prompts \((\d+) already done\), (\d+) rows, (\d+) tokens in ([\d.]+)s: "
    r"generation ([\d.]+)s, teacher-forced ([\d.]+)s"
)


def write_prompts(n: int, path: Path) -> int:
    """The first n shipped train prompts, one task after another (as collect itself orders them)."""
    prompts = load_prompt_sources(list(TRAIN_SETS))
    chosen = [prompts[i] for i in round_robin(range(len(prompts)), [p.task for p in prompts])[:n]]
    path.write_text("".join(json.dumps({"id": p.id, "task": p.task, "prompt": p.prompt}) + "\n" for p in chosen))
    return len(chosen)


def run(engine: str, prompts: Path, out: Path, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, "cli.py", "collect", "--engine", engine, "--prompts", str(prompts), "--out", str(out)]
    cmd += ["--max-new-tokens", str(args.max_new_tokens)]
    if engine == "vllm":
        cmd += ["--max-batch", str(args.max_batch)]
    if args.target:
        cmd += ["--target", args.target, "--draft", args.draft]
    cmd += args.extra
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    process_s = time.perf_counter() - t0
    found = SUMMARY.search(proc.stderr)
    if proc.returncode != 0 or found is None:
        raise SystemExit(f"{engine}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    traced, _, rows, tokens, wall, gen, feats = found.groups()
    traced, wall, gen, feats = int(traced), float(wall), float(gen), float(feats)
    return {
        "engine": engine,
        "command": " ".join(cmd),
        "prompts": traced,
        "rows": int(rows),
        "tokens": int(tokens),
        "collect_s": wall,  # collect() itself: from the prompts to the last shard (vLLM's start included)
        "process_s": round(process_s, 1),  # also imports and loading the pair
        "generation_s": gen,
        "features_s": feats,
        "prompts_per_hour": round(3600 * traced / wall, 1),
        "prompts_per_hour_process": round(3600 * traced / process_s, 1),
        "generation_share": round(gen / (gen + feats), 3) if gen + feats else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=24, help="shipped train prompts (273 at most)")
    ap.add_argument("--engines", default="vllm,llama.cpp", help="comma-separated, run in this order")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--max-batch", type=int, default=DEFAULT_COLLECT_MAX_BATCH, help="vLLM: requests at once")
    ap.add_argument("--target", help="a target folder (default: the embedded pair)")
    ap.add_argument("--draft", help="its draft (with --target)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("extra", nargs="*", help="more `disco collect` options, after --")
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="collect-rate-") as tmp:
        prompts = Path(tmp) / "prompts.jsonl"
        n = write_prompts(args.n, prompts)
        for engine in args.engines.split(","):
            print(f"{engine}: collecting {n} prompts x {args.max_new_tokens} tokens ...", file=sys.stderr, flush=True)
            results.append(run(engine, prompts, Path(tmp) / engine.replace(".", "-"), args))
    print("| engine | prompts | tokens | collect (s) | process (s) | prompts/hour | generation | features |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        share = r["generation_share"]
        print(
            f"| {r['engine']} | {r['prompts']} | {r['tokens']} | {r['collect_s']:.1f} | {r['process_s']:.1f} "
            f"| {r['prompts_per_hour']:.0f} | {share:.0%} | {1 - share:.0%} |"
        )
    if len(results) > 1:
        base = results[-1]
        for r in results[:-1]:
            ratio = r["prompts_per_hour"] / base["prompts_per_hour"]
            print(
                f"\n{r['engine']} collects {ratio:.2f}x the prompts per hour of {base['engine']} (collect's own time)"
            )
    if args.json:
        args.json.write_text(json.dumps({"machine": this_machine(), "n": n, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
