"""vLLM 0.32's adaptive verification and disco's learned budget in disco's own one-request loop (issue 45).

acceptance_estimator.py, verify_budget.py and adaptive_verification.py re-implement both for a batch on vLLM's draft. Here the same pieces decide for one
request in disco's loop (decode.speculative_generate on the torch and llama.cpp engines, simulate._replay on
traces), where a round may verify fewer tokens than it drafted (rounds.verified_count calls `trim`):

- the estimator. adaptive-verification: vLLM's `OnlineAcceptanceEstimator` (acceptance_estimator.py) itself, B = 1,
  on the draft's top-1 probability q* at each position (`_predict_kernel`'s feature; DraftStep.top1), refit from
  what the target verified (`step`: every REFIT_INTERVAL rounds). learned-budget: disco's classifier
  (classifier.ClassifierPolicy's features and model; its own rule unused) through a per-position online
  calibration (online_calibration.OnlineCalibration, as adaptive_verification.BatchLearnedBudget calibrates it).
- the budget: verify_budget.LearnedBudget for a batch of one, so vLLM's `get_num_tokens` rule is the same
  code: B* = argmax_n (1 + S_1 + ... + S_n) / (draft cost + c_t(n + 1)), S_i the survival (running product of the
  confidences), with the loop's cost model as vLLM's two tables (`loop_tables`): draft[1] = k c_d (k draft
  steps), verify[t] = c_t(t). adaptive-verification drafts to k (vLLM's drafter is never trimmed) and verifies
  B*; learned-budget stops drafting when one more token's survival no longer pays (LearnedBudget.after_position)
  and verifies B* of what it drafted.

Adaptations to one request (verify_budget.py's list covers the batched form):
1. No staleness. vLLM's budget reads confidences one round stale so that no step waits on a device-to-host copy
   (`record_confidences`); disco's loop reads each draft token on the host anyway, so both read this round's.
2. One estimator per generation: the loop builds a fresh policy per request (as transformers' ROC threshold),
   the simulator per prompt alike; vLLM's lives as long as the server.
3. Sampling (temperature > 0). Rejection sampling is exact only if whether draft token i is verified does not
   depend on x_i itself (else the verified x_i no longer follow q). B* reads every position's confidence, and a
   later position's confidence depends on x_i (its context), so under sampling adaptive-verification verifies the
   initial run over which the budget curve rises (n is kept only while rate(n) > rate(n - 1): that decision
   reads S_1 .. S_n, which q* makes functions of x_<n); learned-budget, whose P(accept) of x_i reads x_i, verifies
   every token it drafted (its drafting stop, made after each token, is a stopping rule and stays). Greedy
   drafts are functions of the context, so there both verify B* and stay lossless.
"""

from __future__ import annotations

import numpy as np
import torch

from disco.core.cost import CostModel
from disco.online.online_calibration import OnlineCalibration
from disco.policies.acceptance_estimator import OnlineAcceptanceEstimator
from disco.policies.classifier import ClassifierPolicy
from disco.policies.policy import Decision, PolicyBase, Signals, decide_now
from disco.policies.rounds import leading_run
from disco.policies.verify_budget import CostTables, LearnedBudget, budget_curve


def loop_tables(cost: CostModel, k: int) -> CostTables:
    """The loop's cost model as vLLM's (draft, verify) tables for a batch of one request drafting k positions:
    draft[1] = k c_d (the drafter's step), verify[t] = c_t(t), t = 1 .. k + 1 (verify[0] is never read: the pending
    token is always verified). A cost model covering fewer than k + 1 tokens refuses in one line (CostModel.verify)."""
    verify = [cost.verify(t) for t in range(1, k + 2)]
    return CostTables(np.array([0.0, k * cost.c_d]), np.array([verify[0], *verify]))


