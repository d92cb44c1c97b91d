"""DISCO's stopping policy: stop drafting when a trained classifier's P(accept) falls below a threshold.

The same object serves the live loop (decode.speculative_generate calls should_stop with a
DraftStep) and the simulator (simulate._replay calls `features` and `stops` with the trace's
token features), so both take the decision by one rule on one feature vector:

    features = WindowState.step(token_features(step), window_pos)   (features.py, FEATURES order)
    stop     = P(accept | features) < threshold

The one difference: live, a logistic/MLP model runs in float32 on the draft's device, while the
simulator batches in float64 on the host, so a decision can differ only when P(accept) lies
within ~1e-6 of the threshold. LightGBM runs on the host in both.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from disco.errors import DiscoError
from disco.features import WindowState, token_features


class Predictor(Protocol):
    """A trained model over the FEATURES vector (artifact.py: Artifact, LightGBMModel, DenseModel)."""

    def predict_proba(self, X: np.ndarray) -> np.ndarray: ...  # (n, F) -> (n,) P(accept)

    def torch_predictor(self, device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]: ...  # (F,) -> 0-dim


class ClassifierPolicy:
    name = "classifier"

    def __init__(self, model: Predictor, threshold: float, token_classes: torch.Tensor | None = None) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise DiscoError(f"the classifier threshold must be within [0, 1] (got {threshold})")
        self.model = model
        self.threshold = threshold
        self.token_classes = token_classes  # (vocab,) class index per token, on the draft's device (live only)
        self.window = WindowState()
        self._predict: Callable[[torch.Tensor], torch.Tensor] | None = None  # built on the first live step

    @classmethod
    def for_pair(cls, artifact, pair, threshold: float | None = None, trust_pickle: bool = False) -> ClassifierPolicy:
        """A policy for `pair` from an artifact (folder or loaded Artifact). The artifact must have
        been trained on this pair; the token class table is computed here (once: share it
        between prompts with `fresh()`)."""
        from disco.artifact import Artifact, load_artifact

        if not isinstance(artifact, Artifact):
            artifact = load_artifact(Path(artifact), expect_pair=pair, trust_pickle=trust_pickle)
        return cls(artifact, artifact.threshold if threshold is None else threshold, pair.token_classes())

    def fresh(self) -> ClassifierPolicy:
        """A new policy (new window state) sharing the model, threshold, table and predictor."""
        other = ClassifierPolicy(self.model, self.threshold, self.token_classes)
        other._predict = self._predict
        return other

    # --- the decision rule, shared with the simulator ------------------------------------------

    def features(self, tok_feats: torch.Tensor, window_pos: int) -> torch.Tensor:
        """The full FEATURES vector of the next draft token; advances the window's running state."""
        return self.window.step(tok_feats, window_pos)

    def stops(self, p_accept: float) -> bool:
        return p_accept < self.threshold

    # --- StoppingPolicy ------------------------------------------------------------------------

    def start(self) -> None:
        self.window.start()

    def should_stop(self, step) -> bool:
        if self.token_classes is None:
            raise DiscoError("the live classifier policy needs the pair's token classes: build it with "
                             "ClassifierPolicy.for_pair(artifact, pair)")
        tok = token_features(step.probs, step.token, step.gen_pos, step.context(), self.token_classes)
        feats = self.features(tok, step.window_pos)
        if self._predict is None:
            self._predict = self.model.torch_predictor(feats.device)
        return self.stops(float(self._predict(feats)))  # the one host sync of this draft token

    def update(self, n_drafted: int, n_accepted: int) -> None:
        self.window.end(n_drafted, n_accepted)
