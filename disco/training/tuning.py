"""`disco train`'s tuning by simulated speedup: every model under every rule (classifier.RULES), each rule's
setting tuned on the validation prompts (`tune_learned`), the baselines tuned the same way (threshold,
constant, AdaEDL, SVIP: `policy_table`), the choice (`choose`), and the arms that refit and retune
(`ablation`, `per_task_table`, `cross_task`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from disco.base.defaults import SERVING_LEVELS
from disco.core.cost import CostModel
from disco.core.features import DISCO_FEATURES, FEATURES
from disco.policies.artifact_models import Model
from disco.policies.batch_policy import BatchClassifier, BatchConstant
from disco.policies.classifier import RULES
from disco.policies.policy import ADAEDL_LAMBDA, DEFAULT_K, DEFAULT_THRESHOLD, SVIP_H
from disco.training.fitting import classification_metrics, fit_model
from disco.training.simulate import (
    PromptTrace,
    SimResult,
    replay_policy,
    simulate_batched,
    simulate_many,
)
from disco.training.train_data import TraceData, TrainConfig, task_masks, traces_for

# Candidate thresholds, for the classifier's P(accept) and for the draft probability tau alike:
# steps of 0.05, finer at both ends (with most tokens accepted, a classifier's best threshold on
# the embedded pair can lie above 0.95).
THRESHOLD_GRID: tuple[float, ...] = tuple(
    sorted({round(0.05 * i, 2) for i in range(1, 20)} | {0.01, 0.02, 0.03, 0.97, 0.98, 0.99, DEFAULT_THRESHOLD})
)
# Each rule's parameter grid: P(at least one rejection) for the cumulative rule; the rate to beat, in
# units of target-only decoding's, for the cost rule; lambda and h for AdaEDL and SVIP.
RULE_GRIDS: dict[str, tuple[float, ...]] = {
    "token": THRESHOLD_GRID,
    "cumulative": (0.01, 0.02, 0.03) + tuple(round(0.05 * i, 2) for i in range(1, 20)) + (0.97, 0.99),
    "cost": tuple(round(1.0 + 0.1 * i, 1) for i in range(21)),
    "cost-adaptive": tuple(round(1.0 + 0.1 * i, 1) for i in range(21)),
}
ADAEDL_GRID = tuple(round(0.05 * i, 2) for i in range(4, 20))
SVIP_GRID = tuple(round(0.05 * i, 2) for i in range(1, 17))
ALL_TASKS = "all tasks"
ALL_BUT = "all but "  # cross-task: trained without one trace folder


@dataclass
class Tuned:
    best: float | int  # the candidate with the highest simulated speedup (the first one on ties)
    speedups: dict  # candidate -> simulated speedup
    result: SimResult  # the simulation at `best`


def tune(
    traces: Sequence[PromptTrace],
    factory_at: Callable[[float | int], Callable],
    candidates: Sequence,
    cost: CostModel,
    max_window: int,
    progress: bool = False,
) -> Tuned:
    """The candidate setting that maximises cost-model speedup over `traces` (one batched simulation)."""
    sims = simulate_many(traces, {c: factory_at(c) for c in candidates}, max_window, progress)
    speedups = {c: sims[c].speedup(cost) for c in candidates}
    best = candidates[int(np.argmax([speedups[c] for c in candidates]))]
    return Tuned(best, speedups, sims[best])


def tune_threshold(traces: Sequence[PromptTrace], cost: CostModel, max_window: int, progress: bool = False) -> Tuned:
    """The threshold policy's τ tuned over THRESHOLD_GRID (the baseline every learned rule meets)."""
    return tune(traces, lambda t: replay_policy("threshold", threshold=t), THRESHOLD_GRID, cost, max_window, progress)


def tune_token_rule(traces: Sequence[PromptTrace], model: Model, cost: CostModel, max_window: int) -> Tuned:
    """`model` under the classifier's default rule, its threshold on P(accept) tuned over THRESHOLD_GRID."""
    return tune(
        traces,
        lambda th: replay_policy("classifier", classifier_setting=th, model=model),
        THRESHOLD_GRID,
        cost,
        max_window,
    )


@dataclass
class Learned:
    """One trained model under one rule, its parameter tuned on validation."""

    model_name: str  # "lightgbm", "logistic", "mlp" or "head"
    rule: str  # classifier.RULES
    model: Model  # calibrated (artifact_models.Calibrated): what the simulator and the artifact use
    tuned: Tuned

    @property
    def label(self) -> str:
        return f"{self.model_name}, {self.rule} rule"

    def factory(self, cost: CostModel, setting: float | None = None):
        return replay_policy(
            "classifier",
            classifier_setting=self.tuned.best if setting is None else setting,
            model=self.model,
            classifier_rule=self.rule,
            cost=cost,
        )


