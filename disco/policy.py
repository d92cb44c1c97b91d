"""Stopping policies: after each draft token, keep drafting or hand over to the target?

Every policy implements the same calls (DESIGN.md §5; `PolicyBase` gives the defaults):

    drafts() -> bool              before a round: draft at all? (False: a target-only step)
    start()                       a new draft window begins
    should_stop(step) -> bool     called after each draft token (the token is verified either way)
    update(n_drafted, n_accepted, signals)
                                  called after the target verified the window; `signals()` gives
                                  what the target said at the token it chose (features.TargetSignals),
                                  computed only if the policy calls it

The decoding loop owns the hard limits (max window, tokens left to generate); a policy only
decides to stop early. A policy that needs the draft's probabilities reads them from the
`DraftStep`; that read is the loop's one host sync per draft token. A policy with
`needs_hidden` gets the draft's last hidden state in `DraftStep.hidden`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import torch

from disco.errors import DiscoError
from disco.features import TargetSignals, entropy

# transformers >= 4.45: assistant_confidence_threshold = 0.4, num_assistant_tokens = 20.
DEFAULT_THRESHOLD = 0.4
DEFAULT_MAX_WINDOW = 20
# Leviathan et al.'s static length and transformers' heuristic schedule start at 5.
DEFAULT_K = 5
# "target" is plain target-only decoding (no draft): the baseline every speedup is measured against.
POLICY_NAMES = ("target", "constant", "heuristic", "threshold", "adaedl", "svip", "oracle", "classifier")


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
    hidden: torch.Tensor | None = None  # the draft's last hidden state here (policies with needs_hidden)

    def context(self) -> torch.Tensor:
        """Every token before this one: prompt, accepted tokens, the window's earlier drafts."""
        return torch.cat([self.committed, *(t.view(1) for t in self.drafted_before)])

    def entropy(self) -> float:
        """Entropy (nats) of the draft distribution the token was drawn from (a host sync)."""
        return float(entropy(self.probs))


Signals = Callable[[], TargetSignals]  # what the target said at the end of a window, computed on demand


class StoppingPolicy(Protocol):
    name: str
    needs_hidden: bool  # the loop fills DraftStep.hidden (the draft engine outputs its states)

    def drafts(self) -> bool: ...

    def start(self) -> None: ...

    def should_stop(self, step: DraftStep) -> bool: ...

    def update(self, n_drafted: int, n_accepted: int, signals: Signals | None = None) -> None: ...


class PolicyBase:
    """Defaults of the StoppingPolicy calls: always draft, no window state, nothing learned."""

    name = "base"
    needs_hidden = False

    def drafts(self) -> bool:
        return True

    def start(self) -> None:
        pass

    def should_stop(self, step: DraftStep) -> bool:
        raise NotImplementedError

    def update(self, n_drafted: int, n_accepted: int, signals: Signals | None = None) -> None:
        pass


class ConstantPolicy(PolicyBase):
    """Leviathan et al.: always draft k tokens. Needs no host sync at all."""

    name = "constant"

    def __init__(self, k: int = DEFAULT_K) -> None:
        if k < 1:
            raise DiscoError(f"--k must be at least 1 (got {k})")
        self.k = k

    def should_stop(self, step: DraftStep) -> bool:
        return step.window_pos >= self.k


class HeuristicPolicy(PolicyBase):
    """transformers' "heuristic" schedule: k += 2 when the whole window was accepted, else k -= 1 (min 1)."""

    name = "heuristic"

    def __init__(self, k: int = DEFAULT_K) -> None:
        if k < 1:
            raise DiscoError(f"--k must be at least 1 (got {k})")
        self.k = k

    def should_stop(self, step: DraftStep) -> bool:
        return step.window_pos >= self.k

    def update(self, n_drafted: int, n_accepted: int, signals: Signals | None = None) -> None:
        if n_drafted == 0:
            return  # a target-only step (no budget left to draft) says nothing about the draft
        self.k = self.k + 2 if n_accepted == n_drafted else max(1, self.k - 1)


class ThresholdPolicy(PolicyBase):
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

    def update(self, n_drafted: int, n_accepted: int, signals: Signals | None = None) -> None:
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


