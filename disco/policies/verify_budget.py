"""vLLM 0.32's draft budget (adaptive verification), re-implemented in torch, and disco's learned budget on the same
footing (issue 45; ../shared/serving-anchors.md, "Added 2026-12-03"). The batched policies that run them on vLLM's
draft: policies/adaptive_verification.py; the confidence vLLM budgets with: policies/acceptance_estimator.py.

vLLM 0.32 (V2 GPU model runner only; `vllm/v1/worker/gpu/spec_decode/adaptive_verification.py`): on the host, from
confidences one round stale (`record_confidences` keeps two D2H slots and reads the older, so no step waits on a
copy), `get_num_tokens` sorts the survival probabilities (running products of each request's per-position
confidences, float64) of every scheduled draft slot, and takes B* = argmax_n (sampling requests + sum of the n best
survivals) / (draft_cost[requests] + verify_cost[non-draft tokens + n]) from cost tables built from profiled curves
(`build_cost_tables_from_curves`). On the device `reallocate_drafts` / `_assign_draft_token_budget` admits the B*
globally best slots by the *current* confidences (topk of the float32 cumprod) and turns them into each request's
verified draft count. Every request drafts all num_speculative_steps positions: the drafter is not trimmed, only
verification is.

Where this re-implementation adapts (and why):
1. Cost tables. vLLM profiles two curves: the drafter's time of a whole step by request count and the target's
   forward by token count. disco's load profile has the target step by tokens in all, c_step(t) (the same curve),
   and ONE batched draft position by batch size, c_draft(b). vLLM's draft curve is therefore k * c_draft(b) (a
   step drafts k positions: the first pass and k - 1 more; cost.CostModel.c_draft); a profile without c_draft
   (the side engine's) gives k * b * c_d. Both curves then go through vLLM's own table builder (ported as is:
   running maximum, step function at the profiled points, linear extrapolation past the last one). disco's
   profiles are timed as they run, with no separate CUDA-graph capture limit, so `cudagraph_limit` is 0.
2. Sizes. vLLM builds tables up to max_num_reqs / max_num_batched_tokens and caps the budget by the sampler's
   logit chunk (`max_total_logits`); here the tables cover the batch asked about (cached by size) and the chunk
   cap is an optional argument (no cap by default).
3. Ties. vLLM's topk breaks ties in survival arbitrarily (only counts matter: a request verifies its first
   `count` drafts). Here ties go to the earlier position, then the lower batch index (a stable sort in
   position-major order), so the result is deterministic and every admitted set is a prefix of its request.
4. Staleness. `select` takes the budget's confidences separately (`budget_conf`): vLLM's are one round stale,
   disco's learned budget uses the fresh ones (disco's proposer returns ragged drafts to the host anyway, so
   nothing waits on a copy it would not wait on). The simulator replays vLLM's staleness for its estimator.
5. No host sync of its own: `draft_budget`, `admit` and `select` return device tensors. (vLLM syncs once per
   step, its budget being a Python int that sizes the batch.)

disco's learned budget (`LearnedBudget`): the same budget, with confidences from disco's classifier (calibrated
P(accept) of each position given the earlier ones accepted, as the oracle traces label it), and draft stopping:
after each draft position the batch's budget over the slots drafted so far gives the step's rate R (expected
tokens per second); a request stops drafting when its survival (an upper bound on any later slot's) no longer
pays the marginal verification of one more slot at R, and the batch stops when the requests drafting on could
not pay another position and their slots at R even if every later slot kept their survival. Then one budget
and one global admission for the whole batch, on the device.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from disco.base.errors import DiscoError
from disco.core.cost import CostModel
from disco.core.features import TOKEN_FEATURES
from disco.policies.batch_policy import Batch, BatchClassifier, RequestState, RowState

_P_CHOSEN = TOKEN_FEATURES.index("p_chosen")

# --- the budget (adaptive_verification.py) -------------------------------------------------------------


def build_cost_tables_from_curves(
    draft_curve: list[tuple[int, float]],
    verify_curve: list[tuple[int, float]],
    max_num_reqs: int,
    max_batch_tokens: int,
    cudagraph_limit: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """vLLM's `build_cost_tables_from_curves`, unchanged: draft_table[b] (b = 0 .. max_num_reqs) and
    verify_table[t] (t = 0 .. max_batch_tokens) from (size, cost) samples: the running maximum of the costs, a
    step function at the profiled sizes (execution pads to the next one), interpolated past the capture
    limit, extrapolated linearly past the last point; draft costs >= 0, verify costs >= 1e-6."""

    def build_table(limit: int, curve: list[tuple[int, float]]) -> np.ndarray:
        xs, ys = np.asarray(curve, dtype=np.float64).T
        ys = np.maximum.accumulate(ys)
        values = np.arange(limit + 1)
        idx = np.searchsorted(xs, values, side="left")
        result = ys[np.minimum(idx, len(xs) - 1)]
        if cudagraph_limit:
            smooth = values > cudagraph_limit
            above = xs > cudagraph_limit
            if smooth.any() and above.any():
                result[smooth] = np.interp(values[smooth], xs[above], ys[above])
        if len(xs) > 1:
            after = values > xs[-1]
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
            result[after] = ys[-1] + slope * (values[after] - xs[-1])
        return result

    draft_table = np.maximum(build_table(max_num_reqs, draft_curve), 0.0)
    verify_table = np.maximum(build_table(max_batch_tokens, verify_curve), 1e-6)
    return draft_table, verify_table


@dataclass(frozen=True, eq=False)
class CostTables:
    """vLLM's (draft_cost, verify_cost) tables: draft[b] = the drafter's whole step at b requests (k positions),
    verify[t] = one target step over t tokens in all. float64 on the host; `on(device)` as tensors."""

    draft: np.ndarray
    verify: np.ndarray

    @classmethod
    def from_cost(cls, cost: CostModel, k: int, max_num_reqs: int, max_batch_tokens: int) -> CostTables:
        """From disco's load profile (module docstring, adaptation 1): the draft curve k * c_draft(b) (or
        k * b * c_d without c_draft), the verify curve c_step(t), through vLLM's table builder."""
        return _tables(cost, k, max_num_reqs, max_batch_tokens)

    @functools.cached_property
    def _devices(self) -> dict:
        return {}

    def on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        key = str(device)
        if key not in self._devices:
            self._devices[key] = (
                torch.tensor(self.draft, dtype=torch.float64, device=device),
                torch.tensor(self.verify, dtype=torch.float64, device=device),
            )
        return self._devices[key]


