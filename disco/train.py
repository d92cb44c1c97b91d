"""`disco train`: fit the stopping classifier on oracle traces and choose its threshold for speed.

    traces ──► split by prompt (train / validation) ──► fit on train rows (FEATURES only)
           ──► metrics on validation rows ──► threshold = argmax of simulated speedup on the
               validation prompts (cost model: a `disco profile` JSON or the default)
           ──► baselines tuned the same way on the same prompts ──► artifact + report

Rows: the trainer fits on rows with oracle_drafted True. Those are the draft steps of the
oracle's windows, i.e. exactly the decisions "is this token accepted, given every earlier
token of its window was" that any policy faces, and the only rows whose stored window
features (window_pos, window_prob_prod, prev_accepted) describe a real window; the other
rows (positions the oracle never drafts: the target's bonus token after a window that hit
its cap) carry no window of their own. The validation speedups are measured on all rows
by the simulator, which recomputes window features for each policy's own windows.

Class imbalance: most drafted tokens are accepted. Rather than reweighting by default,
which would shift the probabilities away from calibrated acceptance rates (log-loss and a
future product-of-probabilities rule need them calibrated), the imbalance is handled where
it matters: the operating point is the threshold that maximises simulated speedup, not
0.5, and the metrics include PR-AUC of the minority (rejected) class. `balanced=True`
(--balanced) reweights the classes instead.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from disco.artifact import DenseModel, LightGBMModel, Model, save_artifact
from disco.engines.base import numeric_identity
from disco.errors import DiscoError
from disco.features import DISCO_FEATURES, FEATURES
from disco.policy import DEFAULT_K, DEFAULT_MAX_WINDOW, DEFAULT_THRESHOLD
from disco.simulate import (CostModel, PromptTrace, SimResult, check_columns, prompt_traces, read_traces,
                            replay_policy, simulate_many)

if TYPE_CHECKING:
    import pandas as pd

MODEL_KINDS = ("lightgbm", "logistic", "mlp")
DEFAULT_MODEL = "lightgbm"
DEFAULT_VAL_FRACTION = 0.2
# Candidate thresholds, for the classifier's P(accept) and for the draft probability tau alike:
# steps of 0.05, finer at both ends (with most tokens accepted, a classifier's best threshold on
# the embedded pair can lie above 0.95).
THRESHOLD_GRID: tuple[float, ...] = tuple(sorted({round(0.05 * i, 2) for i in range(1, 20)}
                                                 | {0.01, 0.02, 0.03, 0.97, 0.98, 0.99, DEFAULT_THRESHOLD}))
TRAIN_COLUMNS = ("prompt_id", "oracle_drafted", "label", *FEATURES)
ALL_TASKS = "all tasks"


@dataclass
class TrainConfig:
    traces: list[Path]  # trace folders written by `disco collect` (or Parquet files)
    out: Path  # the artifact folder, e.g. models/NAME
    model: str = DEFAULT_MODEL  # lightgbm, logistic or mlp
    profile: Path | None = None  # cost model JSON from `disco profile`; None: CostModel.default()
    max_window: int = DEFAULT_MAX_WINDOW  # max window of the simulated policies (as at decoding time)
    val_fraction: float = DEFAULT_VAL_FRACTION  # share of prompts held out for metrics and tuning
    seed: int = 0  # split and model seed
    balanced: bool = False  # reweight classes to equal total weight (see the module docstring)
    ablate: bool = False  # also train on feature subsets and report their tuned speedups
    cross_task: bool = False  # also train on each task alone and test on every task
    progress: bool = True  # progress bars on stderr


# --- data ------------------------------------------------------------------------------------


@dataclass
class TraceData:
    rows: pd.DataFrame  # all trace rows; column "_source" indexes `budgets`
    budgets: list[int | None]  # max_new_tokens of each source (None: unknown, y cut by the budget)
    manifests: list[dict]  # the sources' manifests, with their paths
    pair: dict  # target, draft, tokenizer_hash of the pair the traces come from


def _pair_of(manifest: dict) -> dict:
    pair = manifest.get("pair") if isinstance(manifest.get("pair"), dict) else {}
    out = {k: pair.get(k) for k in ("target", "draft", "tokenizer_hash")}
    out["engine"] = numeric_identity(pair.get("engine"))  # the engine that computed the traces
    out["tokenizer_hash"] = out["tokenizer_hash"] or manifest.get("tokenizer_hash")
    return out


def load_trace_data(paths: Sequence[str | Path]) -> TraceData:
    """Read and check traces: columns, feature list, one pair, both labels present."""
    import pandas as pd

    if not paths:
        raise DiscoError("no traces given: pass --traces FOLDER (written by disco collect)")
    sources = read_traces(paths)
    manifests, pairs = [], []
    for src in sources:
        if src.manifest is None:
            raise DiscoError(f"{src.path} has no manifest.json beside its Parquet shards: the pair the traces "
                             "come from is unknown (recollect them with disco collect)")
        if "features" in src.manifest and list(src.manifest["features"]) != list(FEATURES):
            raise DiscoError(f"{src.path} was collected with another feature list than this disco's: recollect it")
        check_columns(src.rows, TRAIN_COLUMNS, "training")
        manifests.append({"path": str(src.path), **src.manifest})
        pairs.append(_pair_of(src.manifest))
    if any(p != pairs[0] for p in pairs):
        raise DiscoError(f"the traces come from different pairs ({', '.join(map(str, pairs))}): train one "
                         "classifier per pair")
    rows = pd.concat([src.rows.assign(_source=i) for i, src in enumerate(sources)], ignore_index=True)
    rows["prompt_id"] = rows["prompt_id"].astype(str)
    labels = rows.loc[rows["oracle_drafted"].astype(bool), "label"]
    if labels.nunique() < 2:
        which = "accepted" if labels.empty or int(labels.iloc[0]) == 1 else "rejected"
        raise DiscoError(f"every drafted token in the traces is {which}: a classifier needs both accepted and "
                         "rejected tokens (collect more or more varied prompts)")
    if rows["prompt_id"].nunique() < 2:
        raise DiscoError("the traces hold a single prompt: training needs at least two (split by prompt)")
    return TraceData(rows, [src.max_new_tokens for src in sources], manifests, pairs[0])


def split_by_prompt(prompt_ids: Sequence[str], val_fraction: float, seed: int,
                    tasks: Sequence[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Boolean masks (train, validation) over rows, grouped so that no prompt is on both sides and
    stratified by task: each task with two prompts or more puts round(val_fraction * its prompts)
    (at least one) into validation, so every task is measured."""
    if not 0.0 < val_fraction < 1.0:
        raise DiscoError(f"--val-fraction must be within (0, 1) (got {val_fraction})")
    ids = np.asarray(prompt_ids)
    row_tasks = np.asarray(tasks) if tasks is not None else np.full(len(ids), "")
    rng = np.random.default_rng(seed)
    val_ids: list[str] = []
    for task in sorted(set(row_tasks.tolist())):
        prompts = sorted(set(ids[row_tasks == task].tolist()))
        if len(prompts) >= 2:
            n_val = min(len(prompts) - 1, max(1, round(val_fraction * len(prompts))))
            val_ids += rng.permutation(prompts)[:n_val].tolist()
    val = np.isin(ids, val_ids)
    return ~val, val