class LoopBudget(PolicyBase):
    """A budget policy in disco's loop: the StoppingPolicy calls plus `trim` (rounds.verified_count). A subclass
    gives each drafted token's confidence (`decide`) and learns from the verified outcome (`update`)."""

    stop_drafting = False  # LearnedBudget's draft stopping (learned-budget); False: draft to k (vLLM's)

    def __init__(self, cost: CostModel, k: int, sampled: bool = False) -> None:
        self.k, self.sampled = k, sampled
        self.tables = loop_tables(cost, k)
        self.budget = LearnedBudget(self.tables, k, self.stop_drafting)

    def start(self) -> None:
        self.budget.start(torch.full((1,), self.k, dtype=torch.long))

    def _stops(self, pos: int, confidence: float) -> bool:
        """The drafted token at window position `pos` has this confidence: whether drafting stops after it."""
        return not bool(self.budget.after_position(pos, torch.tensor([confidence], dtype=torch.float32))[0])

    def trim(self, drafted: int) -> int:
        """How many of the `drafted` tokens the target verifies: B* (module docstring; under sampling, 3)."""
        if not self.sampled:
            return min(int(self.budget.select()[0]), drafted)
        return min(self._rising(), drafted)

    def _rising(self) -> int:
        """The largest n with rate(1) > rate(0), ..., rate(n) > rate(n - 1): adaptation 3's budget."""
        b = self.budget
        curve = budget_curve(b.conf, self.tables, b.drafted, k=self.k, draft_cost=max(b.positions, 1) * b.position)
        return leading_run(curve[1:] > curve[:-1])


class LoopAdaptiveVerification(LoopBudget):
    """vLLM 0.32's adaptive verification for one request: draft to k, each token's confidence from vLLM's online
    logistic on the draft's top-1 log-odds (acceptance_estimator.py, `OnlineAcceptanceEstimator.predict`), verify
    the budget's B* (vLLM's adaptive_verification.py, `get_num_tokens`), refit from the verified outcomes (`step`)."""

    name = "adaptive-verification"

    def __init__(self, cost: CostModel, k: int, sampled: bool = False) -> None:
        super().__init__(cost, k, sampled)
        self.estimator = OnlineAcceptanceEstimator(k, 1)

    def should_stop(self, step) -> bool:
        pos = step.window_pos
        q = torch.tensor([step.top1()], dtype=torch.float32)  # (the host sync of this draft token)
        return self._stops(pos, float(self.estimator.predict(q, pos - 1)[0]))

    def update(self, n_drafted: int, n_accepted: int, signals: Signals | None = None) -> None:
        # n_drafted: the tokens verified (vLLM's admitted count): judged, the accepted ones and the first rejected
        self.estimator.step(torch.tensor([n_accepted]), torch.tensor([n_drafted]))


class LoopLearnedBudget(LoopBudget):
    """disco's learned budget for one request: disco's classifier, calibrated per position online, as the budget's
    estimator; drafting stops when one more token's survival no longer pays, the target verifies B*."""

    name = "learned-budget"
    stop_drafting = True

    def __init__(self, classifier: ClassifierPolicy, cost: CostModel, k: int, sampled: bool = False) -> None:
        super().__init__(cost, k, sampled)
        self.classifier = classifier  # its features, model and window state (its rule is the budget's here)
        self.model = classifier.model  # (the simulator batches the questions of lanes sharing a model)
        self.needs_hidden = classifier.needs_hidden
        self.calibration = OnlineCalibration(k)
        self.raw = torch.zeros(1, k, dtype=torch.float32)  # the model's own P(accept) of this window's tokens

    def start(self) -> None:
        super().start()
        self.classifier.start()
        self.raw.zero_()

    def decide(self, step) -> Decision:
        pos = step.window_pos
        p = yield self.classifier.features(step.token_features(self.classifier.token_classes), pos, step.hidden)
        self.raw[0, pos - 1] = p
        return self._stops(pos, float(self.calibration.calibrate(pos, self.raw[0, pos - 1 : pos])[0]))

    def should_stop(self, step) -> bool:
        return decide_now(self.decide(step), self)

    def p_accept(self, question) -> float:
        return self.classifier.p_accept(question)

    def trim(self, drafted: int) -> int:
        return drafted if self.sampled else super().trim(drafted)  # (adaptation 3)

    def update(self, n_drafted: int, n_accepted: int, signals: Signals | None = None) -> None:
        self.classifier.update(n_drafted, n_accepted, signals)  # (the window features of the next window)
        self.calibration.observe_windows(self.raw, torch.tensor([n_drafted]), torch.tensor([n_accepted]))