def tune_learned(
    traces: Sequence[PromptTrace],
    models: dict[str, Model],
    cost: CostModel,
    max_window: int,
    progress: bool = False,
    rules: Sequence[str] = RULES,
) -> list[Learned]:
    """Every model under every rule, each rule's parameter tuned by simulated speedup on `traces`."""
    out = []
    for name, model in models.items():
        for rule in rules:
            t = tune(
                traces,
                lambda v: replay_policy(
                    "classifier", classifier_setting=v, model=model, classifier_rule=rule, cost=cost
                ),
                RULE_GRIDS[rule],
                cost,
                max_window,
                progress,
            )
            out.append(Learned(name, rule, model, t))
    return out


def policy_table(
    traces: Sequence[PromptTrace], models: dict[str, Model], cost: CostModel, max_window: int, progress: bool = False
) -> tuple[list[dict], dict[str, Tuned], list[Learned]]:
    """Simulated validation speedup of the oracle, every learned (model, rule) and the baselines, each
    tuned on the same prompts under the same cost model. tuned["classifier"]: the best learned one."""
    learned = tune_learned(traces, models, cost, max_window, progress)
    best = max(learned, key=lambda entry: entry.tuned.speedups[entry.tuned.best])
    tuned = {
        "classifier": best.tuned,
        "threshold": tune_threshold(traces, cost, max_window, progress),
        "constant": tune(
            traces,
            lambda k: replay_policy("constant", k=k),
            list(range(1, max(max_window, 1) + 1)),
            cost,
            max_window,
            progress,
        ),
        "adaedl": tune(
            traces,
            lambda v: replay_policy("adaedl", lam=v, max_window=max_window),
            ADAEDL_GRID,
            cost,
            max_window,
            progress,
        ),
        "svip": tune(traces, lambda v: replay_policy("svip", h=v), SVIP_GRID, cost, max_window, progress),
    }
    fixed = simulate_many(
        traces,
        {
            "oracle": replay_policy("oracle"),
            "heuristic": replay_policy("heuristic"),
            "tau": replay_policy("threshold", threshold=DEFAULT_THRESHOLD),
            "adaedl": replay_policy("adaedl", max_window=max_window),
            "svip": replay_policy("svip"),
        },
        max_window,
    )
    rows = [("oracle", "knows y", fixed["oracle"])]
    rows += [
        (f"classifier ({entry.label})", f"{entry.rule} = {entry.tuned.best:g} (tuned)", entry.tuned.result)
        for entry in learned
    ]
    rows += [
        ("threshold", f"tau = {tuned['threshold'].best:g} (tuned)", tuned["threshold"].result),
        ("threshold", f"tau = {DEFAULT_THRESHOLD:g} (transformers)", fixed["tau"]),
        ("adaedl", f"lambda0 = {tuned['adaedl'].best:g} (tuned)", tuned["adaedl"].result),
        ("adaedl", f"lambda0 = {ADAEDL_LAMBDA:g} (paper)", fixed["adaedl"]),
        ("svip", f"h = {tuned['svip'].best:g} (tuned)", tuned["svip"].result),
        ("svip", f"h = {SVIP_H:g} (paper's code)", fixed["svip"]),
        ("constant", f"k = {tuned['constant'].best} (tuned)", tuned["constant"].result),
        ("heuristic", f"k0 = {DEFAULT_K} (transformers)", fixed["heuristic"]),
    ]
    return [{"policy": p, "setting": s, **sim.summary(cost)} for p, s, sim in rows], tuned, learned


def choose(learned: Sequence[Learned], threshold: Tuned) -> tuple[Learned, dict]:
    """The fastest learned (model, rule) on validation, and what a user gets: it, or the tuned threshold
    when that is faster (a learned policy never ships slower than the threshold the same run tuned)."""
    best = max(learned, key=lambda entry: entry.tuned.speedups[entry.tuned.best])
    s_learned, s_thr = best.tuned.speedups[best.tuned.best], threshold.speedups[threshold.best]
    if s_learned > s_thr:
        choice = {
            "policy": "classifier",
            "model": best.model_name,
            "rule": best.rule,
            "setting": float(best.tuned.best),
            "speedup": s_learned,
        }
    else:
        choice = {"policy": "threshold", "setting": float(threshold.best), "speedup": s_thr}
    choice["tuned_threshold_speedup"] = s_thr
    choice["best_learned_speedup"] = s_learned
    choice["margin_vs_threshold"] = choice["speedup"] / s_thr
    return best, choice


