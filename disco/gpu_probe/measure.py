"""The CUDA path, measured in one shot (issue 25): losslessness of every policy and the cost model, on
random-weight models with the embedded pair's (and a realistic pair's) exact architectures.

Step costs do not depend on the weights' values, nor does losslessness, so nothing heavy travels:

  * shape pairs (configs/shapes/*.json): bf16 models with random weights in the embedded target's and
    draft's configurations, and Llama-3.1-8B / Llama-3.2-1B: `disco profile`'s c_d and c_t(1..21) on
    each path, written as profiles that `disco train --profile` and `CostModel.load` read;
  * a noise pair: the first shape pair's target, and as its draft the same weights plus noise (the
    noise level calibrated so that about 70% of draft tokens are accepted): every policy through
    disco's loop, greedy output compared token for token with target-only decoding on the same path.

Paths (the torch engine's --cache / --compile): `dynamic` (DynamicCache, eager), `static` (StaticCache,
eager), `static-compiled` (StaticCache, each step compiled per verify-width bucket with CUDA graphs;
CUDA only: skipped elsewhere, never imitated) and `static-padded` (StaticCache, eager, feeds padded to
the same buckets as the compiled path: the compiled path's bookkeeping without the compiler, for CPUs).

    python bench/gpu_probe.py --out OUT                      # GPU defaults (bash bench/gpu_probe.sh)
    python bench/gpu_probe.py --device cpu --tiny --out OUT  # tiny shapes, end to end on a CPU

Writes OUT/profile-<shapes>-<path>.json (one per shape pair and path) and OUT/summary.json (losslessness
per path and policy, the profiles' ratios, compile times, the issue's goals), the summary rewritten after
every phase so that a run cut short keeps what it measured. Phases run in order of value (the embedded
shapes first: dynamic, compiled, static; then the next shape pair) and one that would not fit in
--budget-s is skipped and says so. disco.gpu_probe.speedups (bench/gpu_simulate.py) turns the profiles into speedups on traces.

Needs torch, numpy and transformers >= 5.16.1 (the GPU image's 5.17 will do: the torch engine passes the
KV cache by the keyword the model's forward takes, and rolls static caches back without StaticLayer.crop);
lightgbm only for the shipped classifier (skipped without it). No pandas, pyarrow,
sklearn, typer, gguf or llama_cpp on this path (threshold-adaptive runs only where sklearn is there).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from disco.base import shipped
from disco.base.defaults import DEFAULT_K, DEFAULT_MAX_WINDOW, DEFAULT_THRESHOLD
from disco.core.cost import CostModel
from disco.core.features import FEATURES, TOKEN_CLASSES
from disco.engines.torch.torch_engine import TorchEngine
from disco.engines.torch.torch_engine_cache import BUCKETS, CapturedSteps
from disco.gpu_probe.shapes import (
    TINY,
    TINY_DRAFT,
    Clock,
    IdsTokenizer,
    TokenClasses,
    build_model,
    calibrate_noise,
    check_transformers,
    load_shapes,
    log,
    n_params,
    sync,
)
from disco.jobs.profile import profile_pair
from disco.loop.decode import DecodeConfig, speculative_generate, target_generate
from disco.loop.pair import pair_from_models
from disco.policies.artifact import load_artifact
from disco.policies.artifact_models import DenseModel
from disco.policies.classifier import ClassifierPolicy
from disco.policies.policy_registry import make_policy

ROOT = shipped.root()  # configs/shapes, models/: the checkout, or the wheel's copy (disco/base/shipped.py)
SHAPES = (ROOT / "configs/shapes/embedded-qwen2.5-coder.json", ROOT / "configs/shapes/llama-3.1-8b__llama-3.2-1b.json")
ARTIFACT = ROOT / "models/embedded-qwen2.5-coder"  # the shipped torch classifier (LightGBM)
PATHS = ("dynamic", "static", "static-compiled", "static-padded")
CUDA_PATHS = ("dynamic", "static-compiled", "static")  # in order of value: the captured path before static eager
CPU_PATHS = ("dynamic", "static", "static-padded")  # static-compiled needs CUDA graphs
TIE_ULPS = 4  # a divergence where the target's top-2 logits lie within this many ulps is a rounding tie
GOALS = {"captured c_d / c_t(1)": 0.45, "captured c_t(8) / c_t(1)": 1.3}  # <= (issue 25); speedup: gpu_simulate


# --- paths ----------------------------------------------------------------------------------------


def set_path(models, path: str, draft_buckets: tuple[int, ...]) -> None:
    """Put every model on a path (TorchEngine's --cache / --compile); `models`: [(model, role)]."""
    for model, role in models:
        engine = TorchEngine.of(model).set_cache("dynamic" if path == "dynamic" else "static")
        buckets = BUCKETS if role == "target" else draft_buckets
        if path == "static-compiled":
            engine.set_compile(True, buckets)
        else:
            engine.set_compile(False)
            if path == "static-padded":  # the compiled path's padding and bookkeeping, run eagerly
                engine.steps = CapturedSteps(model, buckets, compiled=False)


@torch.inference_mode()  # as the decodes run (a graph compiled with grad mode on is not reused under it)
def warm_up(model, capacity: int, clock: Clock, reserve_s: float) -> dict:
    """Compile (and capture) each of a model's buckets as TorchEngine.warm_up does, timed per bucket;
    stops when less than `reserve_s` of the budget is left (the caller then skips the path's profile and
    checks: the buckets left would compile inside them)."""
    engine = TorchEngine.of(model)
    device = engine.device
    session = engine.session(torch.zeros(1, dtype=torch.long, device=device), capacity=capacity)
    tokens = torch.zeros(max(engine.steps.buckets), dtype=torch.long, device=device)
    times = {}
    for width in engine.steps.buckets:
        if clock.left() < reserve_s:
            times["stopped"] = f"budget: {clock.left():.0f} s left before bucket {width}"
            break
        sync(device)
        t0 = time.perf_counter()
        for _ in range(3):  # CUDA graph trees record on a later call than the first
            session.forward(tokens[:width], 1)
            session.truncate(1)
        sync(device)
        times[width] = time.perf_counter() - t0
    return times


def dynamo_counters() -> dict:
    """What dynamo and inductor report: graphs compiled, frames, CUDA graph skips, the recompile limit."""
    try:
        import torch._dynamo as dynamo
        from torch._dynamo.utils import counters
    except Exception as e:  # noqa: BLE001
        return {"error": repr(e)}
    limit = getattr(dynamo.config, "recompile_limit", None) or getattr(dynamo.config, "cache_size_limit", None)
    return {
        "recompile_limit": limit,
        "stats": dict(counters.get("stats", {})),
        "frames": dict(counters.get("frames", {})),
        "cudagraph": {k: v for k, v in counters.get("inductor", {}).items() if "cudagraph" in k},
    }


# --- policies -------------------------------------------------------------------------------------


def stub_classifier() -> DenseModel:
    """A logistic model on the drafted token's probability, P(accept) = sigmoid(8 p - 4): the classifier
    policy's whole feature pipeline and rules, without a trained model."""
    W = np.zeros((len(FEATURES), 1))
    W[FEATURES.index("p_chosen"), 0] = 8.0
    return DenseModel("logistic", np.zeros(len(FEATURES)), np.ones(len(FEATURES)), [(W, np.array([-4.0]))])


def policies(vocab: int, device: torch.device, cost: CostModel, artifact, skipped: dict) -> dict:
    """{name: factory(target-only output) -> a fresh policy}: every policy, the classifier as a stub under the
    token and the cost-adaptive rules, and as shipped (when lightgbm is there)."""
    classes = torch.arange(vocab, device=device) % len(TOKEN_CLASSES)  # no text: a synthetic class table
    stub = stub_classifier()
    out = {
        "constant": lambda y: make_policy("constant", k=DEFAULT_K),
        "heuristic": lambda y: make_policy("heuristic", k=DEFAULT_K),
        "threshold": lambda y: make_policy("threshold", threshold=DEFAULT_THRESHOLD),
        "adaedl": lambda y: make_policy("adaedl", max_window=DEFAULT_MAX_WINDOW),
        "svip": lambda y: make_policy("svip"),
        "oracle": lambda y: make_policy("oracle", target_tokens=y),
        "classifier-stub": lambda y: ClassifierPolicy(stub, 0.5, classes),
        "classifier-stub-cost-adaptive": lambda y: ClassifierPolicy(
            stub, 1.0, classes, rule="cost-adaptive", cost=cost
        ),
    }
    try:
        import sklearn.metrics  # noqa: F401  (transformers' ROC update of the threshold)

        out["threshold-adaptive"] = lambda y: make_policy("threshold", threshold=DEFAULT_THRESHOLD, adaptive=True)
    except ImportError:
        skipped["threshold-adaptive"] = "scikit-learn not installed"
    if artifact is not None:
        out["classifier-shipped"] = lambda y: ClassifierPolicy.for_pair(artifact, TokenClasses(classes))
    return out


def load_shipped(path: Path, skipped: dict):
    try:
        return load_artifact(path)
    except Exception as e:  # noqa: BLE001  (lightgbm missing: the artifact's model file cannot be read)
        skipped["classifier-shipped"] = f"{path}: {str(e).splitlines()[0]}"
        return None


# --- checks ---------------------------------------------------------------------------------------


def divergence(y: list[int], got: list[int], rows: torch.Tensor, dtype: torch.dtype) -> dict:
    """Where a policy's output first leaves the target-only output, and whether the target's own logits
    there were a rounding tie (their top-2 within TIE_ULPS ulps of the dtype) or a real disagreement."""
    i = next((j for j, (a, b) in enumerate(zip(y, got)) if a != b), min(len(y), len(got)))
    out = {"index": i, "lengths": [len(y), len(got)]}
    if i < min(len(y), len(got)):
        row = rows[i].float()
        margin = float(row[y[i]] - row[got[i]])
        tol = TIE_ULPS * torch.finfo(dtype).eps * max(abs(float(row[y[i]])), 1.0)
        out.update(
            target_token=y[i],
            policy_token=got[i],
            target_margin=margin,
            tie_tolerance=tol,
            kind="rounding tie" if margin <= tol else "MISMATCH",
        )
    return out


def check_lossless(target, draft, prompts, cfg, factories: dict, dtype: torch.dtype, clock: Clock) -> dict:
    """Every policy's greedy output vs target-only decoding on the same path, token for token (policies
    left when the budget is spent are skipped and say so)."""
    refs = []
    for p in prompts:
        rows: list[torch.Tensor] = []
        res = target_generate(target, p, cfg, frozenset(), target_rows=rows)
        refs.append((res.tokens, torch.cat(rows), res.stats.wall_s))
    out = {
        "target-only": {
            "tokens": sum(len(r[0]) for r in refs),
            "wall_s": sum(r[2] for r in refs),
            "outputs": [r[0] for r in refs],
        }
    }
    for name, make in factories.items():
        if clock.left() < 0:
            out[name] = {"identical": None, "skipped": "budget"}
            log(f"    {name}: skipped (budget)")
            continue
        entry = {
            "identical": True,
            "prompts": len(prompts),
            "tokens": 0,
            "drafted": 0,
            "accepted": 0,
            "target_forwards": 0,
            "draft_forwards": 0,
            "padded_tokens": 0,
            "wall_s": 0.0,
        }
        try:
            for (y, rows, _), p in zip(refs, prompts):
                res = speculative_generate(target, draft, p, make(y), cfg, frozenset())
                s = res.stats
                for key, value in (
                    ("tokens", s.new_tokens),
                    ("drafted", s.drafted),
                    ("accepted", s.accepted),
                    ("target_forwards", s.target_forwards),
                    ("draft_forwards", s.draft_forwards),
                    ("padded_tokens", s.padded_tokens),
                    ("wall_s", s.wall_s),
                ):
                    entry[key] += value
                if res.tokens != y:
                    entry["identical"] = False
                    entry.setdefault("divergences", []).append(divergence(y, res.tokens, rows, dtype))
        except Exception as e:  # noqa: BLE001  (recorded, and the next policy runs)
            entry["identical"] = None
            entry["error"] = "".join(traceback.format_exception_only(type(e), e)).strip()
            entry["traceback"] = traceback.format_exc().splitlines()[-12:]
        entry["acceptance"] = entry["accepted"] / entry["drafted"] if entry["drafted"] else None
        out[name] = entry
        log(
            f"    {name}: identical={entry['identical']} acceptance={entry['acceptance']}"
            + (f" ERROR {entry['error']}" if "error" in entry else "")
        )
    return out


def profile_summary(prof: dict) -> dict:
    ratio = prof["c_t_ratio"]
    return {
        "c_d_ms": prof["c_d"] * 1e3,
        "c_t1_ms": prof["c_t"][0] * 1e3,
        "c_d / c_t(1)": prof["c_d_ratio"],
        "c_t(k) / c_t(1)": {str(k): ratio[k - 1] for k in range(1, len(ratio) + 1)},
        "buckets": {str(b): ratio[b - 1] for b in BUCKETS if b <= len(ratio)},
        "compile_s": prof.get("compile_s"),
    }


# --- the run --------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", required=True, type=Path, help="folder for the profiles and summary.json")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    ap.add_argument("--tiny", action="store_true", help="tiny shapes of the same families (CPU tests)")
    ap.add_argument(
        "--shapes",
        nargs="+",
        type=Path,
        default=list(SHAPES),
        help="shape files (the first one's target also makes the noise pair)",
    )
    ap.add_argument(
        "--paths",
        nargs="+",
        choices=PATHS,
        help=f"default: {' '.join(CUDA_PATHS)} on CUDA, {' '.join(CPU_PATHS)} on a CPU",
    )
    ap.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "bfloat16", "float32", "float16"),
        help="auto: bfloat16 on CUDA, float32 on a CPU (as disco's own auto)",
    )
    ap.add_argument("--prompts", type=int, default=2, help="random prompts per losslessness check")
    ap.add_argument("--max-new-tokens", type=int, help="default 48 (--tiny: 24)")
    ap.add_argument("--repeats", type=int, help="timed forwards per profile figure (default 20; --tiny: 3)")
    ap.add_argument("--warmup", type=int, help="untimed forwards before each (default 3; --tiny: 1)")
    ap.add_argument("--context", type=int, help="cached tokens while timing (default 100; --tiny: 40)")
    ap.add_argument(
        "--draft-buckets",
        default="1",
        help="captured widths of drafts, comma-separated (a draft "
        "steps one token; wider catch-up feeds run eagerly on the same cache: one compile, not six)",
    )
    ap.add_argument("--noise", type=float, help="the noise pair's relative noise (default: calibrated)")
    ap.add_argument("--artifact", type=Path, default=ARTIFACT, help="the shipped classifier (needs lightgbm)")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=360.0,
        help="wall-clock budget: phases that would not fit "
        "are skipped (360 s: a 420 s device call leaves a second, shorter one inside 15 minutes)",
    )
    ap.add_argument(
        "--cpu-compile",
        action="store_true",
        help="let static-compiled run on a CPU: inductor's "
        "default mode, no CUDA graphs (slow: minutes; checks this script's compiled-path bookkeeping)",
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    small = args.tiny
    args.max_new_tokens = args.max_new_tokens or (24 if small else 48)
    args.repeats = args.repeats or (3 if small else 20)
    args.warmup = args.warmup if args.warmup is not None else (1 if small else 3)
    args.context = args.context or (40 if small else 100)
    args.draft_buckets = tuple(sorted(int(b) for b in args.draft_buckets.split(",")))
    args.paths = args.paths or (CUDA_PATHS if args.device == "cuda" else CPU_PATHS)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    clock = Clock(args.budget_s)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible (use --device cpu --tiny here)")
    dtype = {
        "auto": torch.bfloat16 if device.type == "cuda" else torch.float32,
        "bfloat16": torch.bfloat16,
        "float32": torch.float32,
        "float16": torch.float16,
    }[args.dtype]
    args.out.mkdir(parents=True, exist_ok=True)
    import transformers

    summary: dict = {
        "issue": 25,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "dtype": str(dtype).removeprefix("torch."),
        "tiny": args.tiny,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "budget_s": args.budget_s,
        "settings": {
            k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k not in ("shapes", "out")
        }
        | {"shapes": [str(s) for s in args.shapes]},
        "skipped": {},
        "shapes": {},
        "paths": {},
        "profiles": {},
        "goals": {},
    }

    def save() -> None:
        summary["wall_s"] = clock.elapsed()
        summary["dynamo"] = dynamo_counters()
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")

    refusal = check_transformers()
    if refusal:
        summary["refused"] = refusal
        save()
        log(refusal)
        raise SystemExit(2)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 runs mean float32 (bf16 is unaffected)
    elif args.tiny:
        torch.set_num_threads(1)  # tiny matrices gain nothing from threads, and a shared CPU loses to spinning
    artifact = load_shipped(args.artifact, summary["skipped"])
    cfg = DecodeConfig(max_new_tokens=args.max_new_tokens, max_window=DEFAULT_MAX_WINDOW)
    # the static cache every decode and profile reuses holds 256 positions (STATIC_ROUND): stay under it
    capacity = max(args.context + DEFAULT_MAX_WINDOW + 1, 48 + args.max_new_tokens)

    cpu_only_refused = device.type != "cuda" and not args.cpu_compile
    for si, shapes_file in enumerate(args.shapes):
        shapes = load_shapes(shapes_file)
        name = shapes.get("name", shapes_file.stem)
        if cpu_only_refused and set(args.paths) <= {"static-compiled"}:  # nothing to run: build nothing
            summary["paths"].setdefault("static-compiled", {})[name] = {
                "status": "skipped: needs CUDA (captured CUDA graphs)"
            }
            log(f"{name}/static-compiled: skipped: needs CUDA (captured CUDA graphs)")
            continue
        log(f"{name}: building random-weight models ({'tiny' if args.tiny else 'full'} shapes, {summary['dtype']})")
        t0 = time.perf_counter()
        target = build_model(
            shapes["target"]["config"], device, dtype, args.seed + 10 * si, TINY if args.tiny else None
        )
        draft = build_model(
            shapes["draft"]["config"], device, dtype, args.seed + 10 * si + 1, TINY_DRAFT if args.tiny else None
        )
        vocab = min(target.config.vocab_size, draft.config.vocab_size)
        gen = torch.Generator().manual_seed(args.seed + si)
        prompts = [
            torch.randint(3, vocab, (int(n),), generator=gen).tolist()
            for n in torch.randint(*((8, 14) if args.tiny else (16, 40)), (args.prompts,), generator=gen)
        ]
        info = {
            "target": {"name": shapes["target"].get("name"), "params": n_params(target)},
            "draft": {"name": shapes["draft"].get("name"), "params": n_params(draft)},
            "prompt_tokens": [len(p) for p in prompts],
        }
        models = [(target, "target"), (draft, "draft")]
        noisy = None
        if si == 0:  # the noise pair: the first shape pair's target and a noisy copy of it
            noisy, info["noise_pair"] = calibrate_noise(target, prompts, cfg, args.seed + 100, args.noise)
            models.append((noisy, "draft"))
            log(f"  noise pair: noise {info['noise_pair']['chosen']}, agreement {info['noise_pair']['agreement']:.2f}")
        info["build_s"] = time.perf_counter() - t0
        summary["shapes"][name] = info
        pair = pair_from_models(target, draft, IdsTokenizer(vocab), name)
        save()

        for path in args.paths:
            key = f"{name}/{path}"
            phase: dict = summary["paths"].setdefault(path, {}).setdefault(name, {})
            if path == "static-compiled" and cpu_only_refused:
                phase["status"] = "skipped: needs CUDA (captured CUDA graphs)"
                log(f"{key}: {phase['status']}")
                save()
                continue
            need = 150 if path == "static-compiled" else 30
            if clock.left() < need:
                phase["status"] = f"skipped: budget ({clock.left():.0f} s left, {need} s needed)"
                log(f"{key}: {phase['status']}")
                save()
                continue
            log(f"{key}: start ({clock.left():.0f} s of budget left)")
            t_phase = time.perf_counter()
            try:
                set_path(models, path, args.draft_buckets)
                if path == "static-compiled":
                    phase["compile_s"] = {}
                    # the noise draft has the target's shapes: dynamo reuses the target's graphs for it
                    for (model, _role), label in zip(models, ("target", "draft", "noise draft")):
                        phase["compile_s"][label] = warm_up(model, capacity, clock, reserve_s=60)
                        save()
                        log(f"  compiled {label}: {phase['compile_s'][label]}")
                        if "stopped" in phase["compile_s"][label]:
                            raise TimeoutError(phase["compile_s"][label]["stopped"])
                prof = profile_pair(pair, DEFAULT_MAX_WINDOW, args.context, args.repeats, args.warmup, progress=False)
                if "compile_s" in phase:  # the shape pair's own models
                    prof["compile_s"] = sum(
                        v
                        for label in ("target", "draft")
                        for v in phase["compile_s"][label].values()
                        if isinstance(v, float)
                    )
                prof["probe"] = {
                    "issue": 25,
                    "shapes": name,
                    "shapes_file": str(shapes_file),
                    "path": path,
                    "random_weights": True,
                    "tiny": args.tiny,
                    "captured_buckets": {"target": list(BUCKETS), "draft": list(args.draft_buckets)}
                    if path in ("static-compiled", "static-padded")
                    else None,
                }
                file = args.out / f"profile-{name}-{path}.json"
                file.write_text(json.dumps(prof, indent=1) + "\n")
                CostModel.load(file)  # what disco train --profile reads
                summary["profiles"][key] = {"file": file.name, **profile_summary(prof)}
                phase["profile"] = file.name
                log(
                    f"  profile: c_d/c_t(1) {prof['c_d_ratio']:.3f}, c_t(8)/c_t(1) {prof['c_t_ratio'][7]:.3f}, "
                    f"c_t(1) {prof['c_t'][0] * 1e3:.2f} ms"
                )
                save()
                cost = CostModel.from_dict(prof, file.name)
                if noisy is not None:
                    log("  losslessness, noise pair, every policy")
                    phase["lossless_noise_pair"] = check_lossless(
                        target,
                        noisy,
                        prompts,
                        cfg,
                        policies(vocab, device, cost, artifact, summary["skipped"]),
                        dtype,
                        clock,
                    )
                    save()
                log("  losslessness, shape pair, oracle")
                phase["lossless_shape_pair"] = check_lossless(
                    target,
                    draft,
                    prompts,
                    cfg,
                    {"oracle": lambda y: make_policy("oracle", target_tokens=y)},
                    dtype,
                    clock,
                )
                phase["status"] = "ok"
            except Exception as e:  # noqa: BLE001  (recorded; the next phase runs)
                phase["status"] = "error: " + "".join(traceback.format_exception_only(type(e), e)).strip()
                phase["traceback"] = traceback.format_exc().splitlines()[-15:]
                log(f"  {phase['status']}")
            phase["wall_s"] = time.perf_counter() - t_phase
            save()
        del target, draft, noisy, pair, models
        if device.type == "cuda":
            torch.cuda.empty_cache()

    summary["lossless"] = lossless_table(summary)
    summary["target_only_across_paths"] = across_paths(summary)
    summary["goals"] = goals(summary, args.shapes)
    save()
    log(f"done in {clock.elapsed():.0f} s: {args.out / 'summary.json'}")
    return summary


def lossless_table(summary: dict) -> dict:
    """{path: {pair/policy: True | False | None (error) | 'rounding tie'}}: the verdicts in one place."""
    out = {}
    for path, by_pair in summary["paths"].items():
        row = {}
        for name, phase in by_pair.items():
            for which in ("lossless_noise_pair", "lossless_shape_pair"):
                for policy, entry in phase.get(which, {}).items():
                    if policy == "target-only":
                        continue
                    verdict = f"skipped: {entry['skipped']}" if "skipped" in entry else entry["identical"]
                    if verdict is False and all(d.get("kind") == "rounding tie" for d in entry.get("divergences", [])):
                        verdict = "rounding tie"
                    row[f"{'noise' if which == 'lossless_noise_pair' else name}/{policy}"] = verdict
            if not phase.get("status", "").startswith("ok"):
                row[f"{name}/status"] = phase.get("status")
        out[path] = row
    return out


def across_paths(summary: dict) -> dict:
    """Does target-only decoding give the same tokens on every path as on the first one? (Not required:
    each path is lossless against itself; in bf16 different kernels may round a near-tie apart.)"""
    out: dict = {}
    paths = list(summary["paths"])
    for name in summary["shapes"]:
        for which in ("lossless_noise_pair", "lossless_shape_pair"):
            got = {
                p: summary["paths"][p].get(name, {}).get(which, {}).get("target-only", {}).get("outputs") for p in paths
            }
            got = {p: v for p, v in got.items() if v is not None}
            if len(got) > 1:
                first, ref = next(iter(got.items()))
                out[f"{name}/{which.removeprefix('lossless_')}"] = {
                    p: [a == b for a, b in zip(ref, v)] for p, v in got.items() if p != first
                } | {"reference": first}
    return out


def goals(summary: dict, shapes: list[Path]) -> dict:
    """The issue's cost goals on the first shape pair's captured path (the speedup goal: gpu_simulate)."""
    name = next(iter(summary["shapes"]), None)
    prof = summary["profiles"].get(f"{name}/static-compiled")
    if prof is None:
        return {"status": "no captured profile of the first shape pair (CPU run, skipped or failed)"}
    got = {"captured c_d / c_t(1)": prof["c_d / c_t(1)"], "captured c_t(8) / c_t(1)": prof["c_t(k) / c_t(1)"]["8"]}
    return {k: {"measured": v, "goal": f"<= {GOALS[k]}", "met": v <= GOALS[k]} for k, v in got.items()}


if __name__ == "__main__":
    main()