def traces_for(data: TraceData, mask: np.ndarray) -> list[PromptTrace]:
    """The simulator's per-prompt traces of the rows in `mask`, each with its source's budget."""
    sub = data.rows[mask]
    return [tr for i, budget in enumerate(data.budgets)
            for tr in prompt_traces(sub[sub["_source"] == i], budget) if len(tr)]


# --- models ------------------------------------------------------------------------------------


def fit_model(kind: str, X: np.ndarray, y: np.ndarray, columns: Sequence[int] | None = None, seed: int = 0,
              balanced: bool = False) -> Model:
    """Fit on FEATURES[columns] of X (all when None) and return the portable model (artifact.py),
    which is what every later prediction uses, so the saved artifact predicts identically."""
    from sklearn.utils.class_weight import compute_sample_weight

    if kind not in MODEL_KINDS:
        raise DiscoError(f"unknown model {kind!r}: choose one of {', '.join(MODEL_KINDS)}")
    cols = list(range(len(FEATURES))) if columns is None else list(columns)
    Xc, weight = X[:, cols], compute_sample_weight("balanced", y) if balanced else None
    if kind == "lightgbm":
        import lightgbm

        clf = lightgbm.LGBMClassifier(n_estimators=200, learning_rate=0.05, num_leaves=31, min_child_samples=20,
                                      subsample=0.8, subsample_freq=1, colsample_bytree=0.9, random_state=seed,
                                      verbose=-1)
        clf.fit(Xc, y, sample_weight=weight, feature_name=[FEATURES[i] for i in cols])
        return LightGBMModel(clf.booster_, cols)
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    clf = (LogisticRegression(max_iter=1000) if kind == "logistic"
           else MLPClassifier(hidden_layer_sizes=(32, 32), max_iter=300, early_stopping=True, random_state=seed))
    pipe = make_pipeline(StandardScaler(), clf)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # small data: a few more iterations change little
        pipe.fit(Xc, y, **{f"{pipe.steps[-1][0]}__sample_weight": weight} if balanced else {})
    return DenseModel.from_sklearn(pipe, cols)


