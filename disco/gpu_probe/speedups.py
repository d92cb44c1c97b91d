"""Simulated speedup of every policy under the GPU probe's measured cost models (issue 25).

Reads the profiles disco.gpu_probe.measure (bench/gpu_probe.py) wrote (one per path: dynamic, static, static-compiled, ...) and
replays every policy over the given trace folders with disco's own simulator, through the functions
`disco train` uses, so each number is the one `disco train --profile PROFILE` would report on these
prompts: the oracle; the shipped classifier's model under every rule, each rule's setting tuned by
simulated speedup (train.policy_table); the baselines tuned the same way (threshold, constant, AdaEDL,
SVIP) and at their published settings; and the shipped artifact exactly as it runs (its rule, its
setting). Tuning uses the prompts given (`--prompts validation`: the validation prompts `disco train`
would hold out of these traces).

    .venv/bin/python bench/gpu_simulate.py --profiles OUT --traces traces/embedded-test \\
        [--classifier models/embedded-qwen2.5-coder] [--out OUT/gpu-simulate.md] [--json OUT/gpu-simulate.json]

Writes a markdown table: per policy, its speedup over target-only decoding on each path, with each
path's measured draft/target cost ratio and verification costs above it, and the issue's goals below.
"""

from __future__ import annotations

import argparse
import json
import re
import warnings
from pathlib import Path

import numpy as np

from disco.base import shipped
from disco.base.defaults import DEFAULT_MAX_WINDOW, DEFAULT_VAL_FRACTION
from disco.core.cost import CostModel
from disco.policies.artifact import load_artifact
from disco.training.simulate import replay_policy, simulate_many
from disco.training.train_data import load_trace_data, row_tasks, split_by_prompt, traces_for
from disco.training.tuning import policy_table

ROOT = shipped.root()  # models/: the checkout, or the wheel's copy (disco/base/shipped.py)
ARTIFACT = ROOT / "models/embedded-qwen2.5-coder"
SHIPPED = "shipped, as is"
GOALS = {"c_d / c_t(1)": 0.45, "c_t(8) / c_t(1)": 1.3, "shipped speedup": 1.5}  # issue 25, captured path
CAPTURED = "static-compiled"


def read_profiles(paths: list[Path], shapes: str | None) -> list[tuple[str, CostModel, dict]]:
    """(label, cost model, profile) per profile file; folders give their profile-*.json. A probe profile's
    label is its path; `shapes` keeps only the probe profiles of that shape pair."""
    files = []
    for p in paths:
        files += sorted(p.glob("profile-*.json")) if p.is_dir() else [p]
    order = ("dynamic", "static", "static-compiled", "static-padded")  # the probe's paths, eager first
    files.sort(key=lambda f: next((i for i, o in enumerate(order) if f.stem.endswith(f"-{o}")), len(order)))
    out = []
    for f in files:
        prof = json.loads(f.read_text())
        probe = prof.get("probe") or {}
        if shapes and probe and probe.get("shapes") != shapes:
            continue
        out.append((probe.get("path") or f.stem, CostModel.load(f), prof))
    if not out:
        raise SystemExit(f"no profiles{f' of {shapes}' if shapes else ''} in {', '.join(map(str, paths))}")
    return out


def shipped_factory(artifact):
    """The shipped artifact as `disco generate --policy classifier` runs it (ClassifierPolicy.for_pair):
    its chosen rule at its tuned setting under the cost model it recorded, or the tuned threshold when
    `disco train` found that faster."""
    if artifact.choice["policy"] == "threshold":
        return replay_policy("threshold", threshold=float(artifact.choice["setting"]))
    return replay_policy(
        "classifier",
        classifier_setting=artifact.setting,
        model=artifact,
        classifier_rule=artifact.rule,
        cost=artifact.cost_model(),
    )


def shipped_setting(artifact) -> str:
    if artifact.choice["policy"] == "threshold":
        return f"tau = {float(artifact.choice['setting']):g}"
    return f"{artifact.rule} rule = {artifact.setting:g}"


def _row_key(row: dict) -> tuple[str, str | None]:
    """(row name, tuned value or None): a tuned setting's value differs per path, so it goes in the cell."""
    m = re.match(r"^(.*?)\s*=\s*([^ ]+) \(tuned\)$", row["setting"])
    if m:
        return f"{row['policy']}, {m.group(1)} tuned", m.group(2)
    return f"{row['policy']}, {row['setting']}", None


def simulate_profiles(profiles, traces, artifact, max_window: int) -> dict:
    """{label: {"rows": {row: {"speedup", "setting", ...}}, "ratios": {...}}} for every profile."""
    out = {}
    shipped = shipped_factory(artifact)
    for label, cost, prof in profiles:
        table, _, _ = policy_table(traces, {"shipped model": artifact}, cost, max_window)
        rows = {}
        for row in table:
            key, setting = _row_key(row)
            rows[key] = {**row, "tuned_value": setting}
        sim = simulate_many(traces, {SHIPPED: shipped}, max_window)[SHIPPED]
        rows[SHIPPED] = {
            "policy": SHIPPED,
            "setting": shipped_setting(artifact),
            "tuned_value": None,
            **sim.summary(cost),
        }
        c_t = cost.c_t
        out[label] = {
            "rows": rows,
            "ratios": {
                "c_d / c_t(1)": cost.c_d / c_t[0],
                "c_t(8) / c_t(1)": c_t[7] / c_t[0] if len(c_t) >= 8 else None,
                "c_t(21) / c_t(1)": c_t[20] / c_t[0] if len(c_t) >= 21 else None,
                "c_t(1) ms": c_t[0] * 1e3,
                "compile_s": prof.get("compile_s"),
                "device": prof.get("device_name"),
                "tiny": (prof.get("probe") or {}).get("tiny"),
            },
        }
    return out


