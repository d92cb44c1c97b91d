"""Stopping policies: after each draft token, keep drafting or hand over to the target?

Every policy implements the same three calls (DESIGN.md §5):

    start()                       a new draft window begins
    should_stop(step) -> bool     called after each draft token (the token is verified either way)
    update(n_drafted, n_accepted) called after the target verified the window

The decoding loop owns the hard limits (max window, tokens left to generate); a policy only
decides to stop early. A policy that needs the draft's probabilities reads them from the
`DraftStep`; that read is the loop's one host sync per draft token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch

from disco.errors import DiscoError

# transformers >= 4.45: assistant_confidence_threshold = 0.4, num_assistant_tokens = 20.
DEFAULT_THRESHOLD = 0.4
DEFAULT_MAX_WINDOW = 20
# Leviathan et al.'s static length and transformers' heuristic schedule start at 5.
DEFAULT_K = 5
# "target" is plain target-only decoding (no draft): the baseline every speedup is measured against.
POLICY_NAMES = ("target", "constant", "heuristic", "threshold", "oracle", "classifier")


@dataclass
class DraftStep:
    """What the draft knows right after proposing one token."""

    logits: torch.Tensor  # (vocab,) raw draft logits the token was chosen from
    probs: torch.Tensor  # (vocab,) the draft distribution actually sampled from (softmax for greedy)
    token: torch.Tensor  # 0-dim int64 on the draft's device: the proposed token
    window_pos: int  # 1-based index of this token inside the current window
    gen_pos: int  # 0-based index of this token in the generated continuation
    committed: torch.Tensor  # (n,) prompt + accepted tokens on the device
    drafted_before: list[torch.Tensor]  # this window's earlier draft tokens (0-dim tensors)

    def context(self) -> torch.Tensor:
        """Every token before this one: prompt, accepted tokens, the window's earlier drafts."""
        return torch.cat([self.committed, *(t.view(1) for t in self.drafted_before)])


class StoppingPolicy(Protocol):
    name: str

    def start(self) -> None: ...

    def should_stop(self, step: DraftStep) -> bool: ...

    def update(self, n_drafted: int, n_accepted: int) -> None: ...


class ConstantPolicy:
    """Leviathan et al.: always draft k tokens. Needs no host sync at all."""

    name = "constant"

    def __init__(self, k: int = DEFAULT_K) -> None:
        if k < 1:
            raise DiscoError(f"--k must be at least 1 (got {k})")
        self.k = k

    def start(self) -> None:
        pass

    def should_stop(self, step: DraftStep) -> bool:
        return step.window_pos >= self.k

    def update(self, n_drafted: int, n_accepted: int) -> None:
        pass


class HeuristicPolicy:
    """transformers' "heuristic" schedule: k += 2 when the whole window was accepted, else k -= 1 (min 1)."""

    name = "heuristic"

    def __init__(self, k: int = DEFAULT_K) -> None:
        if k < 1:
            raise DiscoError(f"--k must be at least 1 (got {k})")
        self.k = k

    def start(self) -> None:
        pass

    def should_stop(self, step: DraftStep) -> bool:
        return step.window_pos >= self.k

    def update(self, n_drafted: int, n_accepted: int) -> None:
        if n_drafted == 0:
            return  # a target-only step (no budget left to draft) says nothing about the draft
        self.k = self.k + 2 if n_accepted == n_drafted else max(1, self.k - 1)


class ThresholdPolicy:
    """transformers' ConfidenceCriteria: stop after a token whose draft probability is below tau.

    adaptive=True reproduces transformers' ROC update (AssistedCandidateGenerator
    .update_candidate_strategy): after each verification, label the drafted tokens
    (accepted: 1, first rejected: 0, later ones dropped) and set tau to the ROC threshold
    minimising fpr + 3 * fnr over all labelled tokens so far (needs >5 labels of both kinds).
    """

    name = "threshold"

    def __init__(self, threshold: float = DEFAULT_THRESHOLD, adaptive: bool = False) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise DiscoError(f"--threshold must be within [0, 1] (got {threshold})")
        self.threshold = threshold
        self.adaptive = adaptive
        self._window_probs: list[float] = []
        self._probs: list[float] = []
        self._matches: list[int] = []

    def start(self) -> None:
        self._window_probs = []

    def should_stop(self, step: DraftStep) -> bool:
        p = float(step.probs[step.token])  # the host sync
        self._window_probs.append(p)
        return p < self.threshold

    def update(self, n_drafted: int, n_accepted: int) -> None:
        if not self.adaptive or n_drafted == 0:
            return
        labelled = min(n_drafted, n_accepted + 1)  # tokens after the first rejection were never judged
        self._probs.extend(self._window_probs[:labelled])
        self._matches.extend([1] * n_accepted + [0] * (labelled - n_accepted))
        if len(self._probs) > 5 and 0 in self._matches and 1 in self._matches:
            self.threshold = _roc_threshold(self._matches, self._probs)


