"""DISCO's stopping policy: a trained model's P(accept) of each draft token, and a rule on it.

The same object serves the live loop and the simulator: both run rounds.draft_window, which calls
`decide` with a step (live: a DraftStep; simulated: a TraceStep with the trace's token features), so
both take the decision by one rule on one feature vector:

    features = WindowState.step(token_features(step), window_pos)   (features.py, FEATURES order)
               [+ the draft's hidden state, for a model that reads it]
    p        = P(accept | features)                                  (calibrated when the artifact says so)
    stop     = RULES[rule].stops(position, p, prod(p_i) so far, setting, cost)   (rules.py)

The rules (token, cumulative, cost, cost-adaptive) and their setting are rules.py's, shared with the batched
form (batch_policy.BatchClassifier). This policy keeps one window's state (position, prod(p_i)) and the
cost-adaptive rule's running forecast.

The one difference between live and simulated decisions: live, a logistic/MLP model runs in float32
on the draft's device, while the simulator batches in float64 on the host, so a decision can differ
only when p lies within ~1e-6 of a rule's boundary. LightGBM runs on the host in both.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from disco.base.defaults import DEFAULT_RULE, RULES  # noqa: F401 -- RULES: the rules' names, read from here (tuning)
from disco.base.errors import DiscoError
from disco.core.features import FEATURES, TARGET_SIGNALS, WindowState
from disco.policies.policy import Decision, PolicyBase, Signals, decide_now
from disco.policies.rules import forecast_after, forecast_relaxed, rule_named


class Predictor(Protocol):
    """A trained model over the FEATURES vector (artifact.py: Artifact, LightGBMModel, DenseModel)."""

    hidden_dim: int  # > 0: the model also reads the draft's hidden state, appended after FEATURES

    def predict_proba(self, X: np.ndarray) -> np.ndarray: ...  # (n, F [+ H]) -> (n,) P(accept)

    def torch_predictor(self, device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]: ...  # (F,) -> 0-dim


class ClassifierPolicy(PolicyBase):
    name = "classifier"

    def __init__(
        self,
        model: Predictor,
        setting: float,
        token_classes: torch.Tensor | None = None,
        rule: str = DEFAULT_RULE,
        cost=None,
        project: torch.Tensor | None = None,
    ) -> None:
        self._rule = rule_named(rule)  # the decision (rules.py)
        self._rule.check(setting, cost)
        self.model = model
        self.setting = setting  # the rule's parameter: token/cumulative a probability, cost rules a rate
        self.rule = rule  # its name
        self.cost = cost  # simulate.CostModel, for the cost rule
        self.token_classes = token_classes  # (vocab,) class index per token, on the draft's device (live only)
        self.project = project  # (hidden, stored) projection of wide hidden states (features.hidden_projection)
        self.needs_hidden = getattr(model, "hidden_dim", 0) > 0
        # the target-side signals cost a softmax over the vocabulary per window: only for a model that reads them
        columns = getattr(model, "columns", None)
        self.reads_signals = columns is None or any(FEATURES.index(f) in columns for f in TARGET_SIGNALS)
        self.window = WindowState()
        self._survive, self._pos = 1.0, 0  # the window so far (cumulative and cost rules)
        self._forecast = 1.0  # cost-adaptive: running per-token acceptance, for the "draft at all" decision
        self._predict: Callable[[torch.Tensor], torch.Tensor] | None = None  # built on the first live step

    @classmethod
    def for_pair(
        cls,
        artifact,
        pair,
        setting: float | None = None,
        trust_pickle: bool = False,
        rule: str | None = None,
        sampling: tuple[float, float] | None = None,
    ):
        """The policy an artifact chose for `pair` (folder or loaded Artifact): this classifier under its
        tuned rule, or the tuned threshold when `disco train` found that faster. `rule` / `setting`:
        run the classifier under another rule (at its tuned setting) / another setting. The artifact
        must have been trained on this pair; the token class table is computed here (once: share it
        between prompts with `fresh()`). sampling: the (temperature, top-p) it will run at (a warning
        when the artifact was tuned for another)."""
        from disco.policies.artifact import Artifact, load_artifact

        if not isinstance(artifact, Artifact):
            artifact = load_artifact(Path(artifact), expect_pair=pair, trust_pickle=trust_pickle)
        if sampling is not None:
            artifact.check_sampling(*sampling)
        rule, setting = chosen_rule(artifact, setting, rule)
        if rule == "threshold":
            from disco.policies.policy import ThresholdPolicy

            return ThresholdPolicy(setting)
        return cls(artifact, setting, pair.token_classes(), rule, artifact.cost_model(), artifact.projection())

    def fresh(self) -> ClassifierPolicy:
        """A new policy (new window state) sharing the model, setting, table and predictor."""
        other = ClassifierPolicy(self.model, self.setting, self.token_classes, self.rule, self.cost, self.project)
        other._predict = self._predict
        return other

    # --- the decision rule, shared with the simulator ------------------------------------------

    def features(self, tok_feats: torch.Tensor, window_pos: int, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """The model's input for the next draft token: FEATURES (advancing the window's running state),
        then the (projected) hidden state when the model reads it."""
        feats = self.window.step(tok_feats, window_pos)
        if not self.needs_hidden:
            return feats
        if hidden is None:
            raise DiscoError("this classifier reads the draft's hidden state, which the draft engine did not give")
        h = hidden.float()
        # live: the engine's raw state, projected here; simulated: the trace stores it already projected
        if self.project is not None and h.shape[-1] == self.project.shape[0]:
            h = h @ self.project.to(h.device)
        return torch.cat([feats, h.to(feats.device)])

    def stops(self, p_accept: float) -> bool:
        self._pos += 1
        self._survive *= p_accept
        return self._rule.stops(self._pos, p_accept, self._survive, self.setting, self.cost)

    # --- StoppingPolicy ------------------------------------------------------------------------

    def drafts(self) -> bool:
        if self._rule.drafts(self._forecast, self.setting, self.cost):
            return True
        if self._rule.forecasts:  # a skipped round: probe the prompt again sooner
            self._forecast = forecast_relaxed(self._forecast)
        return False

    def start(self) -> None:
        self.window.start()
        self._survive, self._pos = 1.0, 0

    def decide(self, step) -> Decision:
        """Ask the model about this token (live: a DraftStep, features computed here; simulated: a
        TraceStep carrying the trace's), then stop by the rule."""
        feats = self.features(step.token_features(self.token_classes), step.window_pos, step.hidden)
        return self.stops((yield feats))

    def should_stop(self, step) -> bool:
        return decide_now(self.decide(step), self)

    def p_accept(self, feats: torch.Tensor) -> float:
        """The live model's P(accept) of one feature vector, on the draft's device."""
        if self._predict is None:
            self._predict = self.model.torch_predictor(feats.device)
        return float(self._predict(feats))  # the one host sync of this draft token

    def update(self, n_drafted: int, n_accepted: int, signals: Signals | None = None) -> None:
        self.window.end(n_drafted, n_accepted, signals() if signals is not None and self.reads_signals else None)
        if n_drafted > 0:
            self._forecast = forecast_after(self._forecast, n_drafted, n_accepted)


def chosen_rule(artifact, setting: float | None = None, rule: str | None = None) -> tuple[str, float]:
    """The (rule, setting) an artifact runs under: its tuned rule and setting, ("threshold", tau) when `disco
    train` found the tuned threshold faster, or the `rule` / `setting` asked for (another rule at its tuned
    setting, another setting)."""
    if artifact.choice["policy"] == "threshold" and setting is None and rule is None:
        return "threshold", float(artifact.choice["setting"])
    rule = rule or artifact.rule
    if setting is None:
        setting = artifact.setting if rule == artifact.rule else artifact.rule_settings.get(rule)
        if setting is None:
            raise DiscoError(
                f"{artifact.path} has no tuned setting for the {rule} rule: give one "
                "(--classifier-setting) or retrain it with this disco"
            )
    return rule, float(setting)