def goals(results: dict) -> dict:
    cap = results.get(CAPTURED)
    if cap is None:
        return {"status": f"no {CAPTURED} profile"}
    got = {
        "c_d / c_t(1)": cap["ratios"]["c_d / c_t(1)"],
        "c_t(8) / c_t(1)": cap["ratios"]["c_t(8) / c_t(1)"],
        "shipped speedup": cap["rows"][SHIPPED]["speedup"],
    }
    return {
        k: {
            "measured": v,
            "goal": f"{'>=' if k == 'shipped speedup' else '<='} {GOALS[k]}",
            "met": (v >= GOALS[k]) if k == "shipped speedup" else (v <= GOALS[k]),
        }
        for k, v in got.items()
    }


def markdown(results: dict, meta: dict) -> str:
    labels = list(results)
    lines = [
        f"Simulated speedup over target-only decoding: {meta['prompts']} prompts ({meta['which']}) of "
        f"{', '.join(meta['traces'])}; classifier {meta['classifier']}; max window {meta['max_window']}; "
        "cost models: the GPU probe's profiles (random-weight models of the pair's shapes). Tuned settings are "
        "tuned on these same prompts, per path, as `disco train --profile` does.",
        "",
    ]
    lines.append("| | " + " | ".join(labels) + " |")
    lines.append("|---|" + "---|" * len(labels))
    for name, fmt in (
        ("c_d / c_t(1)", "{:.3f}"),
        ("c_t(8) / c_t(1)", "{:.3f}"),
        ("c_t(21) / c_t(1)", "{:.3f}"),
        ("c_t(1) ms", "{:.2f}"),
        ("compile_s", "{:.0f}"),
    ):
        cells = [
            fmt.format(results[lb]["ratios"][name]) if results[lb]["ratios"][name] is not None else "–" for lb in labels
        ]
        lines.append(f"| *{name}* | " + " | ".join(cells) + " |")
    keys = list(dict.fromkeys(k for lb in labels for k in results[lb]["rows"]))
    for key in keys:
        cells = []
        for lb in labels:
            row = results[lb]["rows"].get(key)
            cells.append(
                "–"
                if row is None
                else f"{row['speedup']:.2f}×"
                + (f" ({row['tuned_value']})" if row.get("tuned_value") is not None else "")
            )
        name = f"**{key}**" if key == SHIPPED else key
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    g = meta["goals"]
    if "status" in g:
        lines += ["", f"Goals (issue 25): {g['status']}."]
    else:
        lines += [
            "",
            "Goals (issue 25, captured path): "
            + "; ".join(
                f"{k} {v['measured']:.3f} (goal {v['goal']}: {'met' if v['met'] else 'NOT met'})" for k, v in g.items()
            )
            + ".",
        ]
    return "\n".join(lines) + "\n"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--profiles", nargs="+", type=Path, required=True, help="the probe's --out folder(s) or profile files"
    )
    ap.add_argument("--traces", nargs="+", type=Path, required=True, help="trace folders (disco collect) of the pair")
    ap.add_argument("--classifier", type=Path, default=ARTIFACT, help="the shipped artifact")
    ap.add_argument(
        "--shapes", default="embedded-qwen2.5-coder", help="keep the probe profiles of this shape pair ('' for all)"
    )
    ap.add_argument(
        "--prompts",
        choices=("all", "validation"),
        default="all",
        help="tune and measure on every prompt given, or on the ones disco train holds out",
    )
    ap.add_argument("--max-window", type=int, default=DEFAULT_MAX_WINDOW)
    ap.add_argument("--out", type=Path, help="write the markdown table here (else stdout)")
    ap.add_argument("--json", type=Path, help="write every number here")
    return ap.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    profiles = read_profiles(args.profiles, args.shapes or None)
    data = load_trace_data(args.traces)
    mask = np.ones(len(data.rows), bool)
    if args.prompts == "validation":  # what disco train tunes on (its defaults: fraction and seed)
        _, mask = split_by_prompt(data.rows["prompt_id"].to_numpy(), DEFAULT_VAL_FRACTION, 0, row_tasks(data.rows))
    traces = traces_for(data, mask)
    artifact = load_artifact(args.classifier)
    trained_for = (artifact.manifest.get("pair") or {}).get("target")
    if trained_for and data.pair.get("target") and Path(str(trained_for)).name != Path(str(data.pair["target"])).name:
        warnings.warn(
            f"{args.classifier} was trained for {trained_for}, the traces come from {data.pair['target']}", stacklevel=1
        )
    results = simulate_profiles(profiles, traces, artifact, args.max_window)
    meta = {
        "traces": [str(t) for t in args.traces],
        "prompts": len(traces),
        "which": args.prompts,
        "classifier": str(args.classifier),
        "max_window": args.max_window,
    }
    meta["goals"] = goals(results)
    text = markdown(results, meta)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    else:
        print(text, end="")
    report = {"meta": meta, "results": results}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=float) + "\n")
    return report


if __name__ == "__main__":
    main()