# AdaEDL's defaults (Agrawal et al. 2024, arXiv 2410.18351, Sec. 4.4; beta1, beta2, epsilon and alpha
# come from Draft & Verify); the initial lambda is not stated: 0.9 is the best of its Fig. 6 sweep.
ADAEDL_GAMMA, ADAEDL_LAMBDA, ADAEDL_BETA1, ADAEDL_BETA2, ADAEDL_EPS, ADAEDL_ALPHA = 0.2, 0.9, 0.5, 0.9, 0.01, 0.9
# SVIP's released code (github.com/Geralt-Targaryen/SVIP, vanilla-sd/eval_specbench.py): c = 0.15, h = 0.3.
SVIP_C, SVIP_H = 0.15, 0.3


class AdaEDLPolicy(PolicyBase):
    """AdaEDL (Agrawal, Jeon, Lee 2024, arXiv 2410.18351, Sec. 3 and Algorithm 1): stop drafting when an
    entropy-based lower bound on the token's acceptance probability falls below lambda,

        1 - sqrt(gamma * H(q)) < lambda        H: entropy (nats) of the draft distribution q

    (from beta = 1 - TV(q, p) >= 1 - sqrt(KL / 2) with the cross-entropy approximated as (1 + 2 gamma) H),
    and adapt lambda after every round toward a target acceptance rate alpha:

        AR      <- beta1 * AR + (1 - beta1) * n_accepted / n_drafted           (AR starts at 0)
        lambda' =  lambda + eps  if AR < alpha,  lambda - eps  if the round drafted < max_window,  else lambda
        lambda  <- beta2 * lambda + (1 - beta2) * lambda'

    The paper checks the bound before drafting a token and leaves it out; here, as in every disco
    policy and transformers' threshold, the check follows the drafted token, which is verified either way.
    `adaptive=False` keeps lambda fixed (the form tuned on validation)."""

    name = "adaedl"

    def __init__(self, lam: float = ADAEDL_LAMBDA, gamma: float = ADAEDL_GAMMA, adaptive: bool = True,
                 max_window: int = DEFAULT_MAX_WINDOW) -> None:
        if not 0.0 <= lam <= 1.0 or gamma <= 0:
            raise DiscoError(f"AdaEDL needs lambda within [0, 1] and gamma > 0 (got {lam}, {gamma})")
        self.lam, self.gamma, self.adaptive, self.max_window = lam, gamma, adaptive, max_window
        self.ar = 0.0

    def should_stop(self, step: DraftStep) -> bool:
        return 1.0 - math.sqrt(self.gamma * max(step.entropy(), 0.0)) < self.lam  # the host sync

    def update(self, n_drafted: int, n_accepted: int, signals: Signals | None = None) -> None:
        if not self.adaptive or n_drafted == 0:
            return
        self.ar = ADAEDL_BETA1 * self.ar + (1 - ADAEDL_BETA1) * n_accepted / n_drafted
        if self.ar < ADAEDL_ALPHA:
            target = self.lam + ADAEDL_EPS
        elif n_drafted < self.max_window:
            target = self.lam - ADAEDL_EPS
        else:
            target = self.lam
        self.lam = ADAEDL_BETA2 * self.lam + (1 - ADAEDL_BETA2) * target


class SVIPPolicy(PolicyBase):
    """SVIP (Zhang et al. 2024, arXiv 2411.18462, Sec. 2.2): the acceptance rate is bounded below by
    1 - sqrt(c * H(q)) (Eq. 6, from Pinsker's inequality, Eq. 3-5); stop after a drafted token when

        sqrt(c * H(q)) > h          H: entropy (nats) of the draft distribution the token came from

    with c = 0.15 and h = 0.3 as in the authors' released code (the paper's Eq. 7 folds c into h:
    sqrt(H) > h'). That is: stop when H > h^2 / c = 0.6 nats. Training-free; h is tuned on validation."""

    name = "svip"

    def __init__(self, h: float = SVIP_H, c: float = SVIP_C) -> None:
        if h < 0 or c <= 0:
            raise DiscoError(f"SVIP needs h >= 0 and c > 0 (got {h}, {c})")
        self.h, self.c = h, c

    def should_stop(self, step: DraftStep) -> bool:
        return math.sqrt(self.c * max(step.entropy(), 0.0)) > self.h  # the host sync