@functools.lru_cache(maxsize=64)
def _tables(cost: CostModel, k: int, max_num_reqs: int, max_batch_tokens: int) -> CostTables:
    if not cost.c_step:
        raise DiscoError(f"the cost model ({cost.source}) has no load profile (c_step): profile with --engine vllm")
    verify_curve = [(t, c) for t, c in enumerate(cost.c_step, 1)]
    if cost.c_draft:
        draft_curve = [(b, k * c) for b, c in enumerate(cost.c_draft, 1)]
    else:  # each request drafts on its own: k tokens of c_d each
        draft_curve = [(b, k * b * cost.c_d) for b in range(1, max(2, len(cost.c_step)) + 1)]
    draft, verify = build_cost_tables_from_curves(draft_curve, verify_curve, max_num_reqs, max_batch_tokens)
    return CostTables(draft, verify)


def tables_for(cost: CostModel | CostTables, k: int, batch: int) -> CostTables:
    """Tables covering a step of `batch` requests verifying up to k drafts each (sizes rounded up to powers of
    two, so a few cover every step)."""
    if isinstance(cost, CostTables):
        if len(cost.draft) <= batch or len(cost.verify) <= batch * (k + 1):
            raise DiscoError(f"the cost tables cover {len(cost.draft) - 1} requests, not a step of {batch} x {k + 1}")
        return cost
    reqs = 1 << max(batch, 1).bit_length()
    tokens = 1 << max(reqs * (k + 1), len(cost.c_step)).bit_length()
    return _tables(cost, k, reqs, tokens)


def extrapolated(load: CostModel, max_batch: int, k: int) -> CostModel:
    """The load profile stretched to `max_batch` requests verifying k drafts each, the way vLLM stretches its
    profiled curves (build_cost_tables_from_curves: the running maximum, then a straight line past the last
    profiled point through the last two): c_step to max_batch x (k + 1) tokens, c_draft to max_batch requests
    (without c_draft: none). For simulating more requests than were profiled (the simulators clamp at the
    profile's last entry)."""
    if not load.c_step:
        raise DiscoError(f"the cost model ({load.source}) has no load profile (c_step): profile with --engine vllm")
    tokens = max(max_batch * (k + 1), len(load.c_step))
    draft_curve = list(enumerate(load.c_draft, 1)) or [(1, 0.0)]
    draft, verify = build_cost_tables_from_curves(
        draft_curve, list(enumerate(load.c_step, 1)), max(max_batch, len(load.c_draft)), tokens
    )
    c_draft = tuple(float(c) for c in draft[1:]) if load.c_draft else ()
    source = f"{load.source}, extrapolated to {max_batch} requests x {k + 1} tokens"
    return CostModel(load.c_d, load.c_t, source, tuple(float(c) for c in verify[1:]), c_draft)