def serving_levels(cost: CostModel, max_window: int) -> list[int]:
    """The concurrencies a batched vLLM load profile covers (its draft timed at that batch size, steps of that
    many requests with a window each): empty for any other cost model."""
    if not cost.c_draft:
        return []
    return [b for b in SERVING_LEVELS if b <= len(cost.c_draft) and len(cost.c_step) // b >= 2]


def choose_for_load(
    learned: Sequence[Learned], traces: Sequence[PromptTrace], cost: CostModel, max_window: int, choice: dict
) -> tuple[Learned, dict]:
    """On vLLM's batched draft (a load profile with c_draft): the learned (model, rule) at its tuned setting
    whose worst ratio to vLLM's best fixed draft length, over the concurrencies the profile covers, is the
    highest, in lockstep simulation (simulate_batched) on the validation prompts. A rule that wins alone may
    lose under load (each batched position costs the whole batch): this picks the one that holds up. The
    choice records every candidate's ratios ("serving")."""
    levels = serving_levels(cost, max_window)
    fixed = {
        b: max(
            simulate_batched(traces, BatchConstant(k), cost, b, max_window).tokens_per_s
            for k in range(1, max_window + 1)  # vLLM's num_speculative_tokens, any length the windows allow
        )
        for b in levels
    }
    # vLLM's draft gives its proposer no hidden state: the models that read it are not candidates there
    learned = [entry for entry in learned if not entry.model.hidden_dim]
    ratios: dict[str, dict[int, float]] = {}
    for entry in learned:
        predict = entry.model.torch_predictor(torch.device("cpu"))
        ratios[entry.label] = {
            b: simulate_batched(
                traces, BatchClassifier(predict, entry.rule, float(entry.tuned.best), cost), cost, b, max_window
            ).tokens_per_s
            / fixed[b]
            for b in levels
        }
    best = max(learned, key=lambda entry: min(ratios[entry.label].values()))
    speedup = best.tuned.speedups[best.tuned.best]
    chosen = {
        "policy": "classifier",
        "model": best.model_name,
        "rule": best.rule,
        "setting": float(best.tuned.best),
        "speedup": speedup,
        "tuned_threshold_speedup": choice["tuned_threshold_speedup"],
        "best_learned_speedup": choice["best_learned_speedup"],
        "margin_vs_threshold": speedup / choice["tuned_threshold_speedup"],
        "serving": {"levels": levels, "x_best_fixed_length": ratios},
    }
    return best, chosen


def _feature_groups() -> list[tuple[str, list[str]]]:
    """The features added to DISCO's inputs, copy_* and class_* as one group each."""
    groups: dict[str, list[str]] = {}
    for f in FEATURES:
        if f not in DISCO_FEATURES:
            key = f"{f.split('_')[0]}_*" if f.startswith(("copy_", "class_", "last_")) else f
            groups.setdefault(key, []).append(f)
    return list(groups.items())


def ablation(
    kind: str,
    X_tr: np.ndarray,
    y_tr: np.ndarray,
    X_val: np.ndarray,
    y_val: np.ndarray,
    traces: Sequence[PromptTrace],
    cost: CostModel,
    cfg: TrainConfig,
    full: Model,
    available: Sequence[int],
    head: tuple[Model, np.ndarray] | None = None,
    soft_tr: np.ndarray | None = None,
) -> list[dict]:
    """Tuned simulated speedup (token rule) with DISCO's inputs only, all features, all but each added
    group, and (head: the model and its validation inputs) all features + the draft's hidden state."""
    from tqdm.auto import tqdm

    have = set(available)
    variants = [("DISCO inputs only", [FEATURES.index(f) for f in DISCO_FEATURES]), ("all features", None)]
    variants += [
        (f"all − {name}", [i for i in available if FEATURES[i] not in group])
        for name, group in _feature_groups()
        if any(FEATURES.index(f) in have for f in group)
    ]
    variants += [("all + hidden state (head)", "head")] if head is not None else []
    rows = []
    for name, cols in tqdm(variants, desc="ablation", disable=not cfg.progress):
        if cols == "head":
            model, X_eval = head
        else:
            model = full if cols is None else fit_model(kind, X_tr, y_tr, cols, cfg.seed, cfg.balanced, soft_tr)
            X_eval = X_val
        t = tune_token_rule(traces, model, cost, cfg.max_window)
        auc = classification_metrics(y_val, model.predict_proba(X_eval))["roc_auc"]
        rows.append(
            {
                "variant": name,
                "features": len(model.columns) + model.hidden_dim,
                "roc_auc": auc,
                "threshold": t.best,
                "speedup": t.speedups[t.best],
            }
        )
    base = rows[1]["speedup"]
    for r in rows:
        r["delta_vs_all"] = r["speedup"] - base
    return rows


def per_task_table(
    data: TraceData, val_mask: np.ndarray, best: Learned, tuned: dict[str, Tuned], cost: CostModel, max_window: int
) -> list[dict]:
    """Simulated speedup per task on the validation prompts, every policy at the ONE setting tuned
    on all validation prompts (what a user deploys), the best learned policy's ratio to the tuned threshold."""
    factories = {
        "oracle": replay_policy("oracle"),
        "classifier": best.factory(cost),
        "threshold": replay_policy("threshold", threshold=tuned["threshold"].best),
        "tau": replay_policy("threshold", threshold=DEFAULT_THRESHOLD),
        "constant": replay_policy("constant", k=tuned["constant"].best),
        "heuristic": replay_policy("heuristic"),
    }
    out = []
    for task, mask in task_masks(data.rows).items():
        traces = traces_for(data, val_mask & mask)
        if not traces:
            continue
        sims = simulate_many(traces, factories, max_window)
        out.append({"task": task, "prompts": len(traces), **{k: sims[k].speedup(cost) for k in factories}})
    return out


def cross_task(
    data: TraceData,
    train_mask: np.ndarray,
    val_mask: np.ndarray,
    X: np.ndarray,
    y: np.ndarray,
    cost: CostModel,
    cfg: TrainConfig,
    full: tuple[Model, float, float],
    features: Sequence[int],
    soft: np.ndarray | None = None,
) -> list[dict]:
    """Train on one task, test on another: for each training task A (and all tasks together), fit
    on A's training prompts, tune the classifier's threshold (token rule) and tau on A's validation
    prompts, then simulate both on each task B's validation prompts (never seen in fitting or tuning).
    With several trace folders, also "all but FOLDER" for each: fitted and tuned without that folder's
    prompts, so beside "all tasks" it shows what adding the folder changes on every task.
    full: the model trained on all tasks, its tuned token threshold and tau, reused as is."""
    from tqdm.auto import tqdm

    masks = task_masks(data.rows)
    drafted = data.rows["oracle_drafted"].to_numpy(bool)
    val_traces = {t: traces_for(data, val_mask & m) for t, m in masks.items()}
    source = data.rows["_source"].to_numpy()
    # (name, rows it may fit and tune on, its validation traces to tune on)
    arms = [(t, m, val_traces[t]) for t, m in masks.items()]
    arms.append((ALL_TASKS, np.ones(len(y), bool), [tr for t in masks for tr in val_traces[t]]))
    if len(data.manifests) > 1:
        for i, manifest in enumerate(data.manifests):
            keep = source != i
            arms.append((f"{ALL_BUT}{manifest['path']}", keep, traces_for(data, val_mask & keep)))
    rows = []
    for a, mask_a, tune_on in tqdm(arms, desc="cross-task", disable=not cfg.progress):
        fit = train_mask & drafted & mask_a
        if len(np.unique(y[fit])) < 2 or not tune_on:
            continue  # one class only (or no validation prompt): nothing to learn or tune for this task
        if a == ALL_TASKS:
            model, t, tau = full
        else:
            model = fit_model(
                cfg.model, X[fit], y[fit], features, cfg.seed, cfg.balanced, None if soft is None else soft[fit]
            )
            t = tune_token_rule(tune_on, model, cost, cfg.max_window).best
            tau = tune_threshold(tune_on, cost, cfg.max_window).best
        for b, traces in val_traces.items():
            if not traces:
                continue
            sims = simulate_many(
                traces,
                {
                    "classifier": replay_policy("classifier", classifier_setting=t, model=model),
                    "threshold": replay_policy("threshold", threshold=tau),
                },
                cfg.max_window,
            )
            clf, thr = sims["classifier"].speedup(cost), sims["threshold"].speedup(cost)
            rows.append(
                {
                    "train_task": a,
                    "test_task": b,
                    "threshold": t,
                    "tau": tau,
                    "classifier": clf,
                    "tuned_threshold": thr,
                    "ratio": clf / thr,
                }
            )
    return rows