class OraclePolicy(PolicyBase):
    """Knows the target's greedy continuation: drafts until the first token that differs from it.

    An upper bound for measurement only. The mismatching token is still verified (the target's
    correction replaces it), exactly as any policy's last rejected token.
    """

    name = "oracle"

    def __init__(self, target_tokens: Sequence[int]) -> None:
        self.target_tokens = list(target_tokens)

    def should_stop(self, step: DraftStep) -> bool:
        if step.gen_pos >= len(self.target_tokens) - 1:
            return True  # the target's output ends here (EOS or budget): nothing further can be accepted
        return int(step.token) != self.target_tokens[step.gen_pos]


@dataclass
class PolicySpec:
    """A policy by name plus its knobs: what the CLI and `disco compare` pass around."""

    name: str = "threshold"  # one of POLICY_NAMES
    k: int = DEFAULT_K  # constant: window length; heuristic: starting window length
    threshold: float = DEFAULT_THRESHOLD  # threshold: stop after a token with draft probability below this
    adaptive: bool = False  # threshold: transformers' ROC update of the threshold after each window
    lam: float = ADAEDL_LAMBDA  # adaedl: (initial) lower bound on acceptance below which drafting stops
    lam_adaptive: bool = True  # adaedl: the paper's update of lambda after each round
    h: float = SVIP_H  # svip: stop when sqrt(c * entropy) exceeds this
    classifier: str | None = None  # classifier: path of the trained artifact
    classifier_threshold: float | None = None  # classifier: override the artifact's tuned rule parameter
    classifier_rule: str | None = None  # classifier: run this rule (token, cumulative, cost) instead of the chosen one
    trust_pickle: bool = False  # classifier: allow a joblib (pickle) artifact, which can run code

    def __post_init__(self) -> None:
        if self.name not in POLICY_NAMES:
            raise DiscoError(f"unknown policy {self.name!r}: choose one of {', '.join(POLICY_NAMES)}")

    def build(self, target_tokens: Sequence[int] | None = None, pair=None, max_window: int = DEFAULT_MAX_WINDOW,
              sampling: tuple[float, float] | None = None) -> StoppingPolicy:
        """A fresh policy for one generation; the oracle needs `target_tokens`, the classifier `pair` (and
        `sampling`, the (temperature, top-p) it runs at, to warn when it was tuned for another)."""
        if self.name == "classifier":
            if self.classifier is None:
                raise DiscoError("the classifier policy needs a trained artifact: pass --classifier models/NAME")
            if pair is None:
                raise DiscoError("the classifier policy needs the pair it runs on")
            from disco.classifier import ClassifierPolicy

            return ClassifierPolicy.for_pair(self.classifier, pair, self.classifier_threshold, self.trust_pickle,
                                             self.classifier_rule, sampling)
        return make_policy(self.name, k=self.k, threshold=self.threshold, adaptive=self.adaptive,
                           target_tokens=target_tokens, lam=self.lam, lam_adaptive=self.lam_adaptive, h=self.h,
                           max_window=max_window)


def make_policy(
    name: str,
    *,
    k: int = DEFAULT_K,
    threshold: float = DEFAULT_THRESHOLD,
    adaptive: bool = False,
    target_tokens: Sequence[int] | None = None,
    lam: float = ADAEDL_LAMBDA,
    lam_adaptive: bool = True,
    h: float = SVIP_H,
    max_window: int = DEFAULT_MAX_WINDOW,
) -> StoppingPolicy:
    """Build a policy by name (the CLI's --policy). The oracle needs the target's greedy tokens."""
    if name == "constant":
        return ConstantPolicy(k)
    if name == "heuristic":
        return HeuristicPolicy(k)
    if name == "threshold":
        return ThresholdPolicy(threshold, adaptive=adaptive)
    if name == "adaedl":
        return AdaEDLPolicy(lam, adaptive=lam_adaptive, max_window=max_window)
    if name == "svip":
        return SVIPPolicy(h)
    if name == "oracle":
        if target_tokens is None:
            raise DiscoError("the oracle policy needs the target's greedy continuation (target_tokens)")
        return OraclePolicy(target_tokens)
    if name == "classifier":
        raise DiscoError("the classifier policy needs a trained artifact: pass --classifier models/NAME")
    raise DiscoError(f"unknown policy {name!r}: choose one of {', '.join(POLICY_NAMES)}")
