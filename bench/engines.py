"""The engine table (bench/results/llamacpp.md, "Engine table"): the embedded pair on torch float32 (onednn)
and on llama.cpp (Q4_K_M target; the draft as shipped and re-quantized to Q4_0), in one run.

Per engine: draft and target ms per token, verify(k)/decode(1) for k = 1..16 (llama.cpp: batched
as fast verification runs it, and split at the exact width as exact verification runs it), the
bytes of weights a target step reads and the floor they imply at the machine's memory bandwidth,
and target-only greedy tokens/s on the same prompts, engines interleaved per prompt.

    .venv/bin/python bench/engines.py --json bench/llamacpp/engines.json

Needs the embedded pair prepared for both engines (`disco models prepare` converts it for torch).
Run it alone: two engines' model processes on 2 cores slow each other.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cpu_backends import bandwidth_gbs, say  # noqa: E402

from disco.base.options import PairOptions
from disco.engines.llamacpp.llamacpp import verify_mode  # noqa: E402
from disco.engines.torch.cpu_backends import linear_weight_bytes  # noqa: E402
from disco.formats.prompts import DATA_DIR, load_prompts  # noqa: E402
from disco.jobs.profile import profile_pair  # noqa: E402
from disco.loop.decode import DecodeConfig, target_generate  # noqa: E402
from disco.loop.engine_registry import as_engine  # noqa: E402
from disco.loop.pair import load_pair  # noqa: E402

KS = list(range(1, 17))


def gguf_step_bytes(path: Path) -> int:
    """Bytes of a GGUF's tensors one decode step reads: all but the token embedding (one row of it)."""
    from gguf import GGUFReader

    return sum(int(t.n_bytes) for t in GGUFReader(str(path)).tensors if t.name != "token_embd.weight")


def measure(label: str, pair, repeats: int) -> dict:
    say(f"{label}: profiling")
    prof = profile_pair(pair, max_window=len(KS) - 1, repeats=repeats, warmup=2, progress=False)
    target = as_engine(pair.target)
    out = {
        "engine": pair.describe()["engine"],
        "draft_ms": prof["c_d"] * 1e3,
        "target_ms": prof["c_t"][0] * 1e3,
        "verify_ratio": dict(zip(KS, prof["c_t_ratio"])),
    }
    if target.name == "torch":
        out["target_bytes"] = linear_weight_bytes(pair.target)
    else:
        out["target_bytes"] = gguf_step_bytes(target.path)
        out["exact_width"] = target.exact_width
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7, help="timed forwards per measurement (median kept)")
    ap.add_argument("--prompts", type=int, default=2, help="test prompts per task for target-only tokens/s")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    run: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "threads": os.cpu_count(),
        "load": os.getloadavg(),
        "bandwidth_gbs": bandwidth_gbs(),
    }
    say(f"memory bandwidth {run['bandwidth_gbs']:.1f} GB/s")
    pairs = {
        "torch float32 (onednn)": load_pair(PairOptions(engine="torch", device="cpu")),
        "llama.cpp (draft Q4_K_M as shipped)": load_pair(
            PairOptions(engine="llama.cpp", verify="fast", draft_quant="none")
        ),
        "llama.cpp (draft re-quantized to Q4_0)": load_pair(
            PairOptions(engine="llama.cpp", verify="fast", draft_quant="q4_0")
        ),
    }
    rows = {}
    for label, pair in pairs.items():
        rows[label] = measure(label, pair, args.repeats)
    llama = pairs["llama.cpp (draft re-quantized to Q4_0)"]
    with verify_mode(llama, "exact"):  # exact verification: the same target, split at the exact width
        say("llama.cpp exact verification: profiling")
        prof = profile_pair(llama, max_window=len(KS) - 1, repeats=args.repeats, warmup=2, progress=False)
    rows["llama.cpp (draft re-quantized to Q4_0)"]["verify_ratio_exact"] = dict(zip(KS, prof["c_t_ratio"]))

    # target-only greedy decoding, engines interleaved per prompt: the same Q4_K_M weights, dequantized
    # to float32 on torch and as they are on llama.cpp (the outputs may differ slightly)
    prompts = [
        p for task in ("code", "explain", "write") for p in load_prompts(DATA_DIR / f"{task}-test.jsonl", args.prompts)
    ]
    config = DecodeConfig(max_new_tokens=args.max_new_tokens)
    tps: dict[str, list[tuple[int, float]]] = {
        k: [] for k in ("torch float32 (onednn)", "llama.cpp (draft Q4_K_M as shipped)")
    }
    for i, item in enumerate(prompts):
        order = list(tps) if i % 2 == 0 else list(reversed(tps))
        for label in order:
            pair = pairs[label]
            res = target_generate(pair.target, pair.encode(item.prompt), config, pair.eos_token_ids)
            tps[label].append((res.stats.new_tokens, res.stats.wall_s))
            say(f"{label} target-only {item.id}: {res.stats.tokens_per_s:.2f} tok/s")
    for label, runs in tps.items():
        rows[label]["target_only_tok_s"] = sum(n for n, _ in runs) / sum(w for _, w in runs)
        rows[label]["target_only_tok_s_median"] = statistics.median(n / w for n, w in runs)
    rows["llama.cpp (draft re-quantized to Q4_0)"]["target_only_tok_s"] = rows["llama.cpp (draft Q4_K_M as shipped)"][
        "target_only_tok_s"
    ]
    run["bandwidth_gbs_end"] = bandwidth_gbs()
    run["rows"] = rows
    bw = (run["bandwidth_gbs"] + run["bandwidth_gbs_end"]) / 2
    print(table(rows, bw))
    t, lc = rows["torch float32 (onednn)"], rows["llama.cpp (draft Q4_K_M as shipped)"]
    print(
        f"\nllama.cpp target-only / torch float32 target-only: {lc['target_only_tok_s'] / t['target_only_tok_s']:.2f}x "
        f"({lc['target_only_tok_s']:.2f} vs {t['target_only_tok_s']:.2f} tok/s, {len(prompts)} prompts x "
        f"{args.max_new_tokens} tokens); memory bandwidth {run['bandwidth_gbs']:.1f} / {run['bandwidth_gbs_end']:.1f} GB/s"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(run, indent=2) + "\n")


def table(rows: dict, bw: float) -> str:
    head = (
        ["engine", "draft ms", "target ms", "draft/target"]
        + [f"verify({k})/1" for k in (2, 3, 4, 8, 16)]
        + ["target GB/step", "floor ms", "step/floor", "target-only tok/s"]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, r in rows.items():
        floor = r["target_bytes"] / (bw * 1e9) * 1e3
        ratios = [
            f"{r['verify_ratio'][k]:.2f}"
            + (f" / {r['verify_ratio_exact'][k]:.2f} exact" if "verify_ratio_exact" in r else "")
            for k in (2, 3, 4, 8, 16)
        ]
        lines.append(
            "| "
            + " | ".join(
                [
                    label,
                    f"{r['draft_ms']:.1f}",
                    f"{r['target_ms']:.1f}",
                    f"{r['draft_ms'] / r['target_ms']:.2f}",
                    *ratios,
                    f"{r['target_bytes'] / 1e9:.2f}",
                    f"{floor:.1f}",
                    f"{r['target_ms'] / floor:.2f}",
                    f"{r.get('target_only_tok_s', float('nan')):.2f}",
                ]
            )
            + " |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
