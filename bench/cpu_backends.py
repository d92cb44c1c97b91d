"""Benchmark the CPU backends (disco/engines/torch/cpu_backends.py) on the embedded pair: where a step's time goes.

    .venv/bin/python bench/cpu_backends.py [--backends eager,transposed,onednn,int8] [--threads N]
                                           [--json bench/cpu_backends.json]

Per backend: draft decode step, target decode step, target verify(k)/decode(1), target-only
greedy tokens/s and whether its greedy output equals float32 eager's, and one speculative run
(threshold policy, transformers' defaults) checked against the same backend's target-only
output. Plus the machine's memory bandwidth (1 GiB tensor copy, read + write bytes) at the
start and the end, and the floor it implies for a step: Linear weight bytes / bandwidth.

The machine is shared and noisy, so each backend is timed interleaved with float32 eager
(round by round, alternating the order) and every figure is a median. At most two copies of
a model's weights are held at once (eager, memory-mapped, plus the converted one).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from disco.base.defaults import CPU_BACKEND_HELP, CPU_BACKENDS  # noqa: E402
from disco.engines.torch.cpu_backends import FLOAT32_EXACT, apply_cpu_backend, linear_weight_bytes  # noqa: E402
from disco.engines.torch.torch_engine import _forward  # noqa: E402
from disco.engines.torch.torch_engine_cache import new_cache, rewind  # noqa: E402
from disco.formats.prompts import DATA_DIR, load_prompts  # noqa: E402
from disco.jobs.profile import context_ids  # noqa: E402
from disco.loop.decode import DecodeConfig, speculative_generate, target_generate  # noqa: E402
from disco.policies.policy import ThresholdPolicy  # noqa: E402
from disco.sources import embedded  # noqa: E402
from disco.sources.hub import encode_prompt, eos_ids, load_model, load_tokenizer  # noqa: E402

CPU = torch.device("cpu")


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def rss_gib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def bandwidth_gbs(n_bytes: int = 1 << 30, reps: int = 7) -> float:
    """Large tensor copy: (read + write bytes) / median time, GB/s."""
    a = torch.ones(n_bytes // 4)
    b = torch.empty_like(a)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        b.copy_(a)
        times.append(time.perf_counter() - t0)
    return 2 * n_bytes / statistics.median(times) / 1e9


def load(path: str, backend: str) -> tuple[torch.nn.Module, float]:
    model = load_model(path, CPU, torch.float32)
    t0 = time.perf_counter()
    apply_cpu_backend(model, backend)
    gc.collect()
    return model, time.perf_counter() - t0


@torch.inference_mode()
def time_steps(models: dict[str, torch.nn.Module], context: list[int], ks: list[int], reps: int) -> dict:
    """Median seconds of one forward over k new tokens after `context` (cache cropped back after
    each), for every model, interleaved: rep by rep, k by k, alternating the model order."""
    ctx = torch.tensor(context)
    feed = torch.tensor(context[: max(ks)])  # realistic tokens (verification feeds text-like ids)
    caches = {}
    for name, m in models.items():
        caches[name] = new_cache(m)
        _forward(m, caches[name], ctx, 1)
    times = {name: {k: [] for k in ks} for name in models}
    order = list(models)
    for rep in range(reps + 1):  # rep 0 warms up
        for k in ks:
            for name in order:
                t0 = time.perf_counter()
                _forward(models[name], caches[name], feed[:k], k)
                dt = time.perf_counter() - t0
                rewind(caches[name], k)  # back to the context
                if rep:
                    times[name][k].append(dt)
        order.reverse()
    return {name: {k: statistics.median(v) for k, v in per.items()} for name, per in times.items()}


def generate_all(target, draft, prompts: list[list[int]], max_new: int, eos) -> dict:
    cfg = DecodeConfig(max_new_tokens=max_new)
    out = {"tokens": [], "new": 0, "wall": 0.0}
    for ids in prompts:
        if draft is None:
            res = target_generate(target, ids, cfg, eos)
        else:
            res = speculative_generate(target, draft, ids, ThresholdPolicy(), cfg, eos)
        out["tokens"].append(res.tokens)
        out["new"] += res.stats.new_tokens
        out["wall"] += res.stats.wall_s
        if draft is not None:
            out.setdefault("target_forwards", 0)
            out["target_forwards"] += res.stats.target_forwards
            out.setdefault("accepted", 0)
            out["accepted"] += res.stats.accepted
            out.setdefault("drafted", 0)
            out["drafted"] += res.stats.drafted
    out["tok_s"] = out["new"] / out["wall"]
    return out


def first_diff(a: list[list[int]], b: list[list[int]]) -> str:
    """'64/64' per prompt: tokens equal before the first difference / generated."""
    parts = []
    for x, y in zip(a, b):
        n = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
        parts.append(f"{n}/{len(x)}" if x != y else "=")
    return " ".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default=",".join(CPU_BACKENDS))
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--context", type=int, default=100, help="tokens in the KV cache while timing steps")
    ap.add_argument("--ks", default="1,2,4,8,16", help="verify lengths (new tokens per target forward)")
    ap.add_argument("--reps", type=int, default=5, help="timed rounds per target measurement")
    ap.add_argument("--draft-reps", type=int, default=10, help="timed rounds per draft measurement")
    ap.add_argument("--gen-tokens", type=int, default=64, help="greedy tokens per prompt")
    ap.add_argument("--prompts", default="code-test.jsonl,explain-test.jsonl", help="first prompt of each file")
    ap.add_argument("--no-spec", action="store_true", help="skip the speculative runs")
    ap.add_argument("--json", type=Path, default=None, help="write every number here")
    args = ap.parse_args()

    backends = args.backends.split(",")
    for b in backends:
        if b not in CPU_BACKENDS:
            ap.error(f"unknown backend {b!r}: choose from {CPU_BACKENDS}")
    if args.threads:
        torch.set_num_threads(args.threads)
    ks = [int(k) for k in args.ks.split(",")]
    if 1 not in ks:
        ks = [1] + ks
    target_dir, draft_dir = (str(p) for p in embedded.prepare_pair(install=False))
    tok = load_tokenizer(target_dir)
    context = context_ids(tok, args.context)
    prompts = [encode_prompt(tok, load_prompts(DATA_DIR / f, 1)[0].prompt, True) for f in args.prompts.split(",")]
    run = {
        "command": "python " + " ".join(sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{torch.backends.cpu.get_cpu_capability()}",
        "loadavg_start": os.getloadavg(),
        "bandwidth_gbs_start": bandwidth_gbs(),
        "backends": {},
    }
    say(f"bandwidth {run['bandwidth_gbs_start']:.1f} GB/s; threads {torch.get_num_threads()}; load {os.getloadavg()}")

    # Float32 eager: the reference outputs (and its own generation speed).
    e_t, _ = load(target_dir, "eager")
    e_d, _ = load(draft_dir, "eager")
    eos = eos_ids(e_t, tok)
    ref = generate_all(e_t, None, prompts, args.gen_tokens, eos)
    say(f"eager target-only {ref['tok_s']:.2f} tok/s")
    eager_spec = None if args.no_spec else generate_all(e_t, e_d, prompts, args.gen_tokens, eos)
    del e_t, e_d
    gc.collect()

    for b in backends:
        say(f"--- {b}")
        row: dict = {"help": CPU_BACKEND_HELP[b], "float32_exact": b in FLOAT32_EXACT}
        # Target steps, interleaved with eager.
        e_t, _ = load(target_dir, "eager")
        models = {"eager": e_t}
        if b != "eager":
            models[b], row["convert_s_target"] = load(target_dir, b)
        row["rss_gib_target_phase"] = rss_gib()
        steps = time_steps(models, context, ks, args.reps)
        row["target_step_s"] = steps[b]
        row["eager_target_step_s"] = steps["eager"]
        row["target_bytes"] = linear_weight_bytes(models[b])
        b_t = models[b]
        del models, e_t
        gc.collect()
        # Draft steps, interleaved with eager.
        e_d, _ = load(draft_dir, "eager")
        models = {"eager": e_d}
        if b != "eager":
            models[b], row["convert_s_draft"] = load(draft_dir, b)
        steps = time_steps(models, context, [1], args.draft_reps)
        row["draft_step_s"] = steps[b][1]
        row["eager_draft_step_s"] = steps["eager"][1]
        row["draft_bytes"] = linear_weight_bytes(models[b])
        b_d = models[b]
        del models, e_d
        gc.collect()
        # Generation: target-only greedy vs float32 eager's, then speculative vs its own target-only.
        if b == "eager":
            gen = ref
        else:
            gen = generate_all(b_t, None, prompts, args.gen_tokens, eos)
        row["target_only_tok_s"] = gen["tok_s"]
        row["greedy_vs_eager"] = first_diff(gen["tokens"], ref["tokens"])
        if not args.no_spec:
            spec = eager_spec if b == "eager" else generate_all(b_t, b_d, prompts, args.gen_tokens, eos)
            row["spec_tok_s"] = spec["tok_s"]
            row["spec_speedup"] = spec["tok_s"] / gen["tok_s"]
            row["spec_lossless"] = spec["tokens"] == gen["tokens"]
            row["spec_accepted"] = f"{spec['accepted']}/{spec['drafted']}"
            row["spec_target_forwards"] = spec["target_forwards"]
        row["gen_tokens"] = gen["tokens"]
        run["backends"][b] = row
        say(
            f"{b}: target step {1e3 * row['target_step_s'][1]:.0f} ms, verify(8)/1 "
            f"{row['target_step_s'].get(8, float('nan')) / row['target_step_s'][1]:.2f}, "
            f"draft {1e3 * row['draft_step_s']:.0f} ms, greedy vs eager {row['greedy_vs_eager']}"
        )
        del b_t, b_d
        gc.collect()

    run["bandwidth_gbs_end"] = bandwidth_gbs()
    run["loadavg_end"] = os.getloadavg()
    print(format_table(run, ks))
    if args.json:
        args.json.write_text(json.dumps(run, indent=1, default=str))
        say(f"wrote {args.json}")


def format_table(run: dict, ks: list[int]) -> str:
    bw = statistics.mean([run["bandwidth_gbs_start"], run.get("bandwidth_gbs_end", run["bandwidth_gbs_start"])])
    head = [
        "backend",
        "numerics",
        "draft step ms",
        "target step ms",
        "eager target step ms (same rounds)",
        *[f"verify({k})/1" for k in ks if k != 1],
        "target GB/step",
        "floor ms",
        "step/floor",
        "target-only tok/s",
        "greedy = eager",
        "spec tok/s",
        "spec speedup",
        "spec = own target-only",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for b, r in run["backends"].items():
        s = r["target_step_s"]
        floor = r["target_bytes"] / (bw * 1e9)
        cells = [
            b,
            "float32" if r["float32_exact"] else "int8",
            f"{1e3 * r['draft_step_s']:.0f}",
            f"{1e3 * s[1]:.0f}",
            f"{1e3 * r['eager_target_step_s'][1]:.0f}",
            *[f"{s[k] / s[1]:.2f}" for k in ks if k != 1],
            f"{r['target_bytes'] / 1e9:.2f}",
            f"{1e3 * floor:.0f}",
            f"{s[1] / floor:.2f}",
            f"{r['target_only_tok_s']:.2f}",
            r["greedy_vs_eager"],
            f"{r.get('spec_tok_s', float('nan')):.2f}",
            f"{r.get('spec_speedup', float('nan')):.2f}x",
            str(r.get("spec_lossless", "-")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        f"memory bandwidth (1 GiB copy, read+write): {run['bandwidth_gbs_start']:.1f} GB/s at the start, "
        f"{run.get('bandwidth_gbs_end', float('nan')):.1f} GB/s at the end; floor = Linear weight bytes / "
        f"{bw:.1f} GB/s. Load average {run['loadavg_start']} → {run.get('loadavg_end')}."
    )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
