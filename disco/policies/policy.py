"""Stopping policies: after each draft token, keep drafting or hand over to the target?

Every policy implements the same calls (docs/architecture.md, "Policies"; `PolicyBase` gives the defaults):

    drafts() -> bool              before a round: draft at all? (False: a target-only step)
    start()                       a new draft window begins
    should_stop(step) -> bool     called after each draft token (the token is verified either way)
    decide(step)                  should_stop as a generator, what a round calls: a learned policy
                                  yields its model's input and is sent P(accept) (p_accept live)
    update(n_drafted, n_accepted, signals)
                                  called after the target verified the window; `signals()` gives
                                  what the target said at the token it chose (features.TargetSignals),
                                  computed only if the policy calls it
    trim(drafted) -> int          optional, after the window's last draft (rounds.verified_count): how many of
                                  the drafted tokens, the first ones, the target verifies (loop_budget.py);
                                  a policy without it verifies them all

The decoding loop owns the hard limits (max window, tokens left to generate); a policy only
decides to stop early. A policy's knobs are checked once, by policy_registry.PolicySpec (ranges: settings.py);
the classes here take them as given. A policy that needs the draft's probabilities reads them from the
`DraftStep`; that read is the loop's one host sync per draft token. A policy with
`needs_hidden` gets the draft's last hidden state in `DraftStep.hidden`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Generator, Protocol, Sequence

import torch

from disco.base.defaults import (
    ADAEDL_ALPHA,
    ADAEDL_BETA1,
    ADAEDL_BETA2,
    ADAEDL_EPS,
    ADAEDL_GAMMA,
    ADAEDL_LAMBDA,
    DEFAULT_K,
    DEFAULT_MAX_WINDOW,
    DEFAULT_THRESHOLD,
    SVIP_C,
    SVIP_H,
)
from disco.base.errors import DiscoError
from disco.core.features import TargetSignals, entropy, token_features


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

    def top1(self) -> float:
        """The draft distribution's top-1 probability q* (vLLM's acceptance estimator's input; a host sync)."""
        return float(self.probs.max())

    def token_features(self, token_classes: torch.Tensor | None) -> torch.Tensor:
        """features.TOKEN_FEATURES of this token (what a learned policy reads; the simulator's steps
        carry them from the trace)."""
        if token_classes is None:
            raise DiscoError(
                "the live classifier policy needs the pair's token classes: build it with "
                "ClassifierPolicy.for_pair(artifact, pair)"
            )
        return token_features(self.probs, self.token, self.gen_pos, self.context(), token_classes)


Signals = Callable[[], TargetSignals]  # what the target said at the end of a window, computed on demand


# should_stop as a generator (rounds.draft_window): a learned policy yields its model's input and is sent
# P(accept) back; the others return at once without yielding.
Decision = Generator[Any, float, bool]


class StoppingPolicy(Protocol):
    name: str
    needs_hidden: bool  # the loop fills DraftStep.hidden (the draft engine outputs its states)

    def drafts(self) -> bool: ...

    def start(self) -> None: ...

    def should_stop(self, step: DraftStep) -> bool: ...

    def decide(self, step: DraftStep) -> Decision: ...

    def p_accept(self, question: Any) -> float: ...

    def update(self, n_drafted: int, n_accepted: int, signals: Signals | None = None) -> None: ...


def decide_now(decisions: Generator[Any, float, Any], policy: StoppingPolicy | None) -> Any:
    """Run a decision (or a round's phase 1, rounds.draft_window) live: a learned policy's question is
    answered at once by its own model (p_accept); returns what the generator returns."""
    try:
        question = next(decisions)
        while True:
            assert policy is not None, "only a policy asks questions"
            question = decisions.send(policy.p_accept(question))
    except StopIteration as done:
        return done.value


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

    def decide(self, step: DraftStep) -> Decision:
        """The round's decision (rounds.draft_window): should_stop, asking no model."""
        return self.should_stop(step)
        yield  # a generator that never yields

    def p_accept(self, question: Any) -> float:
        raise NotImplementedError(f"the {self.name} policy asks no model")

    def update(self, n_drafted: int, n_accepted: int, signals: Signals | None = None) -> None:
        pass


class ConstantPolicy(PolicyBase):
    """Leviathan et al.: always draft k tokens. Needs no host sync at all."""

    name = "constant"

    def __init__(self, k: int = DEFAULT_K) -> None:
        self.k = k

    def should_stop(self, step: DraftStep) -> bool:
        return step.window_pos >= self.k


class HeuristicPolicy(PolicyBase):
    """transformers' "heuristic" schedule: k += 2 when the whole window was accepted, else k -= 1 (min 1)."""

    name = "heuristic"

    def __init__(self, k: int = DEFAULT_K) -> None:
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

    def __init__(
        self,
        lam: float = ADAEDL_LAMBDA,
        gamma: float = ADAEDL_GAMMA,
        adaptive: bool = True,
        max_window: int = DEFAULT_MAX_WINDOW,
    ) -> None:
        if gamma <= 0:
            raise DiscoError(f"AdaEDL needs gamma > 0 (got {gamma})")
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
        if c <= 0:
            raise DiscoError(f"SVIP needs c > 0 (got {c})")
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
