"""vLLM 0.32's adaptive verification and disco's learned budget as batched policies on vLLM's draft (vllm/draft.py)
and in simulate.simulate_batched (issue 45; ../shared/serving-anchors.md, "Added 2026-12-03"): `BudgetPolicy` drafts,
trims each step's verification to the budget (policies/verify_budget.py: vLLM's `get_num_tokens` rule and its global
admission, disco's `LearnedBudget`) and teaches its estimator what vLLM verified; `BatchAdaptiveVerification` is
vLLM's method (every request drafts k; confidences from its online acceptance estimator,
policies/acceptance_estimator.py, B* from each request's confidences of its previous step), `BatchLearnedBudget`
disco's (its classifier calibrated online as the estimator, with draft stopping).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from disco.base.errors import DiscoError
from disco.policies.acceptance_estimator import OnlineAcceptanceEstimator
from disco.policies.batch_policy import Batch, RequestState, RowState
from disco.policies.verify_budget import ClassifierConfidence, LearnedBudget

# --- the batched policies on vLLM's draft (batch_policy.BatchPolicy, with its trim hook) -------------------


class _Slots:
    """Each running request's row in a policy's per-request tensors, by request id (on the host): what a step
    predicted of a request meets what vLLM verified of it at the request's next step, whatever the batch's order
    then (vLLM's persistent request index, `idx_mapping`, plays this part in its runner)."""

    def __init__(self) -> None:
        self.of: dict[str, int] = {}
        self.free: list[int] = []
        self.size = 0  # rows ever handed out

    def assign(self, ids: list[str]) -> tuple[list[int], list[int]]:
        """(each id's row, the rows new to their id): the ids absent from `ids` give theirs back first."""
        keep = set(ids)
        for rid in [r for r in self.of if r not in keep]:
            self.free.append(self.of.pop(rid))
        rows, new = [], []
        for rid in ids:
            if rid not in self.of:
                self.of[rid] = self.free.pop() if self.free else self.size
                self.size = max(self.size, self.of[rid] + 1)
                new.append(self.of[rid])
            rows.append(self.of[rid])
        return rows, new


class BudgetPolicy:
    """The batched policies that verify a budget of the batch's best draft slots (vLLM 0.32's adaptive
    verification and disco's learned budget), on vLLM's draft (vllm/draft.py) and in simulate.simulate_batched:

        drafts(batch)      every request drafts (the load profile's costs are needed: batch.cost)
        start(batch)       what was verified of each request's last drafts teaches the estimator; a LearnedBudget
        stops(pos, ...)    the slots' confidences (the estimator), LearnedBudget.after_position: who drafts on
        trim(drafted)      (B,) each request's verified drafts: one budget, one global admission (on the device)
        update(...)        what vLLM verified and accepted (learned at the next start, by request id)

    A subclass gives the estimator: `_confidence(pos, feats, p_chosen)` and `_learn(rows, verified, accepted)`."""

    name = ""
    reads_features = False
    drafts_on_device = False
    stale_budget = False  # B* from each request's confidences of its previous step (vLLM's), not this step's
    stop_drafting = False  # LearnedBudget's draft stopping (disco's); False: every request drafts k (vLLM's)

    def __init__(self, k: int, device: torch.device | str | None = None) -> None:
        self.k, self.device = k, torch.device("cpu" if device is None else device)
        self.slots = _Slots()
        self.previous = torch.ones(0, k, dtype=torch.float32, device=self.device)  # per slot: last step's confidences
        self._rows_outcome: tuple[torch.Tensor, torch.Tensor] | None = None  # vLLM's: (verified, accepted) by row
        self._id_outcome: dict[str, tuple[int, int]] = {}  # the simulator's: by request id
        self._updates = 0  # vLLM's update calls (one a step) ...
        self._trimmed_at = -2  # ... when this policy last decided a step (a governor's steps between: stale)
        self.budget: LearnedBudget | None = None
        self.rows = torch.zeros(0, dtype=torch.long, device=self.device)

    def drafts(self, batch: Batch) -> torch.Tensor:
        if batch.cost is None or not batch.cost.c_step:
            raise DiscoError(
                f"the {self.name} policy sizes each step's verification from vLLM's load profile: give one "
                '(--load-profile from `disco profile --engine vllm`, or "profile" in DISCO_VLLM_POLICY)'
            )
        return torch.ones(len(batch.states), dtype=torch.bool)

    def _grow(self, size: int) -> None:
        if size > self.previous.shape[0]:
            more = size - self.previous.shape[0]
            self.previous = torch.cat([self.previous, self.previous.new_ones(more, self.k)])
            self._grown(size)

    def _grown(self, size: int) -> None:
        """The per-slot tensors of a subclass, grown to `size` rows."""

    def start(self, batch: Batch, device: torch.device) -> None:
        assert batch.cost is not None, "drafts() refuses a batch without a load profile"
        ids = [s.request_id for s in batch.states]
        outcome = self._outcome(ids, device)  # (by the rows the ids had in the last step: before reassignment)
        rows, new = self.slots.assign(ids)
        self._grow(self.slots.size)
        self.rows = torch.tensor(rows, dtype=torch.long).to(self.device)
        if new:  # vLLM's add_request: a new request's stale confidences are 1
            self.previous[torch.tensor(new, dtype=torch.long).to(self.device)] = 1.0
        if outcome is not None:
            self._learn(*outcome)
        self._start(batch, device)
        self.budget = LearnedBudget(batch.cost, self.k, self.stop_drafting)
        self.budget.start(torch.full((len(ids),), self.k, dtype=torch.long, device=self.device))

    def _outcome(self, ids: list[str], device: torch.device) -> tuple[torch.Tensor, ...] | None:
        """(slot rows, verified, accepted) of the last step's drafts, on the device; None: nothing to learn (no
        verification, or the last step was decided by someone else, its drafts not this policy's)."""
        if self._rows_outcome is not None:
            verified, accepted = self._rows_outcome
            self._rows_outcome = None
            if self._updates != self._trimmed_at + 1:
                return None
            rows = [self.slots.of.get(rid, -1) for rid in ids]
            known = torch.tensor([r >= 0 for r in rows]).to(self.device)
            slot = torch.tensor([max(r, 0) for r in rows], dtype=torch.long).to(self.device)
            verified = torch.where(known, verified.to(self.device, torch.long), 0)
            return slot, verified, accepted.to(self.device, torch.long)
        if self._id_outcome:  # the simulator: every verified request, finished ones included
            done = [(self.slots.of[r], v, a) for r, (v, a) in self._id_outcome.items() if r in self.slots.of]
            self._id_outcome = {}
            if done:
                return tuple(torch.tensor(col, dtype=torch.long).to(self.device) for col in zip(*done))
        return None

    def _start(self, batch: Batch, device: torch.device) -> None:
        """A subclass's own start of a step."""

    def _learn(self, rows: torch.Tensor, verified: torch.Tensor, accepted: torch.Tensor) -> None:
        raise NotImplementedError

    def _confidence(self, pos: int, feats: torch.Tensor | None, p_chosen: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def stops(self, pos: int, feats: torch.Tensor | None, p_chosen: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        budget = self.budget
        assert budget is not None, "start() comes first"
        budget.live = budget.live & live.to(budget.live.device)  # (the caller's own stops: a request's end)
        return ~budget.after_position(pos, self._confidence(pos, feats, p_chosen))

    def trim(self, drafted: torch.Tensor) -> torch.Tensor:
        """batch_policy.verified's hook: each request's verified drafts, at most `drafted` (B,) on the device."""
        budget = self.budget
        assert budget is not None, "start() comes first"
        counts = budget.select(self.previous[self.rows] if self.stale_budget else None)
        self.previous[self.rows] = budget.conf
        self._trimmed_at = self._updates
        return torch.minimum(counts, drafted.to(counts.device)).to(drafted.device)

    def update(self, state: RequestState | RowState, drafted: int | torch.Tensor, accepted: int | torch.Tensor) -> None:
        """What vLLM verified (`drafted`: the trimmed windows) and accepted: for every row at once (vLLM's
        proposer, a RowState and (B,) tensors, every step) or for one request (the simulator)."""
        if isinstance(state, RowState):
            assert isinstance(drafted, torch.Tensor) and isinstance(accepted, torch.Tensor)
            self._rows_outcome = (drafted, accepted)
            self._updates += 1
        else:
            self._id_outcome[state.request_id] = (int(drafted), int(accepted))


class BatchAdaptiveVerification(BudgetPolicy):
    """vLLM 0.32's adaptive verification on vLLM's draft (the anchor; module docstring): every request drafts k
    positions, each slot's confidence from the online acceptance estimator (the draft's top-1 log-odds: disco
    drafts greedily, so p_chosen is q*), B* from each request's confidences of its previous step, the B* best
    slots by this step's."""

    name = "adaptive-verification"
    stale_budget = True

    def __init__(self, k: int, device: torch.device | str | None = None) -> None:
        super().__init__(k, device)
        self.estimator = OnlineAcceptanceEstimator(k, 0, self.device)

    def _grown(self, size: int) -> None:
        self.estimator.reserve(size)

    def _learn(self, rows: torch.Tensor, verified: torch.Tensor, accepted: torch.Tensor) -> None:
        self.estimator.step(accepted, verified, rows)  # (admitted = verified: the trimmed window vLLM verified)

    def _confidence(self, pos: int, feats: torch.Tensor | None, p_chosen: torch.Tensor) -> torch.Tensor:
        return self.estimator.predict(p_chosen, pos - 1, self.rows)


class BatchLearnedBudget(BudgetPolicy):
    """disco's learned budget on vLLM's draft: disco's classifier (ClassifierConfidence) calibrated per position
    online (online_calibration.OnlineCalibration, from what vLLM verified of its drafts) as the estimator of the
    same budget, with LearnedBudget's draft stopping (a request stops when its survival no longer pays; the batch
    when none drafts on); B* and the admission from this step's confidences."""

    name = "learned-budget"
    reads_features = True
    stop_drafting = True

    def __init__(
        self, predict: Callable[[torch.Tensor], torch.Tensor], k: int, device: torch.device | str | None = None
    ) -> None:
        from disco.online.online_calibration import OnlineCalibration

        super().__init__(k, device)
        self.model = ClassifierConfidence(predict)
        self.calibration = OnlineCalibration(k, self.device)
        self.raw = torch.zeros(0, k, dtype=torch.float32, device=self.device)  # per slot: the model's p, last step

    def _grown(self, size: int) -> None:
        self.raw = torch.cat([self.raw, self.raw.new_zeros(size - self.raw.shape[0], self.k)])

    def _start(self, batch: Batch, device: torch.device) -> None:
        self.model.start(batch, self.device)

    def _learn(self, rows: torch.Tensor, verified: torch.Tensor, accepted: torch.Tensor) -> None:
        self.calibration.observe_windows(self.raw[rows], verified, accepted)

    def _confidence(self, pos: int, feats: torch.Tensor | None, p_chosen: torch.Tensor) -> torch.Tensor:
        assert feats is not None, "reads_features: the proposer computes them"
        p = self.model(pos, feats)
        self.raw[self.rows, pos - 1] = p.float()
        return self.calibration.calibrate(pos, p.float())

    def update(self, state: RequestState | RowState, drafted: int | torch.Tensor, accepted: int | torch.Tensor) -> None:
        self.model.update(state, drafted, accepted)  # (the window features: the previous window's accepted length)
        super().update(state, drafted, accepted)