def _roc_threshold(labels: Sequence[int], scores: Sequence[float]) -> float:
    """The threshold minimising fpr + 3 * fnr, as transformers computes it with sklearn's roc_curve."""
    from sklearn.metrics import roc_curve  # a hard dependency of disco; imported here because it is slow

    fpr, tpr, thresholds = roc_curve(labels, scores)
    costs = fpr + 3 * (1 - tpr)
    # sklearn's first threshold is +inf ("accept nothing"); clipping keeps tau a probability.
    return float(min(1.0, thresholds[int(costs.argmin())]))


class OraclePolicy:
    """Knows the target's greedy continuation: drafts until the first token that differs from it.

    An upper bound for measurement only. The mismatching token is still verified (the target's
    correction replaces it), exactly as any policy's last rejected token.
    """

    name = "oracle"

    def __init__(self, target_tokens: Sequence[int]) -> None:
        self.target_tokens = list(target_tokens)

    def start(self) -> None:
        pass

    def should_stop(self, step: DraftStep) -> bool:
        if step.gen_pos >= len(self.target_tokens) - 1:
            return True  # the target's output ends here (EOS or budget): nothing further can be accepted
        return int(step.token) != self.target_tokens[step.gen_pos]

    def update(self, n_drafted: int, n_accepted: int) -> None:
        pass


@dataclass
class PolicySpec:
    """A policy by name plus its knobs: what the CLI and `disco compare` pass around."""

    name: str = "threshold"  # one of POLICY_NAMES
    k: int = DEFAULT_K  # constant: window length; heuristic: starting window length
    threshold: float = DEFAULT_THRESHOLD  # threshold: stop after a token with draft probability below this
    adaptive: bool = False  # threshold: transformers' ROC update of the threshold after each window
    classifier: str | None = None  # classifier: path of the trained artifact
    classifier_threshold: float | None = None  # classifier: override the artifact's tuned threshold
    trust_pickle: bool = False  # classifier: allow a joblib (pickle) artifact, which can run code

    def __post_init__(self) -> None:
        if self.name not in POLICY_NAMES:
            raise DiscoError(f"unknown policy {self.name!r}: choose one of {', '.join(POLICY_NAMES)}")

    def build(self, target_tokens: Sequence[int] | None = None, pair=None) -> StoppingPolicy:
        """A fresh policy for one generation; the oracle needs `target_tokens`, the classifier `pair`."""
        if self.name == "classifier":
            if self.classifier is None:
                raise DiscoError("the classifier policy needs a trained artifact: pass --classifier models/NAME")
            if pair is None:
                raise DiscoError("the classifier policy needs the pair it runs on")
            from disco.classifier import ClassifierPolicy

            return ClassifierPolicy.for_pair(self.classifier, pair, self.classifier_threshold, self.trust_pickle)
        return make_policy(self.name, k=self.k, threshold=self.threshold, adaptive=self.adaptive,
                           target_tokens=target_tokens)


def make_policy(
    name: str,
    *,
    k: int = DEFAULT_K,
    threshold: float = DEFAULT_THRESHOLD,
    adaptive: bool = False,
    target_tokens: Sequence[int] | None = None,
) -> StoppingPolicy:
    """Build a policy by name (the CLI's --policy). The oracle needs the target's greedy tokens."""
    if name == "constant":
        return ConstantPolicy(k)
    if name == "heuristic":
        return HeuristicPolicy(k)
    if name == "threshold":
        return ThresholdPolicy(threshold, adaptive=adaptive)
    if name == "oracle":
        if target_tokens is None:
            raise DiscoError("the oracle policy needs the target's greedy continuation (target_tokens)")
        return OraclePolicy(target_tokens)
    if name == "classifier":
        raise DiscoError("the classifier policy needs a trained artifact: pass --classifier models/NAME")
    raise DiscoError(f"unknown policy {name!r}: choose one of {', '.join(POLICY_NAMES)}")
