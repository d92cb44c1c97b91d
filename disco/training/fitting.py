"""`disco train`'s fitting: the models of P(accept) (LightGBM, logistic regression, a small MLP:
`fit_model`; the acceptance head on the draft's hidden state: `fit_head`), their Platt calibration
and their classification metrics.

Class imbalance: most drafted tokens are accepted. Rather than reweighting by default,
which would shift the probabilities away from calibrated acceptance rates (log-loss and a
future product-of-probabilities rule need them calibrated), the imbalance is handled where
it matters: the operating point is the threshold that maximises simulated speedup, not
0.5, and the metrics include PR-AUC of the minority (rejected) class. `balanced=True`
(--balanced) reweights the classes instead.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from disco.base.defaults import (
    MODEL_KINDS,
)
from disco.base.errors import DiscoError
from disco.core.features import FEATURES
from disco.policies.artifact_models import Calibration, DenseModel, LightGBMModel, Model


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


# --- calibration as the field reports it (issue 45): per position, before and after, disco's and vLLM's -------

ECE_BINS = 10  # expected calibration error over 10 equal-width bins of the predicted probability on [0, 1]


def reliability(y: np.ndarray, p: np.ndarray, bins: int = ECE_BINS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per equal-width bin of p ([i / bins, (i + 1) / bins), the last one closed): the mean predicted
    probability, the observed accept rate (NaN in an empty bin) and the row count."""
    p = np.asarray(p, np.float64)
    y = np.asarray(y, np.float64)
    idx = np.clip((p * bins).astype(int), 0, bins - 1)
    count = np.bincount(idx, minlength=bins).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        conf = np.bincount(idx, weights=p, minlength=bins) / count
        rate = np.bincount(idx, weights=y, minlength=bins) / count
    return conf, rate, count


def calibration_figures(y: np.ndarray, p: np.ndarray, bins: int = ECE_BINS) -> dict:
    """AUROC (None without both classes), Brier score (mean (p - y)^2) and ECE (sum over equal-width bins of
    the bin's share of rows x |accept rate - mean p|) of predictions p of labels y."""
    from sklearn.metrics import roc_auc_score

    y = np.asarray(y, np.float64)
    p = np.asarray(p, np.float64)
    if len(y) == 0:
        return {"rows": 0, "accept_rate": None, "auroc": None, "brier": None, "ece": None}
    conf, rate, count = reliability(y, p, bins)
    full = count > 0
    return {
        "rows": int(len(y)),
        "accept_rate": float(y.mean()),
        "auroc": float(roc_auc_score(y, p)) if len(np.unique(y)) == 2 else None,
        "brier": float(np.mean((p - y) ** 2)),
        "ece": float(np.sum(count[full] / len(y) * np.abs(rate[full] - conf[full]))),
    }


def online_logistic(X: np.ndarray, y: np.ndarray, max_window: int):
    """vLLM 0.32's online acceptance estimator (acceptance_estimator.OnlineAcceptanceEstimator) fitted on these
    rows (drafted rows of training prompts: FEATURES; its feature is logit(p_top1), its position window_pos - 1)
    by its own refit repeated to its fixed point: the estimator at its best, once serving has seen this traffic
    long enough. Rows at positions past max_window (where vLLM never drafts) are left out."""
    import torch

    from disco.policies.acceptance_estimator import OnlineAcceptanceEstimator, log_odds

    est = OnlineAcceptanceEstimator(max_window, 1)
    pos = torch.tensor(X[:, FEATURES.index("window_pos")], dtype=torch.long) - 1
    est.fit(log_odds(torch.tensor(X[:, FEATURES.index("p_top1")])), pos, torch.tensor(y, dtype=torch.float32))
    return est


def online_proba(est, X: np.ndarray) -> np.ndarray:
    """The fitted online estimator's P(accept) of each row (positions past its last: its last position's)."""
    import torch

    from disco.policies.acceptance_estimator import log_odds

    pos = torch.tensor(X[:, FEATURES.index("window_pos")], dtype=torch.long).clamp(1, est.num_speculative_steps) - 1
    f = log_odds(torch.tensor(X[:, FEATURES.index("p_top1")]))
    return est.confidence(f, pos).double().numpy()


def calibration_report(
    raw: dict[str, np.ndarray], y: np.ndarray, positions: np.ndarray, groups: np.ndarray, max_window: int, seed: int = 0
) -> dict:
    """Per-position calibration of each model's uncalibrated P(accept) `raw[name]` on held-out rows (labels y,
    1-based window positions, prompt ids `groups`), before and after Platt scaling. "After" is cross-fitted by
    prompt: the rows are split into two halves of their prompts, and each half is scaled by the Platt fit of the
    other, so no figure is on rows its calibration saw (with one prompt: fitted on all of them, said in
    `cross_fitted`). Rows at positions past max_window are left out. Returns {"bins", "cross_fitted",
    "positions": [1 .. K, "all"], "models": {name: {"before"|"after": {position: figures}}},
    "reliability": {name: {"before"|"after": (mean p, accept rate, count) per bin, all positions}}}."""
    keep = positions <= max_window
    y, positions, groups = y[keep], positions[keep].astype(int), groups[keep]
    prompts = np.unique(groups)
    rng = np.random.default_rng(seed)
    half = np.isin(groups, rng.permutation(prompts)[: len(prompts) // 2])
    cross = len(prompts) >= 2
    keys: list = [*range(1, max_window + 1), "all"]
    out: dict = {"bins": ECE_BINS, "cross_fitted": cross, "positions": keys, "models": {}, "reliability": {}}
    for name, p_raw in raw.items():
        p = np.asarray(p_raw, np.float64)[keep]
        after = np.empty_like(p)
        if cross:
            for fold in (half, ~half):
                after[fold] = platt(p[~fold], y[~fold])(p[fold])
        else:
            after = platt(p, y)(p)
        figures = {}
        for tag, q in (("before", p), ("after", after)):
            figures[tag] = {
                key: calibration_figures(
                    y if key == "all" else y[positions == key], q if key == "all" else q[positions == key]
                )
                for key in keys
            }
            out["reliability"].setdefault(name, {})[tag] = tuple(a.tolist() for a in reliability(y, q))
        out["models"][name] = figures
    return out