def classification_metrics(y: np.ndarray, p: np.ndarray) -> dict:
    """ROC-AUC, PR-AUC (accepted and rejected class), log-loss, accuracy at 0.5, on one split."""
    from sklearn.metrics import accuracy_score, average_precision_score, log_loss, roc_auc_score

    both = len(np.unique(y)) == 2  # ranking metrics need both classes
    return {
        "rows": int(len(y)),
        "accept_rate": float(np.mean(y)),
        "roc_auc": float(roc_auc_score(y, p)) if both else None,
        "pr_auc": float(average_precision_score(y, p)) if both else None,
        "pr_auc_reject": float(average_precision_score(1 - y, 1 - p)) if both else None,
        "log_loss": float(log_loss(y, np.clip(p, 1e-7, 1 - 1e-7), labels=[0, 1])),
        "accuracy": float(accuracy_score(y, p >= 0.5)),
    }


def permutation_importance(model: Model, X: np.ndarray, y: np.ndarray, seed: int = 0) -> dict[str, float]:
    """Drop in validation ROC-AUC when one feature's column is shuffled (0 for unused features):
    one measure for every model kind."""
    from sklearn.metrics import roc_auc_score

    if len(np.unique(y)) < 2:
        return {}
    rng = np.random.default_rng(seed)
    base = roc_auc_score(y, model.predict_proba(X))
    out = {}
    for i, name in enumerate(FEATURES):
        if i not in model.columns:
            out[name] = 0.0
            continue
        Xp = X.copy()
        Xp[:, i] = rng.permutation(Xp[:, i])
        out[name] = float(base - roc_auc_score(y, model.predict_proba(Xp)))
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


# --- tuning by simulated speedup ----------------------------------------------------------------


@dataclass
class Tuned:
    best: float | int  # the candidate with the highest simulated speedup (the first one on ties)
    speedups: dict  # candidate -> simulated speedup
    result: SimResult  # the simulation at `best`


def tune(traces: Sequence[PromptTrace], factory_at: Callable[[float | int], Callable], candidates: Sequence,
         cost: CostModel, max_window: int, progress: bool = False) -> Tuned:
    """The candidate setting that maximises cost-model speedup over `traces` (one batched simulation)."""
    sims = simulate_many(traces, {c: factory_at(c) for c in candidates}, max_window, progress)
    speedups = {c: sims[c].speedup(cost) for c in candidates}
    best = candidates[int(np.argmax([speedups[c] for c in candidates]))]
    return Tuned(best, speedups, sims[best])


def policy_table(traces: Sequence[PromptTrace], model: Model, cost: CostModel, max_window: int,
                 progress: bool = False) -> tuple[list[dict], dict[str, Tuned]]:
    """Simulated validation speedup of the oracle, the tuned classifier and the baselines, each
    tuned on the same prompts under the same cost model."""
    tuned = {
        "classifier": tune(traces, lambda t: replay_policy("classifier", threshold=t, model=model),
                           THRESHOLD_GRID, cost, max_window, progress),
        "threshold": tune(traces, lambda t: replay_policy("threshold", threshold=t), THRESHOLD_GRID, cost,
                          max_window, progress),
        "constant": tune(traces, lambda k: replay_policy("constant", k=k), list(range(1, max(max_window, 1) + 1)),
                         cost, max_window, progress),
    }
    fixed = simulate_many(traces, {"oracle": replay_policy("oracle"), "heuristic": replay_policy("heuristic"),
                                   "tau": replay_policy("threshold", threshold=DEFAULT_THRESHOLD)}, max_window)
    rows = [
        ("oracle", "knows y", fixed["oracle"]),
        ("classifier", f"t = {tuned['classifier'].best:g} (tuned)", tuned["classifier"].result),
        ("threshold", f"tau = {tuned['threshold'].best:g} (tuned)", tuned["threshold"].result),
        ("threshold", f"tau = {DEFAULT_THRESHOLD:g} (transformers)", fixed["tau"]),
        ("constant", f"k = {tuned['constant'].best} (tuned)", tuned["constant"].result),
        ("heuristic", f"k0 = {DEFAULT_K} (transformers)", fixed["heuristic"]),
    ]
    return [{"policy": p, "setting": s, **sim.summary(cost)} for p, s, sim in rows], tuned