def survival(conf: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(B, K) running products of each request's per-position confidences."""
    return conf.to(dtype).cumprod(1)


def _valid(capacities: torch.Tensor | None, B: int, K: int, device: torch.device) -> torch.Tensor:
    steps = torch.arange(K, device=device)
    if capacities is None:
        return torch.ones(B, K, dtype=torch.bool, device=device)
    return steps[None, :] < capacities.to(device)[:, None]


def budget_curve(
    budget_conf: torch.Tensor,
    cost: CostModel | CostTables,
    capacities: torch.Tensor | None = None,
    *,
    k: int | None = None,
    num_non_draft: int | None = None,
    num_sampling: int | torch.Tensor | None = None,
    draft_cost: torch.Tensor | float | None = None,
    max_draft_budget: int | None = None,
) -> torch.Tensor:
    """(B K + 1,) float64: vLLM's `num_tokens_to_estimated_accepted_tokens / costs` of `get_num_tokens` for
    n = 0 .. B K drafts verified (-inf past the largest budget allowed): expected tokens num_sampling + (the n
    best survivals, float64 cumprod of the confidences), over draft_cost[B] + verify_cost[num_non_draft + n].
    Defaults: every request samples and contributes one non-draft token (decoding); the draft cost is the
    table's whole step of k positions (`draft_cost` overrides it, in the tables' units)."""
    B, K = budget_conf.shape
    device = budget_conf.device
    k = K if k is None else k
    draft_t, verify_t = tables_for(cost, k, B).on(device)
    nd = B if num_non_draft is None else num_non_draft
    valid = _valid(capacities, B, K, device)
    surv = survival(budget_conf, torch.float64).masked_fill(~valid, -math.inf)
    scores = surv.flatten().sort(descending=True).values
    scores = torch.where(torch.isfinite(scores), scores, torch.zeros_like(scores))
    sampling = B if num_sampling is None else num_sampling
    expected = torch.cat([scores.new_zeros(1), scores.cumsum(0)]) + sampling
    n = torch.arange(B * K + 1, device=device)
    d = draft_t[B] if draft_cost is None else draft_cost
    costs = d + verify_t[(nd + n).clamp_max(len(verify_t) - 1)]
    most = valid.sum()
    if max_draft_budget is not None:
        most = most.clamp_max(max_draft_budget)
    return torch.where(n <= most, expected / costs, torch.full_like(costs, -math.inf))


def draft_budget(budget_conf: torch.Tensor, cost: CostModel | CostTables, capacities=None, **kw) -> torch.Tensor:
    """B* = the first argmax of `budget_curve` (np.argmax's rule): a 0-d long tensor on the device."""
    return budget_curve(budget_conf, cost, capacities, **kw).argmax()


def admit(conf: torch.Tensor, budget: torch.Tensor | int, capacities: torch.Tensor | None = None) -> torch.Tensor:
    """`_assign_draft_token_budget`: (B,) long, each request's admitted draft count: the `budget` slots of
    highest survival (float32 cumprod of the current confidences) among each request's first capacities[i]
    positions; ties to the earlier position, then the lower batch index (adaptation 3)."""
    B, K = conf.shape
    valid = _valid(capacities, B, K, conf.device)
    surv = survival(conf).masked_fill(~valid, -math.inf)
    order = surv.t().flatten().sort(descending=True, stable=True).indices  # position-major: pos * B + request
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=conf.device)
    admitted = (rank < budget).view(K, B).t() & valid
    return admitted.sum(1)


def select(
    conf: torch.Tensor,
    cost: CostModel | CostTables,
    capacities: torch.Tensor | None = None,
    *,
    budget_conf: torch.Tensor | None = None,
    **kw,
) -> torch.Tensor:
    """(B,) long: each request's verified draft count for a step whose requests drafted (B, K) with these
    confidences: B* from `budget_conf` (vLLM's are one round stale; default `conf`), then the B* best slots by
    `conf`. Device tensors only."""
    b = draft_budget(conf if budget_conf is None else budget_conf, cost, capacities, **kw)
    return admit(conf, b, capacities)


# --- disco's learned budget ---------------------------------------------------------------------------


