"""`disco train`: fit the stopping classifier on oracle traces and choose its rule for speed.

    traces ──► split by prompt (train / validation) ──► fit on train rows: the model on FEATURES,
               and (traces with hidden states) an acceptance head on the draft's hidden state + FEATURES
           ──► metrics on validation rows ──► Platt calibration on validation rows
           ──► every model under every rule (classifier.RULES), its parameter tuned by simulated
               speedup on the validation prompts (cost model: a `disco profile` JSON or the default)
           ──► baselines tuned the same way on the same prompts (threshold, constant, AdaEDL, SVIP)
           ──► the choice: the fastest learned (model, rule), or the tuned threshold if that is
               faster; recorded with its margin ──► artifact + report

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

from disco.artifact import Calibrated, Calibration, DenseModel, LightGBMModel, Model, save_artifact
from disco.classifier import RULES
from disco.cost import CostModel
from disco.defaults import (
    DEFAULT_ABLATE,
    DEFAULT_BALANCED,
    DEFAULT_CROSS_TASK,
    DEFAULT_HEAD,
    DEFAULT_LABELS,
    DEFAULT_MODEL,
    DEFAULT_TARGET_SIGNALS,
    DEFAULT_TRAIN_SEED,
    DEFAULT_VAL_FRACTION,
    LABELS,
    MODEL_KINDS,
)
from disco.engines.base import numeric_identity
from disco.errors import DiscoError
from disco.features import DISCO_FEATURES, FEATURES, TARGET_SIGNALS
from disco.files import check_out_dir, write_dir
from disco.mtbench import load_split, split_of_prompt
from disco.policy import ADAEDL_LAMBDA, DEFAULT_K, DEFAULT_MAX_WINDOW, DEFAULT_THRESHOLD, SVIP_H
from disco.settings import WINDOW, check_setting
from disco.simulate import (
    SIGNAL_COLUMNS,
    PromptTrace,
    SimResult,
    check_columns,
    prompt_traces,
    replay_policy,
    signal_columns,
    simulate_many,
)
from disco.trace import HIDDEN_COLUMN, read_traces

if TYPE_CHECKING:
    import pandas as pd

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
TRAIN_COLUMNS = (
    "prompt_id",
    "oracle_drafted",
    "label",
    "accept_prob",
    *(f for f in FEATURES if f not in TARGET_SIGNALS),
)
ALL_TASKS = "all tasks"
ALL_BUT = "all but "  # cross-task: trained without one trace folder


@dataclass
class TrainConfig:
    traces: list[Path]  # trace folders written by `disco collect` (or Parquet files)
    out: Path  # the artifact folder, e.g. models/NAME
    model: str = DEFAULT_MODEL  # lightgbm, logistic or mlp
    profile: Path | None = None  # cost model JSON from `disco profile`; None: CostModel.default()
    max_window: int = DEFAULT_MAX_WINDOW  # max window of the simulated policies (as at decoding time)
    val_fraction: float = DEFAULT_VAL_FRACTION  # share of prompts held out for metrics and tuning
    seed: int = DEFAULT_TRAIN_SEED  # split and model seed
    balanced: bool = DEFAULT_BALANCED  # reweight classes to equal total weight (see the module docstring)
    ablate: bool = DEFAULT_ABLATE  # also train on feature subsets and report their tuned speedups
    cross_task: bool = DEFAULT_CROSS_TASK  # also train on each task alone and test on every task
    head: bool = DEFAULT_HEAD  # also fit an acceptance head on the draft's hidden state (traces that hold it)
    progress: bool = True  # progress bars on stderr
    target_signals: bool = (
        DEFAULT_TARGET_SIGNALS  # fit on the last_* features (False: for vLLM, which cannot give them)
    )
    labels: str = (
        DEFAULT_LABELS  # fit on: "sampled" accept/reject, "soft" min(1, p/q) (sampled traces); auto: soft when sampled
    )


# --- data ------------------------------------------------------------------------------------


@dataclass
class TraceData:
    rows: pd.DataFrame  # all trace rows; column "_source" indexes `budgets`
    budgets: list[int | None]  # max_new_tokens of each source (None: unknown, y cut by the budget)
    manifests: list[dict]  # the sources' manifests, with their paths
    pair: dict  # target, draft, tokenizer_hash of the pair the traces come from
    features: list[int]  # indices of the FEATURES the traces hold (older traces lack the target signals)
    hidden: dict | None = None  # the traces' hidden-state record (features.hidden_info); None: no hidden states
    sampling: dict = field(default_factory=lambda: {"temperature": 0.0, "top_p": 1.0})  # what the traces decoded with

    @property
    def sampled(self) -> bool:
        return self.sampling["temperature"] > 0

    def hidden_matrix(self, mask: np.ndarray) -> np.ndarray:
        """(rows in mask, stored_dim) float32 draft hidden states."""
        blob = b"".join(self.rows.loc[mask, HIDDEN_COLUMN].to_numpy())
        return np.frombuffer(blob, np.float16).reshape(int(mask.sum()), -1).astype(np.float32)


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
    manifests, pairs, hidden = [], [], []
    for src in sources:
        if src.manifest is None:
            raise DiscoError(
                f"{src.path} has no manifest.json beside its Parquet shards: the pair the traces "
                "come from is unknown (recollect them with disco collect)"
            )
        check_columns(src.rows, TRAIN_COLUMNS, "training")
        manifests.append({"path": str(src.path), **src.manifest})
        pairs.append(_pair_of(src.manifest))
        hidden.append(src.manifest.get("hidden") if HIDDEN_COLUMN in src.rows.columns else None)
    if any(p != pairs[0] for p in pairs):
        raise DiscoError(
            f"the traces come from different pairs ({', '.join(map(str, pairs))}): train one classifier per pair"
        )
    sampling = [src.sampling for src in sources]
    if any(s != sampling[0] for s in sampling):
        shown = ", ".join(f"temperature {s['temperature']:g} top-p {s['top_p']:g}" for s in sampling)
        raise DiscoError(
            f"the traces were collected under different sampling settings ({shown}): train one "
            "classifier per setting (acceptance depends on it)"
        )
    # Older traces (disco-trace/1) lack the target-side signals: train on the features all sources have.
    signals = all(all(c in src.rows.columns for c in TARGET_SIGNALS) and signal_columns(src.rows) for src in sources)
    features = [i for i, f in enumerate(FEATURES) if signals or f not in TARGET_SIGNALS]
    rows = pd.concat([src.rows.assign(_source=i) for i, src in enumerate(sources)], ignore_index=True)
    for f in FEATURES:
        if f not in rows.columns:
            rows[f] = 0.0  # never read: no model is given this column
    if not signals:
        rows = rows.drop(columns=[c for c in (*SIGNAL_COLUMNS, "target_top1") if c in rows.columns])
    if any(h != hidden[0] for h in hidden) or hidden[0] is None:
        hidden = [None]  # hidden states only when every source holds the same kind
        rows = rows.drop(columns=[HIDDEN_COLUMN], errors="ignore")
    rows["prompt_id"] = rows["prompt_id"].astype(str)
    labels = rows.loc[rows["oracle_drafted"].astype(bool), "label"]
    if labels.nunique() < 2:
        which = "accepted" if labels.empty or int(labels.iloc[0]) == 1 else "rejected"
        raise DiscoError(
            f"every drafted token in the traces is {which}: a classifier needs both accepted and "
            "rejected tokens (collect more or more varied prompts)"
        )
    if rows["prompt_id"].nunique() < 2:
        raise DiscoError("the traces hold a single prompt: training needs at least two (split by prompt)")
    return TraceData(
        rows, [src.max_new_tokens for src in sources], manifests, pairs[0], features, hidden[0], sampling[0]
    )


def split_by_prompt(
    prompt_ids: Sequence[str],
    val_fraction: float,
    seed: int,
    tasks: Sequence[str] | None = None,
    fixed: Callable[[str], str | None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Boolean masks (train, validation) over rows, grouped so that no prompt is on both sides and
    stratified by task: each task with two prompts or more puts round(val_fraction * its prompts)
    (at least one) into validation, so every task is measured. fixed(id): a prompt's side when a split
    file places it ("train" or "val"; MT-Bench's data/mt-bench-split.json by default), None to draw it;
    a prompt it places in "test" is refused, so training and tuning never see a test question."""
    check_setting("val_fraction", val_fraction)
    ids = np.asarray(prompt_ids)
    row_tasks = np.asarray(tasks) if tasks is not None else np.full(len(ids), "")
    fixed = fixed or _mt_bench_split()
    placed = {pid: fixed(pid) for pid in sorted(set(ids.tolist()))}
    tests = [pid for pid, side in placed.items() if side == "test"]
    if tests:
        raise DiscoError(
            f"the traces hold {len(tests)} MT-Bench test prompt(s) ({', '.join(tests[:3])}"
            f"{', …' if len(tests) > 3 else ''}), which training must never see: collect MT-Bench with "
            "mt-bench:train+val (and mt-bench-2:train+val) instead"
        )
    rng = np.random.default_rng(seed)
    val_ids = [pid for pid, side in placed.items() if side == "val"]
    drawn = np.isin(ids, [pid for pid, side in placed.items() if side is None])
    for task in sorted(set(row_tasks[drawn].tolist())):
        prompts = sorted(set(ids[drawn & (row_tasks == task)].tolist()))
        if len(prompts) >= 2:
            n_val = min(len(prompts) - 1, max(1, round(val_fraction * len(prompts))))
            val_ids += rng.permutation(prompts)[:n_val].tolist()
    val = np.isin(ids, val_ids)
    return ~val, val


