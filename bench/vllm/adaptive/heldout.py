"""Held-out calibration of the shipped vLLM classifier against vLLM 0.32's online acceptance estimator (issue 45,
item 3 and "Measure and record"): per draft position (1..K and all), AUROC, Brier score and ECE on the held-out
TEST prompts only, before and after Platt scaling, for

- disco: the shipped classifier's P(accept) as its model computes it (before), and Platt-scaled (after);
- vLLM online estimator: fitting.online_logistic (vLLM's acceptance_estimator.py refit to its fixed point), before
  and after the same Platt scaling.

Every fit is on the VALIDATION traces: the online logistic, and each model's Platt scaling; the test rows are
never used to fit (for comparison, the JSON also holds the test rows' figures cross-fitted by prompt as `disco
train`'s report computes them, fitting.calibration_report). The validation prompts are the shipped sets' prompts
that the classifier's own split held out (manifest training.val_prompt_ids: it was fitted on the others);
`val-prompts` writes them as a JSONL for `disco collect`; --prompts test refuses validation traces of a test
prompt or of a shipped training prompt it was fitted on. Test prompts: the shipped *-test sets (--prompts test).
Goals (issue 45): disco's AUROC >= the online logistic's + 0.02 (all positions), disco's ECE after <= 2 %.

The lead engineer's commands (the embedded pair in vLLM, bf16: `--engine vllm` with no --target/--draft runs
~/.cache/disco/embedded/qwen2.5-coder-1.5b-instruct and -0.5b-instruct, as the classifier's own traces did):

    python bench/vllm/adaptive/heldout.py val-prompts --out /tmp/heldout-val.jsonl   # 54 prompts: 16 code, 23 explain, 15 write
    disco collect --engine vllm --prompts /tmp/heldout-val.jsonl --max-new-tokens 128 --out /tmp/traces-vllm-val-128
    disco collect --engine vllm --prompts code-test,explain-test,write-test --max-new-tokens 128 \\
        --out /tmp/traces-vllm-test-128                                               # 92 prompts
    python bench/vllm/adaptive/heldout.py report --val /tmp/traces-vllm-val-128 --test /tmp/traces-vllm-test-128 \\
        --classifier models/embedded-qwen2.5-coder-vllm --out bench/vllm/adaptive/heldout
    python bench/vllm/adaptive/simulate.py --traces /tmp/traces-vllm-test-128 --profile bench/vllm/serve/profile-draft.json \\
        --classifier models/embedded-qwen2.5-coder-vllm --prompts test --batches 1,2,4,8,16,32,64 \\
        --out bench/vllm/adaptive/simulated.json

`report --out DIR` writes DIR/heldout.json, DIR/heldout.md and DIR/reliability.png and prints the goal checks.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from disco.base import shipped  # noqa: E402
from disco.base.errors import DiscoError  # noqa: E402
from disco.core.features import FEATURES  # noqa: E402
from disco.formats.prompts import load_prompt_sources  # noqa: E402
from disco.policies.artifact import Artifact, load_artifact  # noqa: E402
from disco.training.fitting import (  # noqa: E402
    ECE_BINS,
    calibration_figures,
    calibration_report,
    online_logistic,
    online_proba,
    platt,
    reliability,
)
from disco.training.train_data import load_trace_data  # noqa: E402

DISCO, ONLINE = "disco (shipped classifier)", "vLLM online estimator"
AUROC_MARGIN = 0.02  # issue 45: disco's held-out AUROC >= the online logistic's + this (all positions)
ECE_GOAL = 0.02  # issue 45: disco's held-out ECE after calibration <= this (all positions)


def _shipped_sets(suffix: str) -> list[str]:
    return [n for n in shipped.prompt_set_names() if n.endswith(suffix)]


def held_out_ids() -> set[str]:
    """Ids of the shipped test prompts (data/*-test.jsonl): never used to fit or tune."""
    return {p.id for p in load_prompt_sources(_shipped_sets("-test"))}


def validation_ids(artifact: Artifact) -> set[str]:
    """The prompts the classifier's own split held out of its fit (empty: the manifest does not say)."""
    return set((artifact.manifest.get("training") or {}).get("val_prompt_ids") or [])


@dataclass
class Rows:
    """The drafted rows of some traces at window positions 1..K: what every figure is computed on."""

    inputs: np.ndarray  # the classifier's input rows (FEATURES, + the draft's hidden state for a head)
    X: np.ndarray  # FEATURES (what the online estimator reads: p_top1, window_pos)
    y: np.ndarray  # 1: the target accepted the drafted token
    positions: np.ndarray  # 1-based window position
    prompts: np.ndarray  # each row's prompt id


def drafted_rows(paths: Sequence[str], artifact: Artifact, k: int, keep: set[str] | None) -> Rows:
    """Load traces as `disco train` does (train_data.load_trace_data), refuse ones of another pair than the
    classifier's, and keep the drafted rows (the oracle's windows) of the prompts in `keep` (None: all)."""
    data = load_trace_data(paths)
    load_artifact(artifact.path, expect_pair=data.pair)  # the classifier must be this pair's
    rows = data.rows
    mask = rows["oracle_drafted"].to_numpy(bool) & (rows["window_pos"].to_numpy() <= k)
    if keep is not None:
        mask &= rows["prompt_id"].isin(keep).to_numpy()
    X = rows[list(FEATURES)].to_numpy(np.float64)[mask]
    inputs = X
    if artifact.hidden_dim:  # an acceptance head reads the draft's hidden state beside FEATURES
        if data.hidden is None:
            raise DiscoError(
                f"{artifact.path} is a head on the draft's hidden state, but {paths[0]} holds none: "
                "collect the traces with hidden states"
            )
        inputs = np.concatenate([X, data.hidden_matrix(mask)], 1)
    y = rows["label"].to_numpy(int)[mask]
    return Rows(inputs, X, y, X[:, FEATURES.index("window_pos")].astype(int), rows["prompt_id"].to_numpy()[mask])


def _figures(y: np.ndarray, p: np.ndarray, positions: np.ndarray, keys: list) -> dict:
    return {
        key: calibration_figures(*((y, p) if key == "all" else (y[positions == key], p[positions == key])))
        for key in keys
    }


def heldout_report(val: Rows, test: Rows, artifact: Artifact, k: int) -> dict:
    """The figures on `test`, every fit on `val`, in fitting.calibration_report's layout (so train_report and
    plots read it), plus the fits, the test rows' cross-fitted figures and the goal checks."""
    for name, rows in (("validation", val), ("test", test)):
        if len(np.unique(rows.y)) < 2:
            raise DiscoError(f"the {name} traces' drafted tokens are all of one class: collect more prompts")
    online = online_logistic(val.X, val.y, k)
    predict = {DISCO: lambda r: artifact.model.predict_proba(r.inputs), ONLINE: lambda r: online_proba(online, r.X)}
    keys: list = [*range(1, k + 1), "all"]
    out: dict = {"bins": ECE_BINS, "cross_fitted": False, "positions": keys, "models": {}, "reliability": {}}
    fits, raw_test = {}, {}
    for name, f in predict.items():
        fit = platt(f(val), val.y)  # on validation rows only
        raw_test[name] = before = f(test)
        fits[name] = {"a": fit.a, "b": fit.b}
        out["models"][name] = {}
        for tag, q in (("before", before), ("after", np.asarray(fit(before), np.float64))):
            out["models"][name][tag] = _figures(test.y, q, test.positions, keys)
            out["reliability"].setdefault(name, {})[tag] = tuple(a.tolist() for a in reliability(test.y, q))
    shipped_cal = artifact.calibration  # the classifier's own Platt fit, on its training-time validation rows
    out["as_shipped"] = {
        "a": shipped_cal.a,
        "b": shipped_cal.b,
        "all": calibration_figures(test.y, artifact.predict_proba(test.inputs)),
    }
    out["platt_on_validation"] = fits
    out["online"] = {
        "slope": float(online.slope[0]),
        "intercepts": online.intercepts.tolist(),
        "rounds": online.refits,
        "converged": online.converged,
    }
    cross = calibration_report(raw_test, test.y, test.positions, test.prompts, k)
    out["test_cross_fitted_after"] = {name: figs["after"]["all"] for name, figs in cross["models"].items()}
    out["rows"] = {
        "validation": {"prompts": int(len(np.unique(val.prompts))), "rows": int(len(val.y))},
        "test": {"prompts": int(len(np.unique(test.prompts))), "rows": int(len(test.y))},
    }
    out["goals"] = goal_checks(out)
    return out


def goal_checks(report: dict) -> dict:
    """Issue 45's two calibration goals on the test rows, all positions (Platt is monotone: AUROC after = before)."""
    d, o = report["models"][DISCO]["after"]["all"], report["models"][ONLINE]["after"]["all"]
    auroc = d["auroc"] is not None and o["auroc"] is not None and d["auroc"] >= o["auroc"] + AUROC_MARGIN
    return {
        "auroc": {"disco": d["auroc"], "online": o["auroc"], "margin": AUROC_MARGIN, "met": bool(auroc)},
        "ece_after": {"disco": d["ece"], "goal": ECE_GOAL, "met": bool(d["ece"] is not None and d["ece"] <= ECE_GOAL)},
    }


def goal_lines(report: dict) -> list[str]:
    g, f = report["goals"], lambda v: "n/a" if v is None else f"{v:.4f}"  # noqa: E731
    a, e = g["auroc"], g["ece_after"]
    return [
        f"goal AUROC: disco {f(a['disco'])} >= online logistic {f(a['online'])} + {a['margin']}: "
        + ("met" if a["met"] else "MISSED"),
        f"goal ECE after calibration: disco {f(e['disco'])} <= {e['goal']}: " + ("met" if e["met"] else "MISSED"),
    ]


def markdown(report: dict, val: Sequence[str], test: Sequence[str], classifier: str) -> str:
    f = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    r, on, sh = report["rows"], report["online"], report["as_shipped"]
    lines = [
        "# Held-out calibration: the shipped classifier vs vLLM 0.32's online acceptance estimator",
        "",
        f"Classifier {classifier}; test traces {', '.join(test)} ({r['test']['prompts']} prompts, "
        f"{r['test']['rows']} drafted rows at window positions 1-{report['positions'][-2]}); every fit on the "
        f"validation traces {', '.join(val)} ({r['validation']['prompts']} prompts, {r['validation']['rows']} rows), "
        "never on a test row. Per position j: P(accept) of the token at j given the j - 1 before it accepted. "
        f"AUROC; Brier score; ECE over {report['bins']} equal-width bins of the prediction on [0, 1]. Before: disco's "
        "model as fitted (no calibration), vLLM's online logistic (acceptance_estimator.py, refit to its fixed "
        f"point on the validation rows: w = {on['slope']:.3f}, b_j = {', '.join(f'{b:.2f}' for b in on['intercepts'])}"
        f"{'' if on['converged'] else ', not converged'}); after: each Platt-scaled on the validation rows. As "
        f"shipped (its own Platt a = {sh['a']:.3f}, b = {sh['b']:.3f}): AUROC {f(sh['all']['auroc'])}, Brier "
        f"{f(sh['all']['brier'])}, ECE {f(sh['all']['ece'])}. Reliability diagram: reliability.png.",
        "",
        "| model | position | rows | accept rate | AUROC before | AUROC after | Brier before | Brier after "
        "| ECE before | ECE after |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, figs in report["models"].items():
        for key in report["positions"]:
            b, a = figs["before"][key], figs["after"][key]
            if b["rows"]:
                lines.append(
                    f"| {name} | {key} | {b['rows']} | {f(b['accept_rate'])} | {f(b['auroc'])} | {f(a['auroc'])} | "
                    f"{f(b['brier'])} | {f(a['brier'])} | {f(b['ece'])} | {f(a['ece'])} |"
                )
    lines += ["", *(f"- {line}" for line in goal_lines(report))]
    return "\n".join(lines) + "\n"


def write_validation_prompts(classifier: str, out: Path) -> int:
    """The shipped training sets' prompts that the classifier's split held out, as a JSONL for disco collect."""
    keep = validation_ids(load_artifact(classifier))
    prompts = [p for p in load_prompt_sources(_shipped_sets("-train")) if p.id in keep]
    if not prompts:
        raise DiscoError(
            f"{classifier}'s manifest names no validation prompt of the shipped sets (training.val_prompt_ids)"
        )
    out.write_text("".join(json.dumps({"id": p.id, "task": p.task, "prompt": p.prompt}) + "\n" for p in prompts))
    return len(prompts)


def report(
    val: Sequence[str], test: Sequence[str], classifier: str, prompts: str, k: int | None, out: Path | None
) -> dict:
    """Check the traces' prompts (test ones held out, validation ones never fitted on), compute, write to `out`."""
    artifact = load_artifact(classifier)
    k = int(k or artifact.manifest.get("max_window") or 8)
    test_ids = held_out_ids() if prompts == "test" else None
    val_rows = drafted_rows(val, artifact, k, None)
    if test_ids is not None:  # of the shipped prompts: validation ones only, never a test or a training one
        seen = set(np.unique(val_rows.prompts))
        if seen & test_ids:
            raise DiscoError(
                "the validation traces hold test prompts: collect the validation prompts (heldout.py val-prompts)"
            )
        fitted_on = seen & ({p.id for p in load_prompt_sources(_shipped_sets("-train"))} - validation_ids(artifact))
        if validation_ids(artifact) and fitted_on:
            raise DiscoError(
                f"the validation traces hold {len(fitted_on)} prompts the classifier was fitted on (e.g. "
                f"{sorted(fitted_on)[0]}): collect its validation prompts only (heldout.py val-prompts)"
            )
    test_rows = drafted_rows(test, artifact, k, test_ids)
    if not len(test_rows.y):
        raise DiscoError("no drafted rows of held-out test prompts in the test traces (data/*-test.jsonl ids)")
    if set(np.unique(test_rows.prompts)) & set(np.unique(val_rows.prompts)):
        raise DiscoError("the validation and test traces share prompts: give traces of disjoint prompt sets")
    result = heldout_report(val_rows, test_rows, artifact, k)
    result.update(classifier=classifier, val=list(val), test=list(test), created=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    if out is not None:
        from disco.formats.plots import reliability_diagram

        out.mkdir(parents=True, exist_ok=True)
        (out / "heldout.json").write_text(json.dumps(result, indent=1) + "\n")
        (out / "heldout.md").write_text(markdown(result, val, test, classifier))
        reliability_diagram(result, out / "reliability.png", "on the held-out test prompts", "fitted on validation")
    return result


def main(argv: Sequence[str] | None = None) -> dict | None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    vp = sub.add_parser("val-prompts", help="write the classifier's validation prompts of the shipped sets (JSONL)")
    vp.add_argument("--classifier", default="models/embedded-qwen2.5-coder-vllm")
    vp.add_argument("--out", type=Path, required=True)
    rp = sub.add_parser("report", help="the calibration figures on the test traces, every fit on the validation ones")
    rp.add_argument("--val", nargs="+", required=True, help="trace folders of the validation prompts")
    rp.add_argument("--test", nargs="+", required=True, help="trace folders of the held-out test prompts")
    rp.add_argument("--classifier", default="models/embedded-qwen2.5-coder-vllm")
    rp.add_argument(
        "--prompts",
        choices=("test", "all"),
        default="test",
        help="test: keep the shipped test prompts of --test and refuse validation traces of test or training "
        "prompts; all: every prompt of each",
    )
    rp.add_argument("--k", type=int, help="the last window position (default: the classifier's max_window)")
    rp.add_argument("--out", type=Path, help="folder for heldout.json, heldout.md and reliability.png")
    a = ap.parse_args(argv)
    try:
        if a.command == "val-prompts":
            print(f"wrote {write_validation_prompts(a.classifier, a.out)} validation prompts to {a.out}")
            return None
        result = report(a.val, a.test, a.classifier, a.prompts, a.k, a.out)
    except DiscoError as e:
        sys.exit(f"heldout.py: {e}")
    f = lambda v: "n/a" if v is None else f"{v:.4f}"  # noqa: E731
    for name, figs in result["models"].items():
        b, af = figs["before"]["all"], figs["after"]["all"]
        print(
            f"{name}, all positions (before -> after): AUROC {f(b['auroc'])} -> {f(af['auroc'])}, "
            f"Brier {f(b['brier'])} -> {f(af['brier'])}, ECE {f(b['ece'])} -> {f(af['ece'])}"
        )
    print("\n".join(goal_lines(result)))
    return result


if __name__ == "__main__":
    main()