class ClassifierConfidence:
    """disco's classifier as the budget's estimator: calibrated P(accept) of each drafted token given the earlier
    ones accepted, from its full feature vector (token features + the window features vLLM's proposer can
    compute: batch_policy.BatchClassifier.window_features, so the features are those the batched policy reads).

    predict: (B, F) float32 -> (B,) calibrated P(accept) (an artifact's `torch_predictor`, or `predict_proba`
    wrapped)."""

    def __init__(self, predict: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self._clf = BatchClassifier(predict, "token", 0.0, None)

    def start(self, batch: Batch | list[RequestState], device: torch.device) -> None:
        """A new window for every request of the batch (a Batch with rows: their fields on the device)."""
        self._clf.start(batch if isinstance(batch, Batch) else Batch(batch), device)

    def __call__(self, pos: int, feats: torch.Tensor) -> torch.Tensor:
        full = torch.cat([feats, self._clf.window_features(pos, feats[:, _P_CHOSEN])], 1)
        return self._clf.predict(full).float()

    def update(self, state: RequestState | RowState, drafted: int | torch.Tensor, accepted: int | torch.Tensor) -> None:
        self._clf.update(state, drafted, accepted)


class LearnedBudget:
    """disco's learned budget with draft stopping, for one step of B requests drafting up to k positions:

        start(capacities)                      each request's slots this step (k, or fewer near its end)
        live = after_position(pos, p_accept)   after draft position pos (1-based): (B,) bool, drafting on
        counts = select()                      (B,) long: each request's verified drafts

    After each position, the budget (vLLM's rule, `budget_curve`) over the slots drafted so far, at the draft
    cost paid so far (pos positions of c_draft(B)), gives the step's best rate R and budget B*. A request drafts
    on while its survival s (>= any later slot's) pays one more verified slot at R: s > R (V[B + B* + 1] -
    V[B + B*]); the batch drafts on while, for some m more positions, m times the survivals of the requests
    drafting on pay m positions and their verification at R (an upper bound on what they can add: past it no
    slot could raise the step's rate). stop_drafting=False drafts every request to its capacity (vLLM's way,
    with disco's confidences). Tensor operations only: the caller's one host sync per position (whether any
    request drafts on) decides."""

    def __init__(self, cost: CostModel | CostTables, k: int, stop_drafting: bool = True) -> None:
        if isinstance(cost, CostModel) and not cost.c_step:  # (CostTables: given as vLLM's tables, loop_budget.py)
            raise DiscoError(f"the learned budget needs a load profile (c_step): {cost.source} has none")
        self.cost, self.k, self.stop_drafting = cost, k, stop_drafting

    def start(self, capacities: torch.Tensor) -> None:
        B, dev = capacities.shape[0], capacities.device
        self.B, self.capacities = B, capacities.long()
        self.tables = tables_for(self.cost, self.k, B)
        self.position = float(self.tables.draft[B]) / self.k  # one position: vLLM's table, per position
        self.conf = torch.ones(B, self.k, dtype=torch.float32, device=dev)
        self.drafted = torch.zeros(B, dtype=torch.long, device=dev)
        self.live = self.capacities > 0
        self.surv = torch.ones(B, dtype=torch.float64, device=dev)
        self.positions = 0

    def after_position(self, pos: int, p_accept: torch.Tensor) -> torch.Tensor:
        self.positions = pos
        live = self.live
        self.conf[:, pos - 1] = torch.where(live, p_accept.float(), self.conf[:, pos - 1])
        self.drafted = torch.where(live, torch.full_like(self.drafted, pos), self.drafted)
        self.surv = torch.where(live, self.surv * p_accept.double(), self.surv)
        more = live & (self.capacities > pos)
        if pos >= self.k:
            self.live = torch.zeros_like(live)
            return self.live
        if not self.stop_drafting:
            self.live = more
            return more
        B = self.B
        draft_t, verify_t = self.tables.on(self.conf.device)
        curve = budget_curve(self.conf, self.tables, self.drafted, k=self.k, draft_cost=pos * self.position)
        best = curve.argmax()
        rate = curve[best]
        now = B + best
        last = len(verify_t) - 1
        marginal = verify_t[(now + 1).clamp_max(last)] - verify_t[now]
        keep = more & (self.surv > rate * marginal)
        m = torch.arange(1, self.k - pos + 1, device=self.conf.device)
        gain = m * (self.surv * keep).sum()
        extra = m * self.position + verify_t[(now + m * keep.sum()).clamp_max(last)] - verify_t[now]
        self.live = keep & (gain > rate * extra).any()
        return self.live

    def select(self, budget_conf: torch.Tensor | None = None) -> torch.Tensor:
        """One budget and one admission for the whole batch over the slots drafted (draft cost: the positions
        run). budget_conf: the budget's confidences when not the current ones (vLLM's, one round stale: each
        request's of its previous step, adaptation 4); the slots are admitted by the current ones."""
        conf = self.conf if budget_conf is None else budget_conf
        draft_cost = max(self.positions, 1) * self.position
        b = draft_budget(conf, self.tables, self.drafted, k=self.k, draft_cost=draft_cost)
        return admit(self.conf, b, self.drafted)
