"""Policies that decide for a whole batch of requests at once (docs/architecture.md, "vLLM's own draft").

vLLM drafts every running request in one batched forward per draft position. After each position the
proposer (vllm/draft.py) asks one of these for the whole batch in one call: a (B,) mask of the requests
that stop after this token. Each is the batched form of a policy of policy.py / classifier.py: the same
decision, per request, as tensor operations (the classifier's features come from features.py's batched
form; its model answers all rows in one call). What a policy keeps between a request's windows lives in
that request's `RequestState`, which the proposer keys by vLLM's request id and frees with the request; on vLLM's
draft the same fields live on the draft's device, a row per request (`RowState`), so that telling the policy what
vLLM accepted and asking it who drafts wait for no copy to the host (vllm/draft.py keeps them there).

A policy with a batched form has a `batched` builder in its policy_registry entry; the others (heuristic,
adaedl, svip, oracle) are refused by the proposer in one line.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Protocol

import torch

from disco.core.cost import CostModel, load_view
from disco.core.features import NO_SIGNALS, TARGET_SIGNALS, TOKEN_FEATURES
from disco.core.stats import GenStats
from disco.policies.rules import Pooled, forecast_after, forecast_relaxed, rule_named

_P_CHOSEN = TOKEN_FEATURES.index("p_chosen")


@dataclass
class RequestState:
    """One request as the batched policies see it between its windows (per vLLM request id)."""

    request_id: str = ""  # vLLM's id of the request
    prev_accepted: int = 0  # the previous window's accepted length (a feature)
    forecast: float = 1.0  # cost-adaptive: running per-token acceptance (classifier.py)
    window: list[int] = field(default_factory=list)  # the draft tokens last handed to vLLM for it
    stats: GenStats = field(default_factory=GenStats)  # its windows (compare's counts)


@dataclass
class RowState:
    """RequestState's policy fields (prev_accepted, forecast) for the rows of a batch, as (B,) tensors on the
    draft's device: vLLM's proposer keeps them there between steps (vllm/draft.py), the policies' update,
    drafts and start read and write them there."""

    prev_accepted: torch.Tensor  # (B,) int64
    forecast: torch.Tensor  # (B,) float64

    @classmethod
    def fresh(cls, n: int, device: torch.device | str) -> RowState:
        """n requests before their first window (RequestState's defaults), made on the device (no copy)."""
        return cls(
            torch.full((n,), RequestState.prev_accepted, dtype=torch.long, device=device),
            torch.full((n,), RequestState.forecast, dtype=torch.float64, device=device),
        )

    def take(self, rows: torch.Tensor) -> RowState:
        """These rows (a (B,) index on the device), copied."""
        return RowState(*(getattr(self, f.name)[rows] for f in fields(self)))

    def put(self, rows: torch.Tensor | int | slice, values: RowState) -> None:
        """Write `values` into these rows."""
        for f in fields(self):
            getattr(self, f.name)[rows] = getattr(values, f.name)


@dataclass
class Batch:
    """One draft step's view of the running requests, what the batched policies read: built by the proposer."""

    states: list[RequestState]
    cost: CostModel | None = None  # the cost rules' cost model at this batch's load (CostModel.at_load)
    # one more batched draft position for the whole batch (the load profile's c_draft at this batch size): the
    # requests still drafting share it, so the last one drafting pays all of it; None: c_d per draft token
    position_cost: float | None = None
    # the states' policy fields on the draft's device, a row each (vLLM's proposer): the policies read and write
    # these instead of the states' own (None: the states' own, as the simulator keeps them)
    rows: RowState | None = None

    @classmethod
    def under(
        cls, states: list[RequestState], load: CostModel | None, max_window: int, rows: RowState | None = None
    ) -> Batch:
        """The batch of `states` in a step under a load profile (None: the policies' own cost models)."""
        n = len(states)
        position = load.draft_position(n) if load is not None else None
        return cls(states, load_view(load, n, max_window), position, rows)


class BatchPolicy(Protocol):
    name: str
    reads_features: bool  # needs the FEATURES matrix (the classifier); the others read only p_chosen

    @property
    def drafts_on_device(self) -> bool:
        """drafts() answers from batch.rows (cost-adaptive's forecasts), on their device: the proposer cannot read
        who drafts before the first position without a wait, and learns it with that position's answer."""
        ...

    # (B,) bool: does each request draft this step? On the host, but where drafts_on_device
    def drafts(self, batch: Batch) -> torch.Tensor: ...

    def start(self, batch: Batch, device: torch.device) -> None: ...  # a new window for every request

    # after draft position `pos` (1-based): (B,) bool, stop after this token. feats: (B, len(TOKEN_FEATURES))
    # (features.assemble_token_features) or None; p_chosen: (B,) the draft's probability of each drafted token;
    # live: (B,) the requests that drafted this token (the others' answers are ignored)
    def stops(
        self, pos: int, feats: torch.Tensor | None, p_chosen: torch.Tensor, live: torch.Tensor
    ) -> torch.Tensor: ...

    # what the target accepted of a request's window of `drafted` tokens; or of every row's at once, on the
    # device (a RowState and (B,) counts; drafted 0: no window verified)
    def update(
        self, state: RequestState | RowState, drafted: int | torch.Tensor, accepted: int | torch.Tensor
    ) -> None: ...

    # optional, read by `verified` (a policy without it verifies every token it drafted): after the last draft
    # position, trim(drafted) -> (B,) how many of each request's `drafted` tokens go to verification, on the device
    # (adaptive_verification.BudgetPolicy: a budget of the batch's best slots)


def verified(policy: BatchPolicy, drafted: torch.Tensor) -> torch.Tensor:
    """(B,) each request's tokens handed to verification after it drafted `drafted` (B,): the policy's `trim`
    hook, by default all of them (vllm/draft.py's windows, simulate.simulate_batched)."""
    trim = getattr(policy, "trim", None)
    return drafted if trim is None else trim(drafted)


def never_drafts(policy: BatchPolicy, load: CostModel | None, max_batch: int, max_window: int) -> bool:
    """Whether `policy` lets no fresh request draft at any batch size up to max_batch that `load` covers (the
    target policy; a cost rule under which even a perfectly accepted window never pays, as the load profile of
    an AVX2-only CPU says): then no request ever drafts, and vLLM's draft loop need not run at all, its
    catch-up pass included, whose only use is a draft KV cache no one will read (vllm/draft.py skips it,
    simulate.simulate_batched charges none). A fresh request is the best case the batched policies see (the
    cost rules ask about perfect acceptance before a window; cost-adaptive's forecast starts at 1). Without a
    load profile the answer is the same at every batch size: one is asked."""
    most = min(max_batch, len(load.c_step) // 2) if load is not None else 1  # (at_load refuses larger ones)
    fresh = (Batch.under([RequestState() for _ in range(b)], load, max_window) for b in range(1, most + 1))
    return not any(bool(policy.drafts(batch).any()) for batch in fresh)


class _Fixed:
    """The batched forms that keep nothing between windows share these."""

    reads_features = False
    drafts_on_device = False

    def drafts(self, batch: Batch) -> torch.Tensor:
        return torch.ones(len(batch.states), dtype=torch.bool)

    def start(self, batch: Batch, device: torch.device) -> None:
        pass

    def update(self, state: RequestState | RowState, drafted: int | torch.Tensor, accepted: int | torch.Tensor) -> None:
        pass


class BatchTarget(_Fixed):
    """Target-only decoding: no request drafts."""

    name = "target"

    def drafts(self, batch: Batch) -> torch.Tensor:
        return torch.zeros(len(batch.states), dtype=torch.bool)

    def stops(self, pos: int, feats: torch.Tensor | None, p_chosen: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(p_chosen, dtype=torch.bool)


class BatchConstant(_Fixed):
    """policy.ConstantPolicy for a batch: every request drafts k tokens."""

    name = "constant"

    def __init__(self, k: int) -> None:
        self.k = k

    def stops(self, pos: int, feats: torch.Tensor | None, p_chosen: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        return torch.full_like(p_chosen, pos >= self.k, dtype=torch.bool)


class BatchThreshold(_Fixed):
    """policy.ThresholdPolicy (fixed tau) for a batch: a request stops after a token below tau."""

    name = "threshold"

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold

    def stops(self, pos: int, feats: torch.Tensor | None, p_chosen: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        return p_chosen < self.threshold


class BatchClassifier:
    """classifier.ClassifierPolicy for a batch: the model's P(accept) of every row in one call, then the rule's
    batched form (rules.py: the same rule objects as the scalar policy, (B,) tensors in one vectorised call).

    predict: (B, F) float32 features on the draft's device -> (B,) calibrated P(accept) (the artifact's
    batched predictor: logistic/MLP as tensor ops on the device, LightGBM in one host call)."""

    name = "classifier"
    reads_features = True

    def __init__(
        self, predict: Callable[[torch.Tensor], torch.Tensor], rule: str, setting: float, cost: CostModel | None
    ) -> None:
        self._rule = rule_named(rule)  # the decision (rules.py)
        self._rule.check(setting, cost)
        self.predict, self.rule, self.setting, self.cost = predict, rule, setting, cost
        self._survive = torch.ones(0, dtype=torch.float64)
        self._prod = torch.ones(0)
        self._prev = torch.zeros(0)
        self._pooled: Pooled | None = None
        self._batch = Batch([])

    def _costs(self) -> CostModel | None:
        return self._batch.cost or self.cost  # the load's, when the proposer knows it

    @property
    def drafts_on_device(self) -> bool:
        return self._rule.forecasts  # (each request's forecast; the other rules answer alike for all)

    def drafts(self, batch: Batch) -> torch.Tensor:
        self._batch = batch
        rows = batch.rows
        if not self._rule.forecasts:  # (the same answer for every request: no forecast to read)
            return self._rule.drafts_rows(
                torch.ones(len(batch.states), dtype=torch.float64), self.setting, self._costs()
            )
        if rows is None:
            forecast = torch.tensor([s.forecast for s in batch.states], dtype=torch.float64)
        else:
            forecast = rows.forecast
        go = self._rule.drafts_rows(forecast, self.setting, self._costs())
        # a skipped round moves the estimate back toward 1 (classifier.ClassifierPolicy.drafts)
        if rows is not None:
            rows.forecast = torch.where(go, forecast, forecast_relaxed(forecast))
            return go
        for s, g in zip(batch.states, go.tolist()):
            if not g:
                s.forecast = forecast_relaxed(s.forecast)
        return go

    def start(self, batch: Batch, device: torch.device) -> None:
        n = len(batch.states)
        self._batch = batch
        self._survive = torch.ones(n, dtype=torch.float64, device=device)
        self._prod = torch.ones(n, device=device)  # window_prob_prod: product of p_chosen in the window
        if batch.rows is not None:
            self._prev = batch.rows.prev_accepted.to(device=device, dtype=torch.float32)
        else:
            self._prev = torch.tensor([float(s.prev_accepted) for s in batch.states], device=device)
        # the step's tokens so far (made on the device: a tensor from a host value is a copy there)
        verified = torch.full((), float(n), dtype=torch.float64, device=device)
        self._pooled = None if batch.position_cost is None else Pooled(batch.position_cost, verified)

    def window_features(self, pos: int, p_chosen: torch.Tensor) -> torch.Tensor:
        """(B, len(WINDOW_FEATURES)): features.WindowState.step for every row (vLLM shows the proposer no target
        signals: they keep their before-any-window values, as in training with --no-target-signals)."""
        self._prod = p_chosen.float() * self._prod
        n = p_chosen.shape[0]
        signals = _no_signals(p_chosen.device).expand(n, len(TARGET_SIGNALS))
        pos_col = torch.full((n, 1), float(pos), device=p_chosen.device)
        return torch.cat([pos_col, self._prod[:, None], self._prev[:, None], signals], 1)

    def stops(self, pos: int, feats: torch.Tensor | None, p_chosen: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        assert feats is not None and feats.shape[1] == len(TOKEN_FEATURES)
        feats = torch.cat([feats, self.window_features(pos, feats[:, _P_CHOSEN])], 1)  # FEATURES, in order
        p = self.predict(feats).double()
        self._survive = self._survive * p
        return self._rule.stops_rows(pos, p, self._survive, self.setting, self._costs(), live, self._pooled)

    def update(self, state: RequestState | RowState, drafted: int | torch.Tensor, accepted: int | torch.Tensor) -> None:
        """classifier.ClassifierPolicy.update (WindowState.end, the forecast): for one request, or for every row
        at once on the device (a RowState; the same arithmetic in float64, so the same forecasts)."""
        if isinstance(state, RowState):
            assert isinstance(drafted, torch.Tensor) and isinstance(accepted, torch.Tensor)
            verified = drafted > 0
            forecast = forecast_after(state.forecast, drafted, accepted.double())  # (0/0 where unverified)
            state.prev_accepted = torch.where(verified, accepted.long(), state.prev_accepted)
            state.forecast = torch.where(verified, forecast, state.forecast)
        elif drafted > 0:
            state.prev_accepted = int(accepted)
            state.forecast = forecast_after(state.forecast, int(drafted), int(accepted))


@functools.lru_cache(maxsize=8)
def _no_signals(device: torch.device) -> torch.Tensor:
    """TARGET_SIGNALS' values before any window (vLLM shows the proposer none), float32: made once per device, not
    copied there at every position."""
    return torch.tensor(NO_SIGNALS.values(), device=device)
