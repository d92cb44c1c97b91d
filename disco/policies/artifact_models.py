"""The models a classifier artifact holds, and their calibration: what predicts P(accept) from the features.

DenseModel (logistic regression, a small MLP, an acceptance head on the draft's hidden state: plain arrays, run
in numpy or as torch ops on the device), LightGBMModel (a booster: on the host, or its trees as tensor ops on an
accelerator), JoblibModel (any estimator with predict_proba, pickled); Calibration (Platt scaling) and Calibrated
(a model behind one). Each reads the FEATURES vector by name through `columns`. How they are written, hashed and
loaded is disco.policies.artifact's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from disco.base.errors import DiscoError
from disco.core.features import FEATURES
from disco.policies.tree_tensors import TreeTensors

_ACTIVATIONS = ("identity", "relu", "tanh", "logistic")


def _as_2d(X: np.ndarray, hidden_dim: int = 0) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    X = X.reshape(1, -1) if X.ndim == 1 else X
    if X.ndim != 2 or X.shape[1] != len(FEATURES) + hidden_dim:
        raise DiscoError(
            f"expected rows of {len(FEATURES)} features (FEATURES order)"
            + (f" + {hidden_dim} hidden dims" if hidden_dim else "")
            + f", got shape {X.shape}"
        )
    return X


# --- models ------------------------------------------------------------------------------------


class DenseModel:
    """Standardise, then dense layers with a hidden activation and a sigmoid output.

    Logistic regression is the case with one layer; sklearn's MLPClassifier the general one.
    Plain arrays: they serialise to JSON and run in numpy (simulator, host) or torch (device)."""

    def __init__(
        self,
        kind: str,
        mean: np.ndarray,
        scale: np.ndarray,
        layers: list[tuple[np.ndarray, np.ndarray]],
        activation: str = "identity",
        columns: Sequence[int] | None = None,
        hidden_dim: int = 0,
    ) -> None:
        if activation not in _ACTIVATIONS:
            raise DiscoError(f"unknown activation {activation!r}")
        self.kind, self.activation, self.hidden_dim = kind, activation, hidden_dim
        self.mean, self.scale = np.asarray(mean, np.float64), np.asarray(scale, np.float64)
        self.layers = [(np.asarray(W, np.float64), np.asarray(b, np.float64)) for W, b in layers]
        self.columns = list(columns) if columns is not None else list(range(len(FEATURES)))

    @classmethod
    def from_sklearn(cls, pipeline, columns: Sequence[int] | None = None) -> DenseModel:
        """From Pipeline(StandardScaler, LogisticRegression | MLPClassifier)."""
        scaler, clf = pipeline[0], pipeline[-1]
        if hasattr(clf, "coefs_"):  # MLPClassifier
            layers = list(zip(clf.coefs_, clf.intercepts_))
            return cls("mlp", scaler.mean_, scaler.scale_, layers, clf.activation, columns)
        return cls("logistic", scaler.mean_, scaler.scale_, [(clf.coef_.T, clf.intercept_)], "identity", columns)

    def _hidden(self, z):  # numpy arrays and torch tensors alike
        if self.activation == "relu":
            return z * (z > 0)
        if self.activation == "tanh":
            return z.tanh() if isinstance(z, torch.Tensor) else np.tanh(z)
        if self.activation == "logistic":
            return z.sigmoid() if isinstance(z, torch.Tensor) else 1.0 / (1.0 + np.exp(-z))
        return z

    def _inputs(self, X: np.ndarray) -> np.ndarray:
        """The features it reads, then the hidden state (a head): X holds FEATURES [+ hidden]."""
        X = _as_2d(X, self.hidden_dim)
        return np.concatenate([X[:, self.columns], X[:, len(FEATURES) :]], 1) if self.hidden_dim else X[:, self.columns]

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        z = (self._inputs(X) - self.mean) / self.scale
        for i, (W, b) in enumerate(self.layers):
            z = z @ W + b
            if i < len(self.layers) - 1:
                z = self._hidden(z)
        return 1.0 / (1.0 + np.exp(-z[:, 0]))

    def torch_predictor(
        self, device: torch.device, calibration: Calibration | None = None
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """(F,) or (B, F) float tensor on `device` -> 0-dim or (B,) P(accept) (through `calibration`), computed on
        the device in float32 (one row for disco's loop, a batch for vLLM's proposer)."""
        calibrate = calibration or Calibration()
        t = lambda a: torch.as_tensor(a, dtype=torch.float32, device=device)  # noqa: E731
        cols, mean, scale = torch.as_tensor(self.columns, device=device), t(self.mean), t(self.scale)
        layers = [(t(W), t(b)) for W, b in self.layers]

        n_feat = len(FEATURES)

        def predict(x: torch.Tensor) -> torch.Tensor:
            x = x.float()
            z = torch.cat([x[..., cols], x[..., n_feat:]], -1) if self.hidden_dim else x[..., cols]
            z = (z - mean) / scale
            for i, (W, b) in enumerate(layers):
                z = z @ W + b
                if i < len(layers) - 1:
                    z = self._hidden(z)
            return calibrate(torch.sigmoid(z[..., 0]))

        return predict

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "activation": self.activation,
            "columns": self.columns,
            "mean": self.mean.tolist(),
            "scale": self.scale.tolist(),
            "layers": [{"W": W.tolist(), "b": b.tolist()} for W, b in self.layers],
        }

    @classmethod
    def from_json(cls, data: dict, columns: Sequence[int] | None = None) -> DenseModel:
        layers = [(np.array(layer["W"]), np.array(layer["b"])) for layer in data["layers"]]
        return cls(
            data["kind"],
            np.array(data["mean"]),
            np.array(data["scale"]),
            layers,
            data["activation"],
            data["columns"] if columns is None else columns,
        )

    def to_tensors(self) -> dict[str, torch.Tensor]:
        """The weights as named tensors (safetensors: no code runs when they are loaded)."""
        t = lambda a: torch.tensor(np.ascontiguousarray(a))  # noqa: E731
        out = {"mean": t(self.mean), "scale": t(self.scale)}
        for i, (W, b) in enumerate(self.layers):
            out[f"W{i}"], out[f"b{i}"] = t(W), t(b)
        return out

    @classmethod
    def from_tensors(
        cls, tensors: dict[str, torch.Tensor], activation: str, columns: Sequence[int], hidden_dim: int
    ) -> DenseModel:
        n = sum(1 for k in tensors if k.startswith("W"))
        layers = [(tensors[f"W{i}"].numpy(), tensors[f"b{i}"].numpy()) for i in range(n)]
        return cls("head", tensors["mean"].numpy(), tensors["scale"].numpy(), layers, activation, columns, hidden_dim)


class LightGBMModel:
    """A LightGBM booster over FEATURES[columns]: predict on the host, or its trees as tensor ops on a device."""

    kind = "lightgbm"
    hidden_dim = 0

    def __init__(self, booster, columns: Sequence[int] | None = None) -> None:
        self.booster = booster
        self.columns = list(columns) if columns is not None else list(range(len(FEATURES)))

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        # One thread: per-call thread start-up dominates the small batches of the simulator and
        # the single rows of the live policy (80 us vs 300 us a row here).
        return self.booster.predict(_as_2d(X)[:, self.columns], num_threads=1)

    def torch_predictor(
        self, device: torch.device, calibration: Calibration | None = None
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """(F,) or (B, F) features on `device` -> 0-dim or (B,) P(accept) (through `calibration`). On an
        accelerator the trees run as tensor ops there (tree_tensors.py: no copy to the host, no sync per
        decision); on a CPU the booster's own predict, one call for a batch, and the calibration in numpy are
        the cheaper (bench/results/decision-cost.md, "The decision's cost on vLLM's draft, third session").
        LightGBM also runs what the tensor form cannot hold (categorical splits, linear trees)."""
        trees = None
        if torch.device(device).type != "cpu":
            trees = TreeTensors.from_booster(self.booster, self.columns, device)
        if trees is None:
            return _on_host(self, calibration)
        calibrate = calibration or Calibration()
        return lambda x: calibrate(trees(x))

    def to_text(self) -> str:
        return self.booster.model_to_string()

    @classmethod
    def from_text(cls, text: str, columns: Sequence[int] | None = None) -> LightGBMModel:
        import lightgbm

        return cls(lightgbm.Booster(model_str=text), columns)


class JoblibModel:
    """Any estimator with predict_proba, pickled: only ever loaded with an explicit trust_pickle."""

    kind = "joblib"
    hidden_dim = 0

    def __init__(self, estimator, columns: Sequence[int] | None = None) -> None:
        self.estimator = estimator
        self.columns = list(columns) if columns is not None else list(range(len(FEATURES)))

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        return self.estimator.predict_proba(_as_2d(X)[:, self.columns])[:, 1]

    def torch_predictor(
        self, device: torch.device, calibration: Calibration | None = None
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        return _on_host(self, calibration)


def _on_host(
    model: LightGBMModel | JoblibModel, calibration: Calibration | None
) -> Callable[[torch.Tensor], torch.Tensor]:
    """A host model's P(accept) of (F,) or (B, F) features on any device: 0-dim or (B,), on x's device (one
    trip to the host and back; the calibration runs there, in the simulator's arithmetic)."""
    calibrate = calibration or Calibration()

    def predict(x: torch.Tensor) -> torch.Tensor:
        p = calibrate(model.predict_proba(x.detach().double().cpu().reshape(-1, x.shape[-1]).numpy()))
        return torch.as_tensor(p, device=x.device).reshape(x.shape[:-1])

    return predict


Model = DenseModel | LightGBMModel | JoblibModel


@dataclass(frozen=True)
class Calibration:
    """Platt scaling of a model's P(accept): sigmoid(a * logit(p) + b). Identity: a = 1, b = 0."""

    a: float = 1.0
    b: float = 0.0

    def __call__(self, p):
        if self.a == 1.0 and self.b == 0.0:
            return p
        if isinstance(p, torch.Tensor):
            p = p.clamp(1e-7, 1 - 1e-7)
            return torch.sigmoid(self.a * torch.log(p / (1 - p)) + self.b)
        p = np.clip(p, 1e-7, 1 - 1e-7)
        return 1.0 / (1.0 + np.exp(-(self.a * np.log(p / (1 - p)) + self.b)))


class Calibrated:
    """A model whose P(accept) goes through a Calibration (the rules that multiply probabilities need it)."""

    def __init__(self, model: Model, calibration: Calibration) -> None:
        self.model, self.calibration = model, calibration
        self.kind, self.columns, self.hidden_dim = model.kind, model.columns, model.hidden_dim

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        return self.calibration(self.model.predict_proba(X))

    def torch_predictor(self, device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
        return self.model.torch_predictor(device, self.calibration)
