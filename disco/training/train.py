"""`disco train`: fit the stopping classifier on oracle traces and choose its rule for speed.

    traces ──► split by prompt (train / validation) ──► fit on train rows: the model on FEATURES,
               and (traces with hidden states) an acceptance head on the draft's hidden state + FEATURES
           ──► metrics on validation rows ──► Platt calibration on validation rows
           ──► every model under every rule (classifier.RULES), its parameter tuned by simulated
               speedup on the validation prompts (cost model: a `disco profile` JSON or the default)
           ──► baselines tuned the same way on the same prompts (threshold, constant, AdaEDL, SVIP)
           ──► the choice: the fastest learned (model, rule), or the tuned threshold if that is
               faster; recorded with its margin ──► artifact + report

The stages live in their own modules: the data and its split (train_data.py), fitting (fitting.py),
tuning by simulated speedup and the arms that refit (tuning.py), the report (train_report.py); the
artifact's manifest is built by artifact.training_manifest. `train()` runs them in that order.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from disco.base.defaults import (
    LABELS,
    MODEL_KINDS,
)
from disco.base.errors import DiscoError
from disco.base.files import check_out_dir, write_dir
from disco.base.settings import WINDOW, check_setting
from disco.core.cost import CostModel
from disco.core.features import FEATURES, TARGET_SIGNALS
from disco.policies.artifact import save_artifact, training_manifest
from disco.policies.artifact_models import Calibrated, Model
from disco.training.fitting import (
    calibration_report,
    classification_metrics,
    fit_head,
    fit_model,
    online_logistic,
    online_proba,
    permutation_importance,
    platt,
)
from disco.training.simulate import replay_policy, simulate_many
from disco.training.train_data import (
    TraceData,
    TrainConfig,
    check_split,
    load_trace_data,
    row_tasks,
    split_by_prompt,
    traces_for,
)
from disco.training.train_report import RELIABILITY_PNG, TrainReport
from disco.training.tuning import (
    ablation,
    choose,
    choose_for_load,
    cross_task,
    per_task_table,
    policy_table,
    serving_levels,
)

# --- the whole command -------------------------------------------------------------------------


def train(cfg: TrainConfig) -> TrainReport:
    """Fit, tune and report (docs/architecture.md, "Data flow"); writes the artifact to cfg.out."""
    cost = _check(cfg)
    data = load_trace_data(cfg.traces)
    if cfg.target_signals and data.without_signals:  # asked to fit on what the traces do not hold
        raise DiscoError(
            f"the traces {data.without_signals[0]} hold no target-side signals, which the last_* features need: "
            "train with --no-target-signals (a policy that does not read them, as vLLM's proposer runs it)"
        )
    if not cfg.target_signals:  # a policy for an engine that cannot show it the target's probabilities
        data.features = [i for i in data.features if FEATURES[i] not in TARGET_SIGNALS]
    s = _split(cfg, data)
    labels = _labels(cfg, data)
    # Sampled traces: min(1, p/q) is the label's expectation given the drafted token, the same target with
    # none of the accept/reject draw's noise. Metrics, calibration and tuning still use the sampled labels.
    soft = data.rows["accept_prob"].to_numpy(np.float64) if labels == "soft" else None
    fitted = _fit(cfg, data, s, soft)
    models = fitted.models
    calibration = _calibration(cfg, data, s, fitted)

    val_traces = traces_for(data, s.val_mask)
    table, tuned, learned = policy_table(val_traces, models, cost, cfg.max_window, cfg.progress)
    best, choice = choose(learned, tuned["threshold"])
    if serving_levels(cost, cfg.max_window):  # vLLM's batched draft: the rule that holds up under load
        best, choice = choose_for_load(learned, val_traces, cost, cfg.max_window, choice)
    importance, abl, tasks, cross = _arms(cfg, data, s, fitted, soft, val_traces, cost, learned, tuned, best)

    setting = float(best.tuned.best)  # the chosen rule's setting (a threshold only for the threshold rule)
    metrics = fitted.metrics[best.model_name]
    decoding = _decoding(cfg, data, s, labels, cost, best, tuned)
    report = TrainReport(
        cfg.out,
        setting,
        metrics,
        table,
        importance,
        cost,
        abl,
        s.record,
        tasks,
        cross,
        choice,
        fitted.metrics,
        decoding,
        calibration,
    )
    manifest = training_manifest(
        setting=setting,
        rule=best.rule,
        choice=choice,
        calibration=models[best.model_name].calibration,
        hidden=data.hidden if best.model_name == "head" else None,
        pair=data.pair,
        max_window=cfg.max_window,
        sampling=data.sampling,
        training={
            "rows": "oracle_drafted",
            "labels": labels,
            "balanced": cfg.balanced,
            "seed": cfg.seed,
            "val_fraction": cfg.val_fraction,
            "target_signals": cfg.target_signals,
            "models": list(models),
            **s.record,
            "traces": data.manifests,
        },
        metrics=metrics,
        model_metrics=fitted.metrics,
        cost=cost,
        tuned_threshold=float(tuned["threshold"].best),
        tuned_k=int(tuned["constant"].best),
        tuned_adaedl_lambda=float(tuned["adaedl"].best),
        tuned_svip_h=float(tuned["svip"].best),
        tuned_rules={e.rule: float(e.tuned.best) for e in learned if e.model_name == best.model_name},
        speedups=table,
        importance=importance,
        ablation=abl,
        per_task=tasks,
        cross_task=cross,
    )
    # The folder is replaced whole (no stale model file of another kind stays), or, when it cannot be
    # written, the finished artifact goes to a temporary folder that the error names.
    raw = fitted.raw[best.model_name]

    def fill(tmp: Path) -> None:
        from disco.formats.plots import reliability_diagram

        reliability_diagram(calibration, tmp / RELIABILITY_PNG)  # beside metrics.md; the manifest is written last
        save_artifact(tmp, raw, manifest, report.markdown())

    write_dir(cfg.out, fill, "artifact")
    return report


def _check(cfg: TrainConfig) -> CostModel:
    """Refuse what fails anyway before any work; the cost model the tuning simulates with."""
    if cfg.model not in MODEL_KINDS:
        raise DiscoError(f"unknown model {cfg.model!r}: choose one of {', '.join(MODEL_KINDS)}")
    check_setting("max_window", cfg.max_window, WINDOW)
    if cfg.labels not in LABELS:
        raise DiscoError(f"unknown --labels {cfg.labels!r}: choose one of {', '.join(LABELS)}")
    cost = CostModel.load(cfg.profile) if cfg.profile is not None else CostModel.default(cfg.max_window)
    cost.verify(cfg.max_window + 1)  # fail now, not after training, if the profile is too short
    check_out_dir(cfg.out, "--out", True, "artifact")  # a file or a trace folder is refused before any work
    return cost


@dataclass
class _Split:
    """The rows split by prompt, and what fitting reads of them."""

    train_mask: np.ndarray  # rows of the training prompts
    val_mask: np.ndarray  # rows of the validation prompts
    tr: np.ndarray  # drafted rows of the training prompts (what the models fit)
    va: np.ndarray  # drafted rows of the validation prompts (metrics, calibration)
    X: np.ndarray  # every row's FEATURES
    y: np.ndarray  # every row's label
    record: dict  # prompt and row counts, the validation prompt ids (manifest "training", report)


def _split(cfg: TrainConfig, data: TraceData) -> _Split:
    rows = data.rows
    train_mask, val_mask = split_by_prompt(rows["prompt_id"].to_numpy(), cfg.val_fraction, cfg.seed, row_tasks(rows))
    check_split(rows, train_mask, val_mask)
    drafted = rows["oracle_drafted"].to_numpy(bool)
    y = rows["label"].to_numpy(int)
    tr, va = train_mask & drafted, val_mask & drafted
    if len(np.unique(y[tr])) < 2:
        raise DiscoError("the training prompts' drafted tokens are all of one class: add prompts or change --seed")
    record = {
        "train_prompts": int(rows.loc[train_mask, "prompt_id"].nunique()),
        "val_prompts": int(rows.loc[val_mask, "prompt_id"].nunique()),
        "train_rows": int(tr.sum()),
        "val_prompt_ids": sorted(rows.loc[val_mask, "prompt_id"].unique().tolist()),
    }
    return _Split(train_mask, val_mask, tr, va, rows[list(FEATURES)].to_numpy(np.float64), y, record)


def _labels(cfg: TrainConfig, data: TraceData) -> str:
    """What the models fit: "sampled" accept/reject labels or "soft" ones (min(1, p/q), sampled traces)."""
    labels = ("soft" if data.sampled else "sampled") if cfg.labels == "auto" else cfg.labels
    if labels == "soft" and not data.sampled:
        raise DiscoError(
            "--labels soft needs sampled traces (disco collect --temperature > 0): under greedy decoding "
            "acceptance is the label itself"
        )
    return labels


@dataclass
class _Fitted:
    raw: dict[str, Model]  # as fitted: cfg.model, and "head" when the traces hold hidden states
    models: dict[str, Calibrated]  # each Platt-calibrated on the validation rows
    inputs: dict[str, np.ndarray]  # each model's input rows (FEATURES, or FEATURES + hidden state)
    metrics: dict[str, dict]  # each model's validation metrics


def _fit(cfg: TrainConfig, data: TraceData, s: _Split, soft: np.ndarray | None) -> _Fitted:
    """cfg.model on FEATURES, and the head on FEATURES + hidden state when the traces hold it; calibrated."""
    X, y, tr, va = s.X, s.y, s.tr, s.va
    soft_tr = None if soft is None else soft[tr]
    raw: dict[str, Model] = {
        cfg.model: fit_model(cfg.model, X[tr], y[tr], data.features, cfg.seed, cfg.balanced, soft_tr)
    }
    inputs: dict[str, np.ndarray] = {cfg.model: X}
    if cfg.head and data.hidden is not None:
        H = data.hidden_matrix(np.ones(len(data.rows), bool))
        groups = data.rows["prompt_id"].to_numpy()[tr]
        raw["head"] = fit_head(X[tr], H[tr], y[tr] if soft is None else soft_tr, data.features, groups, cfg.seed)
        inputs["head"] = np.concatenate([X, H], 1)
        del H
    models = {name: Calibrated(m, platt(m.predict_proba(inputs[name][va]), y[va])) for name, m in raw.items()}
    metrics = {name: classification_metrics(y[va], m.predict_proba(inputs[name][va])) for name, m in models.items()}
    return _Fitted(raw, models, inputs, metrics)


def _calibration(cfg: TrainConfig, data: TraceData, s: _Split, fitted: _Fitted) -> dict:
    """Per-position calibration on the validation prompts (fitting.calibration_report): each of disco's models
    as fitted (before) and Platt-scaled (after), and vLLM 0.32's online acceptance estimator fitted on the same
    training rows (fitting.online_logistic), its coefficients under "online"."""
    X, y, tr, va = s.X, s.y, s.tr, s.va
    online = online_logistic(X[tr], y[tr], cfg.max_window)
    raw = {f"disco {name}": m.predict_proba(fitted.inputs[name][va]) for name, m in fitted.raw.items()}
    raw["vLLM online estimator"] = online_proba(online, X[va])
    positions = X[va, FEATURES.index("window_pos")]
    groups = data.rows["prompt_id"].to_numpy()[va]
    report = calibration_report(raw, y[va], positions, groups, cfg.max_window, cfg.seed)
    report["online"] = {
        "slope": float(online.slope[0]),
        "intercepts": online.intercepts.tolist(),
        "rounds": online.refits,
        "converged": online.converged,
    }
    return report


def _arms(cfg: TrainConfig, data: TraceData, s: _Split, fitted: _Fitted, soft, val_traces, cost, learned, tuned, best):
    """What the report adds to the table: permutation importance, the ablation (--ablate), the speedups
    per task, and the cross-task arms (--cross-task)."""
    X, y, tr, va = s.X, s.y, s.tr, s.va
    main = fitted.models[cfg.model]
    importance = permutation_importance(main, X[va], y[va], cfg.seed)
    head_eval = (fitted.models["head"], fitted.inputs["head"][va]) if "head" in fitted.models else None
    soft_tr = None if soft is None else soft[tr]
    abl = (
        ablation(cfg.model, X[tr], y[tr], X[va], y[va], val_traces, cost, cfg, main, data.features, head_eval, soft_tr)
        if cfg.ablate
        else []
    )
    tasks = per_task_table(data, s.val_mask, best, tuned, cost, cfg.max_window)
    token = next(e for e in learned if e.model_name == cfg.model and e.rule == "token")
    settings = (main, token.tuned.best, tuned["threshold"].best)
    cross = (
        cross_task(data, s.train_mask, s.val_mask, X, y, cost, cfg, settings, data.features, soft)
        if cfg.cross_task
        else []
    )
    return importance, abl, tasks, cross


def _decoding(cfg: TrainConfig, data: TraceData, s: _Split, labels: str, cost: CostModel, best, tuned) -> str:
    """What the traces decoded with and the labels fitted; sampled traces: the same policies replayed with
    the traces' sampled outcomes instead of the expected acceptance (the check of that approximation)."""
    if not data.sampled:
        return "greedy decoding"
    replays = {
        "chosen": best.factory(cost),
        "threshold": replay_policy("threshold", threshold=tuned["threshold"].best),
    }
    check = simulate_many(traces_for(data, s.val_mask, expected=False), replays, cfg.max_window)
    return (
        f"sampling at temperature {data.sampling['temperature']:g}, top-p {data.sampling['top_p']:g} "
        f"({labels} labels; simulated with expected acceptance; with the traces' sampled outcomes instead: "
        f"best learned policy {check['chosen'].speedup(cost):.3f}, tuned threshold "
        f"{check['threshold'].speedup(cost):.3f})"
    )
