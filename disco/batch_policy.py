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

from disco.classifier import FORECAST_KEEP, FORECAST_RELAX
from disco.cost import CostModel, load_view
from disco.features import NO_SIGNALS, TARGET_SIGNALS, TOKEN_FEATURES
from disco.stats import GenStats

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
    """classifier.ClassifierPolicy for a batch: the model's P(accept) of every row in one call, then the rule.

    predict: (B, F) float32 features on the draft's device -> (B,) calibrated P(accept) (the artifact's
    batched predictor: logistic/MLP as tensor ops on the device, LightGBM in one host call)."""

    name = "classifier"
    reads_features = True

    def __init__(
        self, predict: Callable[[torch.Tensor], torch.Tensor], rule: str, setting: float, cost: CostModel | None
    ) -> None:
        self.predict, self.rule, self.setting, self.cost = predict, rule, setting, cost
        self._survive = torch.ones(0, dtype=torch.float64)
        self._prod = torch.ones(0)
        self._prev = torch.zeros(0)
        self._batch = Batch([])

    def _costs(self) -> CostModel:
        cost = self._batch.cost or self.cost
        assert cost is not None, "the cost rules need a cost model (checked when the policy is built)"
        return cost

    @property
    def drafts_on_device(self) -> bool:
        return self.rule == "cost-adaptive"  # (each request's forecast; the other rules answer alike for all)

    def drafts(self, batch: Batch) -> torch.Tensor:
        n = len(batch.states)
        if self.rule == "cost":  # would a perfectly accepted window pay at the tuned rate? (the same for all)
            self._batch = batch
            one = torch.ones(n, dtype=torch.float64)
            return _pays(self._costs(), 0, one, one, self._rate())
        if self.rule == "cost-adaptive":  # a window accepted at each request's forecast beats target-only?
            self._batch = batch
            rows = batch.rows
            if rows is None:
                forecast = torch.tensor([s.forecast for s in batch.states], dtype=torch.float64)
            else:
                forecast = rows.forecast
            one = torch.ones(n, dtype=torch.float64, device=forecast.device)
            go = _pays(self._costs(), 0, one, forecast, 1.0 / self._costs().c_t[0])
            # a skipped round moves the estimate back toward 1 (classifier.ClassifierPolicy.drafts)
            if rows is not None:
                rows.forecast = torch.where(go, forecast, forecast + (1.0 - forecast) * FORECAST_RELAX)
                return go
            for s, g in zip(batch.states, go.tolist()):
                if not g:
                    s.forecast += (1.0 - s.forecast) * FORECAST_RELAX
            return go
        return torch.ones(n, dtype=torch.bool)

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
        self._verified = torch.full((), float(n), dtype=torch.float64, device=device)

    def _rate(self) -> float:
        return self.setting / self._costs().c_t[0]

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
        if self.rule == "token":
            return p < self.setting
        if self.rule == "cumulative":
            return 1.0 - self._survive > self.setting
        if self._batch.position_cost is None:  # a draft token costs c_d, whoever else drafts
            return ~_pays(self._costs(), pos, self._survive, p, self._rate())
        return ~self._pooled(pos, p, live)

    def _pooled(self, pos: int, p: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        """The cost rules on vLLM's batched draft (docs/architecture.md, "vLLM's own draft"): one more position is
        one batched forward whoever drafts in it, so the batch runs it while the expected tokens of the requests
        drafting on, summed, pay for it and for their verification; a request drafts on in it while its own
        next tokens pay their verification, the position being paid already. (B,) bool: drafts on. Tensor
        operations only (no host sync): the proposer's one sync per position decides."""
        c, rho = self._costs(), self._rate()
        self._verified = self._verified + live.sum()  # each token drafted this step is verified with it
        top = len(c.c_t)
        keep = live & _pays(c, pos, self._survive, p, rho, 0.0)
        if pos + 1 >= top:
            return torch.zeros_like(keep)
        m = torch.arange(1, top - pos, dtype=torch.float64, device=p.device)  # m more positions
        a = p.double()[:, None].expand(-1, len(m)).cumprod(1)
        gain = ((self._survive[:, None] * a).cumsum(1) * keep[:, None]).sum(0)  # (M,) the batch's tokens
        c_step = _as_tensor(c.c_step, p.device)
        last = len(c_step) - 1
        now = (self._verified.long() - 1).clamp(0, last)
        then = (self._verified.long() - 1 + keep.sum() * m.long()).clamp(0, last)
        extra = m * float(self._batch.position_cost) + c_step[then] - c_step[now]  # seconds, the whole batch
        return keep & (gain > rho * extra).any()

    def update(self, state: RequestState | RowState, drafted: int | torch.Tensor, accepted: int | torch.Tensor) -> None:
        """classifier.ClassifierPolicy.update (WindowState.end, the forecast): for one request, or for every row
        at once on the device (a RowState; the same arithmetic in float64, so the same forecasts)."""
        if isinstance(state, RowState):
            assert isinstance(drafted, torch.Tensor) and isinstance(accepted, torch.Tensor)
            verified = drafted > 0
            a = accepted.double()
            judged = a + (accepted < drafted)
            forecast = FORECAST_KEEP * state.forecast + (1 - FORECAST_KEEP) * a / judged  # (0/0 where unverified)
            state.prev_accepted = torch.where(verified, accepted.long(), state.prev_accepted)
            state.forecast = torch.where(verified, forecast, state.forecast)
        elif drafted > 0:
            state.prev_accepted = accepted
            judged = accepted + (accepted < drafted)
            state.forecast = FORECAST_KEEP * state.forecast + (1 - FORECAST_KEEP) * accepted / judged


def _pays(
    c: CostModel, i: int, survive: torch.Tensor, forecast: torch.Tensor, rho: float, c_d: float | None = None
) -> torch.Tensor:
    """classifier.ClassifierPolicy._pays for every row: does some window longer than i tokens (the next ones
    accepted at `forecast` each, the i so far with probability `survive`) gain more expected tokens than its
    extra cost at rate rho? The same products and sums in the same order (cumprod, cumsum) in float64. c_d: a
    draft token's cost when not the cost model's own (a share of a batched position)."""
    n = survive.shape[0]
    top = len(c.c_t)
    if i + 1 >= top:
        return torch.zeros(n, dtype=torch.bool, device=survive.device)
    extra = _extra_costs(c, i, rho, c.c_d if c_d is None else c_d, survive.device)
    a = forecast.double()[:, None].expand(n, len(extra)).cumprod(1)
    gain = (survive.double()[:, None] * a).cumsum(1)
    return (gain > extra).any(1)


@functools.lru_cache(maxsize=512)
def _extra_costs(c: CostModel, i: int, rho: float, c_d: float, device: torch.device) -> torch.Tensor:
    """(top - i - 1,) float64: rho x what a window of j = i + 1 .. top - 1 tokens costs beyond one of i. Made once
    per cost model, position and rate (every draft position asks: the decision's cost is measured)."""
    top = len(c.c_t)
    base = i * c_d + c.c_t[min(i, top - 1)]
    return torch.tensor(
        [rho * (j * c_d + c.c_t[j] - base) for j in range(i + 1, top)], dtype=torch.float64, device=device
    )


@functools.lru_cache(maxsize=64)
def _as_tensor(values: tuple[float, ...], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64, device=device)


@functools.lru_cache(maxsize=8)
def _no_signals(device: torch.device) -> torch.Tensor:
    """TARGET_SIGNALS' values before any window (vLLM shows the proposer none), float32: made once per device, not
    copied there at every position."""
    return torch.tensor(NO_SIGNALS.values(), device=device)