def _feature_groups() -> list[tuple[str, list[str]]]:
    """The features added to DISCO's inputs, copy_* and class_* as one group each."""
    groups: dict[str, list[str]] = {}
    for f in FEATURES:
        if f not in DISCO_FEATURES:
            key = f"{f.split('_')[0]}_*" if f.startswith(("copy_", "class_")) else f
            groups.setdefault(key, []).append(f)
    return list(groups.items())


def ablation(kind: str, X_tr: np.ndarray, y_tr: np.ndarray, X_val: np.ndarray, y_val: np.ndarray,
             traces: Sequence[PromptTrace], cost: CostModel, cfg: TrainConfig, full: tuple[Model, float]) -> list[dict]:
    """Tuned simulated speedup with DISCO's inputs only, all features, and all but each added group."""
    from tqdm.auto import tqdm

    variants = [("DISCO inputs only", [FEATURES.index(f) for f in DISCO_FEATURES]), ("all features", None)]
    variants += [(f"all − {name}", [i for i, f in enumerate(FEATURES) if f not in group])
                 for name, group in _feature_groups()]
    rows = []
    for name, cols in tqdm(variants, desc="ablation", disable=not cfg.progress):
        model = full[0] if cols is None else fit_model(kind, X_tr, y_tr, cols, cfg.seed, cfg.balanced)
        t = tune(traces, lambda th: replay_policy("classifier", threshold=th, model=model), THRESHOLD_GRID, cost,
                 cfg.max_window)
        auc = classification_metrics(y_val, model.predict_proba(X_val))["roc_auc"]
        rows.append({"variant": name, "features": len(model.columns), "roc_auc": auc, "threshold": t.best,
                     "speedup": t.speedups[t.best]})
    base = rows[1]["speedup"]
    for r in rows:
        r["delta_vs_all"] = r["speedup"] - base
    return rows


# --- per task ----------------------------------------------------------------------------------


def row_tasks(rows: pd.DataFrame) -> np.ndarray:
    """The task of each row (traces without a task column count as one task, "")."""
    return rows["task"].fillna("").to_numpy(str) if "task" in rows else np.full(len(rows), "")


def task_masks(rows: pd.DataFrame) -> dict[str, np.ndarray]:
    """Row mask of each task."""
    tasks = row_tasks(rows)
    return {t: tasks == t for t in sorted(set(tasks.tolist()))}