def _mt_bench_split() -> Callable[[str], str | None]:
    """MT-Bench's committed split as a `fixed` of split_by_prompt (read only when an MT-Bench id is asked about)."""
    split: dict[int, tuple[str, str]] = {}

    def side(prompt_id: str) -> str | None:
        if not prompt_id.startswith("mt-bench-"):
            return None
        if not split:
            split.update(load_split())
        return split_of_prompt(prompt_id, split)

    return side


def traces_for(data: TraceData, mask: np.ndarray, expected: bool | None = None) -> list[PromptTrace]:
    """The simulator's per-prompt traces of the rows in `mask`, each with its source's budget; sampled
    traces count each window's expected acceptance (simulate.py) unless `expected` is False."""
    sub = data.rows[mask]
    expected = data.sampled if expected is None else expected
    return [
        tr
        for i, budget in enumerate(data.budgets)
        for tr in prompt_traces(sub[sub["_source"] == i], budget, data.hidden is not None, expected)
        if len(tr)
    ]


# --- models ------------------------------------------------------------------------------------


def soft_rows(
    X: np.ndarray, soft: np.ndarray, weight: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Soft labels as weighted hard ones: each row twice, labelled 1 with weight a and 0 with 1 - a.
    The log-loss of that data is the cross-entropy against a, so any classifier taking sample weights
    fits P(accept) to the soft label."""
    w = np.ones(len(soft)) if weight is None else weight
    return (
        np.concatenate([X, X]),
        np.concatenate([np.ones(len(soft), int), np.zeros(len(soft), int)]),
        np.concatenate([w * soft, w * (1 - soft)]),
    )


def fit_model(
    kind: str,
    X: np.ndarray,
    y: np.ndarray,
    columns: Sequence[int] | None = None,
    seed: int = 0,
    balanced: bool = False,
    soft: np.ndarray | None = None,
) -> Model:
    """Fit on FEATURES[columns] of X (all when None) and return the portable model (artifact.py),
    which is what every later prediction uses, so the saved artifact predicts identically.
    soft: fit on these acceptance probabilities instead of the labels y (soft_rows).
    (The head on the draft's hidden state is `fit_head`.)"""
    from sklearn.utils.class_weight import compute_sample_weight

    if kind not in MODEL_KINDS:
        raise DiscoError(f"unknown model {kind!r}: choose one of {', '.join(MODEL_KINDS)}")
    cols = list(range(len(FEATURES))) if columns is None else list(columns)
    Xc, weight = X[:, cols], compute_sample_weight("balanced", y) if balanced else None
    if soft is not None:
        Xc, y, weight = soft_rows(Xc, soft, weight)
    if kind == "lightgbm":
        import lightgbm

        clf = lightgbm.LGBMClassifier(
            n_estimators=200,
            learning_rate=0.05,
            num_leaves=31,
            min_child_samples=20,
            subsample=0.8,
            subsample_freq=1,
            colsample_bytree=0.9,
            random_state=seed,
            verbose=-1,
        )
        clf.fit(Xc, y, sample_weight=weight, feature_name=[FEATURES[i] for i in cols])
        return LightGBMModel(clf.booster_, cols)
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    clf = (
        LogisticRegression(max_iter=1000)
        if kind == "logistic"
        else MLPClassifier(hidden_layer_sizes=(32, 32), max_iter=300, early_stopping=True, random_state=seed)
    )
    pipe = make_pipeline(StandardScaler(), clf)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # small data: a few more iterations change little
        pipe.fit(Xc, y, **{f"{pipe.steps[-1][0]}__sample_weight": weight} if weight is not None else {})
    return DenseModel.from_sklearn(pipe, cols)


HEAD_HIDDEN = 64  # units of the head's one hidden layer (0: logistic on the same inputs)
HEAD_WEIGHT_DECAY = 1e-3  # L2 on the head's weights: ~900 hidden dims and tens of thousands of rows overfit easily


def fit_head(
    X: np.ndarray,
    H: np.ndarray,
    y: np.ndarray,
    columns: Sequence[int],
    groups: np.ndarray,
    seed: int = 0,
    hidden_units: int = HEAD_HIDDEN,
    max_steps: int = 400,
) -> DenseModel:
    """An acceptance head (SpecDec++'s idea, small): standardised [FEATURES[columns], draft hidden state]
    -> one ReLU layer -> sigmoid, fitted in torch (full-batch Adam, L2), early-stopped on the log-loss
    of 15 % of the training prompts (`groups`: each row's prompt id). Returns a DenseModel of kind "head"."""
    import torch

    Z = np.concatenate([X[:, list(columns)], H], 1).astype(np.float64)
    mean, scale = Z.mean(0), Z.std(0)
    scale[scale < 1e-8] = 1.0
    rng = np.random.default_rng(seed)
    prompts = np.unique(groups)
    held = np.isin(groups, rng.permutation(prompts)[: max(1, int(0.15 * len(prompts)))])
    if len(np.unique(y[~held])) < 2 or not held.any():
        held = np.zeros(len(y), bool)
    torch.manual_seed(seed)
    t = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    Zt, yt = t((Z - mean) / scale), t(y)
    sizes = [Z.shape[1], *([hidden_units] if hidden_units else []), 1]
    layers = [torch.nn.Linear(a, b) for a, b in zip(sizes, sizes[1:])]
    net = torch.nn.Sequential(*[m for lin in layers for m in (lin, torch.nn.ReLU())][:-1])
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3, weight_decay=HEAD_WEIGHT_DECAY)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    fit_rows, val_rows = torch.tensor(~held), torch.tensor(held)
    best, best_state = float("inf"), None
    for step in range(max_steps):
        net.train()
        opt.zero_grad()
        loss = loss_fn(net(Zt[fit_rows])[:, 0], yt[fit_rows])
        loss.backward()
        opt.step()
        if step % 10 == 9 or step == max_steps - 1:
            with torch.no_grad():
                rows = val_rows if held.any() else fit_rows
                v = float(loss_fn(net(Zt[rows])[:, 0], yt[rows]))
            if v < best:
                best, best_state = v, [(lin.weight.detach().clone(), lin.bias.detach().clone()) for lin in layers]
    weights = [(W.T.double().numpy(), b.double().numpy()) for W, b in best_state]
    return DenseModel("head", mean, scale, weights, "relu" if hidden_units else "identity", columns, H.shape[1])


def platt(p: np.ndarray, y: np.ndarray) -> Calibration:
    """Platt scaling fitted on (validation) rows: the cumulative and cost rules multiply probabilities."""
    from sklearn.linear_model import LogisticRegression

    if len(np.unique(y)) < 2:
        return Calibration()
    p = np.clip(p, 1e-7, 1 - 1e-7)
    lr = LogisticRegression(C=1e6).fit(np.log(p / (1 - p))[:, None], y)
    return Calibration(float(lr.coef_[0, 0]), float(lr.intercept_[0]))


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


@dataclass
class Learned:
    """One trained model under one rule, its parameter tuned on validation."""

    model_name: str  # "lightgbm", "logistic", "mlp" or "head"
    rule: str  # classifier.RULES
    model: Model  # calibrated (artifact.Calibrated): what the simulator and the artifact use
    tuned: Tuned

    @property
    def label(self) -> str:
        return f"{self.model_name}, {self.rule} rule"

    def factory(self, cost: CostModel, setting: float | None = None):
        return replay_policy(
            "classifier",
            classifier_threshold=self.tuned.best if setting is None else setting,
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
                    "classifier", classifier_threshold=v, model=model, classifier_rule=rule, cost=cost
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
        "threshold": tune(
            traces, lambda t: replay_policy("threshold", threshold=t), THRESHOLD_GRID, cost, max_window, progress
        ),
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
        t = tune(
            traces,
            lambda th: replay_policy("classifier", classifier_threshold=th, model=model),
            THRESHOLD_GRID,
            cost,
            cfg.max_window,
        )
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


# --- per task ----------------------------------------------------------------------------------


def row_tasks(rows: pd.DataFrame) -> np.ndarray:
    """The task of each row (traces without a task column count as one task, "")."""
    return rows["task"].fillna("").to_numpy(str) if "task" in rows else np.full(len(rows), "")


def task_masks(rows: pd.DataFrame) -> dict[str, np.ndarray]:
    """Row mask of each task."""
    tasks = row_tasks(rows)
    return {t: tasks == t for t in sorted(set(tasks.tolist()))}


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
            t = tune(
                tune_on,
                lambda th: replay_policy("classifier", classifier_threshold=th, model=model),
                THRESHOLD_GRID,
                cost,
                cfg.max_window,
            ).best
            tau = tune(
                tune_on, lambda th: replay_policy("threshold", threshold=th), THRESHOLD_GRID, cost, cfg.max_window
            ).best
        for b, traces in val_traces.items():
            if not traces:
                continue
            sims = simulate_many(
                traces,
                {
                    "classifier": replay_policy("classifier", classifier_threshold=t, model=model),
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


def adding_table(cross: Sequence[dict]) -> list[str]:
    """Markdown lines: for each "all but FOLDER" arm of cross_task, each task's validation speedup without
    the folder and with it (the "all tasks" arm), for the classifier and the tuned threshold."""
    full = {r["test_task"]: r for r in cross if r["train_task"] == ALL_TASKS}
    lines: list[str] = []
    for arm in dict.fromkeys(r["train_task"] for r in cross if r["train_task"].startswith(ALL_BUT)):
        lines += [
            "",
            f"What adding {arm[len(ALL_BUT) :]} changes (each task's validation prompts; without it: fitted and "
            "tuned on the other folders):",
            "",
            "| task | classifier without | with | change | tuned threshold without | with | classifier / threshold with |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in cross:
            w = full.get(r["test_task"])
            if r["train_task"] == arm and w is not None:
                lines.append(
                    f"| {r['test_task']} | {r['classifier']:.3f} | {w['classifier']:.3f} | "
                    f"{w['classifier'] / r['classifier'] - 1:+.1%} | {r['tuned_threshold']:.3f} | "
                    f"{w['tuned_threshold']:.3f} | {w['ratio']:.3f} |"
                )
    return lines


# --- the whole command -------------------------------------------------------------------------


@dataclass
class TrainReport:
    out: Path
    threshold: float
    metrics: dict  # validation metrics of the saved model (calibrated)
    table: list[dict]  # policy speedup table (validation prompts, simulated)
    importance: dict[str, float]
    cost: CostModel
    ablation: list[dict] = field(default_factory=list)
    split: dict = field(default_factory=dict)
    per_task: list[dict] = field(default_factory=list)
    cross_task: list[dict] = field(default_factory=list)
    choice: dict = field(default_factory=dict)  # what `--policy classifier` runs (train.choose)
    model_metrics: dict = field(default_factory=dict)  # validation metrics of every fitted model
    decoding: str = "greedy decoding"  # what the traces decoded with, and the labels fitted

    def markdown(self) -> str:
        m = self.metrics
        f = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
        c = self.choice
        chosen = (
            f"the classifier ({c['model']}, {c['rule']} rule, parameter {c['setting']:g})"
            if c.get("policy") == "classifier"
            else f"the tuned threshold (tau = {c.get('setting', 0):g}): no learned policy beat it on validation"
        )
        lines = [
            f"# disco classifier: {self.out}",
            "",
            f"**`--policy classifier` runs {chosen}**: simulated validation speedup {c.get('speedup', 0):.3f} vs "
            f"{c.get('tuned_threshold_speedup', 0):.3f} for the tuned threshold ({c.get('margin_vs_threshold', 1):.3f}x; "
            f"best learned policy {c.get('best_learned_speedup', 0):.3f}).",
            "",
            f"Trained and tuned for {self.decoding}.",
            "",
            f"Split by prompt: {self.split.get('train_prompts')} train / {self.split.get('val_prompts')} validation "
            f"prompts ({self.split.get('train_rows')} / {m['rows']} drafted rows); validation accept rate "
            f"{m['accept_rate']:.3f}.",
            "",
            "| model | ROC-AUC | PR-AUC (accept) | PR-AUC (reject) | log-loss (calibrated) | accuracy@0.5 |",
            "|---|---|---|---|---|---|",
        ]
        for name, mm in (self.model_metrics or {"model": m}).items():
            lines.append(
                f"| {name} | {f(mm['roc_auc'])} | {f(mm['pr_auc'])} | {f(mm['pr_auc_reject'])} | "
                f"{f(mm['log_loss'])} | {f(mm['accuracy'])} |"
            )
        lines += [
            "",
            f"Simulated speedup over target-only decoding on the validation prompts; cost model: {self.cost.source} "
            f"(c_d/c_t(1) = {self.cost.c_d / self.cost.c_t[0]:.3f}, c_t({len(self.cost.c_t)})/c_t(1) = "
            f"{self.cost.c_t[-1] / self.cost.c_t[0]:.3f}). Tuned settings are tuned on these same prompts.",
            "",
            "| policy | setting | speedup | target fwd/token | draft fwd/token | accepted/window | approx. drafts |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in self.table:
            lines.append(
                f"| {r['policy']} | {r['setting']} | {r['speedup']:.3f} | {r['target_forwards_per_token']:.3f}"
                f" | {r['draft_forwards_per_token']:.3f} | {r['mean_accepted']:.2f} | "
                f"{100 * r['approx_drafts']:.1f}% |"
            )
        if self.per_task:
            lines += [
                "",
                "Per task (validation prompts; every policy at the setting tuned on all of them; classifier: "
                "the best learned policy):",
                "",
                "| task | prompts | oracle | classifier | tuned threshold | tau = 0.4 | tuned constant | heuristic "
                "| classifier / tuned threshold |",
                "|---|---|---|---|---|---|---|---|---|",
            ]
            lines += [
                f"| {r['task']} | {r['prompts']} | {r['oracle']:.3f} | {r['classifier']:.3f} | {r['threshold']:.3f}"
                f" | {r['tau']:.3f} | {r['constant']:.3f} | {r['heuristic']:.3f} | "
                f"{r['classifier'] / r['threshold']:.3f} |"
                for r in self.per_task
            ]
        if self.cross_task:
            lines += [
                "",
                "Train on one task, test on another (fit on the training task's train prompts, threshold "
                "and tau tuned on its validation prompts, tested on the test task's validation prompts):",
                "",
                "| trained on | tested on | classifier t | classifier | tau | tuned threshold | ratio |",
                "|---|---|---|---|---|---|---|",
            ]
            lines += [
                f"| {r['train_task']} | {r['test_task']} | {r['threshold']:g} | {r['classifier']:.3f} | "
                f"{r['tau']:g} | {r['tuned_threshold']:.3f} | {r['ratio']:.3f} |"
                for r in self.cross_task
            ]
            lines += adding_table(self.cross_task)
        if self.importance:
            lines += [
                "",
                "Permutation importance (drop in validation ROC-AUC when shuffled):",
                "",
                "| feature | importance |",
                "|---|---|",
            ]
            lines += [f"| {k} | {v:.4f} |" for k, v in self.importance.items()]
        if self.ablation:
            lines += [
                "",
                "Ablation (each variant retrained, token-rule threshold tuned by simulated speedup):",
                "",
                "| variant | inputs | ROC-AUC | threshold | speedup | vs all |",
                "|---|---|---|---|---|---|",
            ]
            lines += [
                f"| {r['variant']} | {r['features']} | {f(r['roc_auc'])} | {r['threshold']:g} | "
                f"{r['speedup']:.3f} | {r['delta_vs_all']:+.3f} |"
                for r in self.ablation
            ]
        return "\n".join(lines) + "\n"


def train(cfg: TrainConfig) -> TrainReport:
    if cfg.model not in MODEL_KINDS:
        raise DiscoError(f"unknown model {cfg.model!r}: choose one of {', '.join(MODEL_KINDS)}")
    check_setting("max_window", cfg.max_window, WINDOW)
    if cfg.labels not in LABELS:
        raise DiscoError(f"unknown --labels {cfg.labels!r}: choose one of {', '.join(LABELS)}")
    cost = CostModel.load(cfg.profile) if cfg.profile is not None else CostModel.default(cfg.max_window)
    cost.verify(cfg.max_window + 1)  # fail now, not after training, if the profile is too short
    check_out_dir(cfg.out, "--out", True, "artifact")  # a file or a trace folder is refused before any work
    data = load_trace_data(cfg.traces)
    if not cfg.target_signals:  # a policy for an engine that cannot show it the target's probabilities
        data.features = [i for i in data.features if FEATURES[i] not in TARGET_SIGNALS]
    rows = data.rows
    train_mask, val_mask = split_by_prompt(rows["prompt_id"].to_numpy(), cfg.val_fraction, cfg.seed, row_tasks(rows))
    check_split(rows, train_mask, val_mask)
    drafted = rows["oracle_drafted"].to_numpy(bool)
    X = rows[list(FEATURES)].to_numpy(np.float64)
    y = rows["label"].to_numpy(int)
    tr, va = train_mask & drafted, val_mask & drafted
    if len(np.unique(y[tr])) < 2:
        raise DiscoError("the training prompts' drafted tokens are all of one class: add prompts or change --seed")
    labels = ("soft" if data.sampled else "sampled") if cfg.labels == "auto" else cfg.labels
    if labels == "soft" and not data.sampled:
        raise DiscoError(
            "--labels soft needs sampled traces (disco collect --temperature > 0): under greedy decoding "
            "acceptance is the label itself"
        )
    # Sampled traces: min(1, p/q) is the label's expectation given the drafted token, the same target with
    # none of the accept/reject draw's noise. Metrics, calibration and tuning still use the sampled labels.
    soft = rows["accept_prob"].to_numpy(np.float64) if labels == "soft" else None
    soft_tr = None if soft is None else soft[tr]

    # The models: cfg.model on FEATURES, and the head on FEATURES + hidden state when the traces hold it.
    raw: dict[str, Model] = {
        cfg.model: fit_model(cfg.model, X[tr], y[tr], data.features, cfg.seed, cfg.balanced, soft_tr)
    }
    inputs: dict[str, np.ndarray] = {cfg.model: X}
    if cfg.head and data.hidden is not None:
        H = data.hidden_matrix(np.ones(len(rows), bool))
        raw["head"] = fit_head(
            X[tr], H[tr], y[tr] if soft is None else soft_tr, data.features, rows["prompt_id"].to_numpy()[tr], cfg.seed
        )
        inputs["head"] = np.concatenate([X, H], 1)
        del H
    models = {name: Calibrated(m, platt(m.predict_proba(inputs[name][va]), y[va])) for name, m in raw.items()}
    model_metrics = {
        name: classification_metrics(y[va], m.predict_proba(inputs[name][va])) for name, m in models.items()
    }

    val_traces = traces_for(data, val_mask)
    table, tuned, learned = policy_table(val_traces, models, cost, cfg.max_window, cfg.progress)
    best, choice = choose(learned, tuned["threshold"])
    main = models[cfg.model]
    token = next(e for e in learned if e.model_name == cfg.model and e.rule == "token")
    importance = permutation_importance(main, X[va], y[va], cfg.seed)
    head_eval = (models["head"], inputs["head"][va]) if "head" in models else None
    abl = (
        ablation(cfg.model, X[tr], y[tr], X[va], y[va], val_traces, cost, cfg, main, data.features, head_eval, soft_tr)
        if cfg.ablate
        else []
    )
    tasks = per_task_table(data, val_mask, best, tuned, cost, cfg.max_window)
    cross = (
        cross_task(
            data,
            train_mask,
            val_mask,
            X,
            y,
            cost,
            cfg,
            (main, token.tuned.best, tuned["threshold"].best),
            data.features,
            soft,
        )
        if cfg.cross_task
        else []
    )

    split = {
        "train_prompts": int(rows.loc[train_mask, "prompt_id"].nunique()),
        "val_prompts": int(rows.loc[val_mask, "prompt_id"].nunique()),
        "train_rows": int(tr.sum()),
        "val_prompt_ids": sorted(rows.loc[val_mask, "prompt_id"].unique().tolist()),
    }
    threshold = float(best.tuned.best)
    metrics = model_metrics[best.model_name]
    decoding = "greedy decoding"
    if data.sampled:  # the check: the same policies replayed with the traces' sampled outcomes instead
        replays = {
            "chosen": best.factory(cost),
            "threshold": replay_policy("threshold", threshold=tuned["threshold"].best),
        }
        check = simulate_many(traces_for(data, val_mask, expected=False), replays, cfg.max_window)
        decoding = (
            f"sampling at temperature {data.sampling['temperature']:g}, top-p {data.sampling['top_p']:g} "
            f"({labels} labels; simulated with expected acceptance; with the traces' sampled outcomes instead: "
            f"best learned policy {check['chosen'].speedup(cost):.3f}, tuned threshold "
            f"{check['threshold'].speedup(cost):.3f})"
        )
    report = TrainReport(
        cfg.out, threshold, metrics, table, importance, cost, abl, split, tasks, cross, choice, model_metrics, decoding
    )
    calibration = models[best.model_name].calibration
    record = {
        "threshold": threshold,  # the parameter of `rule` (a P(accept) threshold for the token rule)
        "rule": best.rule,
        "choice": choice,
        "calibration": {"a": calibration.a, "b": calibration.b},
        **({"hidden": data.hidden} if best.model_name == "head" else {}),
        "pair": data.pair,
        "tokenizer_hash": data.pair.get("tokenizer_hash"),
        "max_window": cfg.max_window,
        "sampling": data.sampling,  # the decoding it was trained and tuned for (generate warns at another)
        "training": {
            "rows": "oracle_drafted",
            "labels": labels,
            "balanced": cfg.balanced,
            "seed": cfg.seed,
            "val_fraction": cfg.val_fraction,
            "target_signals": cfg.target_signals,
            "models": list(models),
            **split,
            "traces": data.manifests,
        },
        "validation_metrics": metrics,
        "model_metrics": model_metrics,
        "cost_model": cost.to_dict(),
        "tuned": {  # what `disco compare` runs as fair baselines
            "classifier_threshold": threshold,
            "threshold": float(tuned["threshold"].best),
            "k": int(tuned["constant"].best),
            "adaedl_lambda": float(tuned["adaedl"].best),
            "svip_h": float(tuned["svip"].best),
            "rules": {e.rule: float(e.tuned.best) for e in learned if e.model_name == best.model_name},
        },
        "speedups": table,
        "importance": importance,
        "ablation": abl,
        "per_task": tasks,
        "cross_task": cross,
    }
    # The folder is replaced whole (no stale model file of another kind stays), or, when it cannot be
    # written, the finished artifact goes to a temporary folder that the error names.
    write_dir(cfg.out, lambda tmp: save_artifact(tmp, raw[best.model_name], record, report.markdown()), "artifact")
    return report


def check_split(rows: pd.DataFrame, train_mask: np.ndarray, val_mask: np.ndarray) -> None:
    """Both sides of the split need drafted rows of some prompt: say how many prompts that takes."""
    drafted = rows["oracle_drafted"].to_numpy(bool)
    if (train_mask & drafted).any() and (val_mask & drafted).any():
        return
    tasks = row_tasks(rows)
    per_task = {t: len(set(rows.loc[tasks == t, "prompt_id"])) for t in sorted(set(tasks.tolist()))}
    shown = ", ".join(f"{n} of task {t or '(none)'}" for t, n in per_task.items())
    raise DiscoError(
        f"the traces hold too few prompts to split by prompt ({shown}): training needs at least 2 "
        "prompts of one task with drafted tokens (one to fit, one to validate), and more for useful "
        "metrics: collect more prompts"
    )