def per_task_table(data: TraceData, val_mask: np.ndarray, model: Model, tuned: dict[str, Tuned], cost: CostModel,
                   max_window: int) -> list[dict]:
    """Simulated speedup per task on the validation prompts, every policy at the ONE setting tuned
    on all validation prompts (what a user deploys), the classifier's ratio to the tuned threshold."""
    factories = {
        "oracle": replay_policy("oracle"),
        "classifier": replay_policy("classifier", threshold=tuned["classifier"].best, model=model),
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


def cross_task(data: TraceData, train_mask: np.ndarray, val_mask: np.ndarray, X: np.ndarray, y: np.ndarray,
               cost: CostModel, cfg: TrainConfig, full: tuple[Model, dict[str, Tuned]]) -> list[dict]:
    """Train on one task, test on another: for each training task A (and all tasks together), fit
    on A's training prompts, tune the classifier's threshold and tau on A's validation prompts,
    then simulate both on each task B's validation prompts (never seen in fitting or tuning).
    full: the model trained on all tasks and its tuned settings (`policy_table`), reused as is."""
    from tqdm.auto import tqdm

    masks = task_masks(data.rows)
    drafted = data.rows["oracle_drafted"].to_numpy(bool)
    val_traces = {t: traces_for(data, val_mask & m) for t, m in masks.items()}
    rows = []
    for a, mask_a in tqdm([*masks.items(), (ALL_TASKS, np.ones(len(y), bool))], desc="cross-task",
                          disable=not cfg.progress):
        fit = train_mask & drafted & mask_a
        tune_on = [tr for t in masks if a in (t, ALL_TASKS) for tr in val_traces[t]]
        if len(np.unique(y[fit])) < 2 or not tune_on:
            continue  # one class only (or no validation prompt): nothing to learn or tune for this task
        if a == ALL_TASKS:
            model, t, tau = full[0], full[1]["classifier"].best, full[1]["threshold"].best
        else:
            model = fit_model(cfg.model, X[fit], y[fit], None, cfg.seed, cfg.balanced)
            t = tune(tune_on, lambda th: replay_policy("classifier", threshold=th, model=model), THRESHOLD_GRID, cost,
                     cfg.max_window).best
            tau = tune(tune_on, lambda th: replay_policy("threshold", threshold=th), THRESHOLD_GRID, cost,
                       cfg.max_window).best
        for b, traces in val_traces.items():
            if not traces:
                continue
            sims = simulate_many(traces, {"classifier": replay_policy("classifier", threshold=t, model=model),
                                          "threshold": replay_policy("threshold", threshold=tau)}, cfg.max_window)
            clf, thr = sims["classifier"].speedup(cost), sims["threshold"].speedup(cost)
            rows.append({"train_task": a, "test_task": b, "threshold": t, "tau": tau, "classifier": clf,
                         "tuned_threshold": thr, "ratio": clf / thr})
    return rows


# --- the whole command -------------------------------------------------------------------------


@dataclass
class TrainReport:
    out: Path
    threshold: float
    metrics: dict  # validation metrics of the saved model
    table: list[dict]  # policy speedup table (validation prompts, simulated)
    importance: dict[str, float]
    cost: CostModel
    ablation: list[dict] = field(default_factory=list)
    split: dict = field(default_factory=dict)
    per_task: list[dict] = field(default_factory=list)
    cross_task: list[dict] = field(default_factory=list)

    def markdown(self) -> str:
        m = self.metrics
        f = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
        lines = [
            f"# disco classifier: {self.out}",
            "",
            f"Split by prompt: {self.split.get('train_prompts')} train / {self.split.get('val_prompts')} validation "
            f"prompts ({self.split.get('train_rows')} / {m['rows']} drafted rows); validation accept rate "
            f"{m['accept_rate']:.3f}.",
            "",
            "| ROC-AUC | PR-AUC (accept) | PR-AUC (reject) | log-loss | accuracy@0.5 |",
            "|---|---|---|---|---|",
            f"| {f(m['roc_auc'])} | {f(m['pr_auc'])} | {f(m['pr_auc_reject'])} | {f(m['log_loss'])} | "
            f"{f(m['accuracy'])} |",
            "",
            f"Simulated speedup over target-only decoding on the validation prompts; cost model: {self.cost.source} "
            f"(c_d/c_t(1) = {self.cost.c_d / self.cost.c_t[0]:.3f}, c_t({len(self.cost.c_t)})/c_t(1) = "
            f"{self.cost.c_t[-1] / self.cost.c_t[0]:.3f}). Tuned settings are tuned on these same prompts.",
            "",
            "| policy | setting | speedup | target fwd/token | draft fwd/token | accepted/window | approx. drafts |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in self.table:
            lines.append(f"| {r['policy']} | {r['setting']} | {r['speedup']:.3f} | {r['target_forwards_per_token']:.3f}"
                         f" | {r['draft_forwards_per_token']:.3f} | {r['mean_accepted']:.2f} | "
                         f"{100 * r['approx_drafts']:.1f}% |")
        if self.per_task:
            lines += ["", "Per task (validation prompts; every policy at the setting tuned on all of them):", "",
                      "| task | prompts | oracle | classifier | tuned threshold | tau = 0.4 | tuned constant | heuristic "
                      "| classifier / tuned threshold |", "|---|---|---|---|---|---|---|---|---|"]
            lines += [f"| {r['task']} | {r['prompts']} | {r['oracle']:.3f} | {r['classifier']:.3f} | {r['threshold']:.3f}"
                      f" | {r['tau']:.3f} | {r['constant']:.3f} | {r['heuristic']:.3f} | "
                      f"{r['classifier'] / r['threshold']:.3f} |" for r in self.per_task]
        if self.cross_task:
            lines += ["", "Train on one task, test on another (fit on the training task's train prompts, threshold "
                      "and tau tuned on its validation prompts, tested on the test task's validation prompts):", "",
                      "| trained on | tested on | classifier t | classifier | tau | tuned threshold | ratio |",
                      "|---|---|---|---|---|---|---|"]
            lines += [f"| {r['train_task']} | {r['test_task']} | {r['threshold']:g} | {r['classifier']:.3f} | "
                      f"{r['tau']:g} | {r['tuned_threshold']:.3f} | {r['ratio']:.3f} |" for r in self.cross_task]
        lines += ["", "Permutation importance (drop in validation ROC-AUC when shuffled):", "",
                  "| feature | importance |", "|---|---|"]
        lines += [f"| {k} | {v:.4f} |" for k, v in self.importance.items()]
        if self.ablation:
            lines += ["", "Ablation (each variant retrained, threshold tuned by simulated speedup):", "",
                      "| variant | features | ROC-AUC | threshold | speedup | vs all |", "|---|---|---|---|---|---|"]
            lines += [f"| {r['variant']} | {r['features']} | {f(r['roc_auc'])} | {r['threshold']:g} | "
                      f"{r['speedup']:.3f} | {r['delta_vs_all']:+.3f} |" for r in self.ablation]
        return "\n".join(lines) + "\n"


def train(cfg: TrainConfig) -> TrainReport:
    if cfg.model not in MODEL_KINDS:
        raise DiscoError(f"unknown model {cfg.model!r}: choose one of {', '.join(MODEL_KINDS)}")
    if cfg.max_window < 1:
        raise DiscoError(f"--max-window must be at least 1 (got {cfg.max_window})")
    cost = CostModel.load(cfg.profile) if cfg.profile is not None else CostModel.default(cfg.max_window)
    cost.verify(cfg.max_window + 1)  # fail now, not after training, if the profile is too short
    data = load_trace_data(cfg.traces)
    rows = data.rows
    train_mask, val_mask = split_by_prompt(rows["prompt_id"].to_numpy(), cfg.val_fraction, cfg.seed,
                                           row_tasks(rows))
    drafted = rows["oracle_drafted"].to_numpy(bool)
    X = rows[list(FEATURES)].to_numpy(np.float64)
    y = rows["label"].to_numpy(int)
    tr, va = train_mask & drafted, val_mask & drafted
    if len(np.unique(y[tr])) < 2:
        raise DiscoError("the training prompts' drafted tokens are all of one class: add prompts or change --seed")

    model = fit_model(cfg.model, X[tr], y[tr], None, cfg.seed, cfg.balanced)
    metrics = classification_metrics(y[va], model.predict_proba(X[va]))
    importance = permutation_importance(model, X[va], y[va], cfg.seed)
    val_traces = traces_for(data, val_mask)
    table, tuned = policy_table(val_traces, model, cost, cfg.max_window, cfg.progress)
    threshold = float(tuned["classifier"].best)
    abl = ablation(cfg.model, X[tr], y[tr], X[va], y[va], val_traces, cost, cfg, (model, threshold)) if cfg.ablate else []
    tasks = per_task_table(data, val_mask, model, tuned, cost, cfg.max_window)
    cross = cross_task(data, train_mask, val_mask, X, y, cost, cfg, (model, tuned)) if cfg.cross_task else []

    split = {
        "train_prompts": int(rows.loc[train_mask, "prompt_id"].nunique()),
        "val_prompts": int(rows.loc[val_mask, "prompt_id"].nunique()),
        "train_rows": int(tr.sum()),
        "val_prompt_ids": sorted(rows.loc[val_mask, "prompt_id"].unique().tolist()),
    }
    report = TrainReport(cfg.out, threshold, metrics, table, importance, cost, abl, split, tasks, cross)
    save_artifact(cfg.out, model, {
        "threshold": threshold,
        "pair": data.pair,
        "tokenizer_hash": data.pair.get("tokenizer_hash"),
        "max_window": cfg.max_window,
        "training": {
            "rows": "oracle_drafted",
            "balanced": cfg.balanced,
            "seed": cfg.seed,
            "val_fraction": cfg.val_fraction,
            **split,
            "traces": data.manifests,
        },
        "validation_metrics": metrics,
        "cost_model": cost.to_dict(),
        "tuned": {  # what `disco compare --tuned-k/--tuned-threshold` should use for fair baselines
            "classifier_threshold": threshold,
            "threshold": float(tuned["threshold"].best),
            "k": int(tuned["constant"].best),
        },
        "speedups": table,
        "importance": importance,
        "ablation": abl,
        "per_task": tasks,
        "cross_task": cross,
    }, report.markdown())
    return report
