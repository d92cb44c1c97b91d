"""vLLM 0.32's adaptive verification, re-implemented in torch, and disco's learned budget on the same footing
(issue 45; ../shared/serving-anchors.md, "Added 2026-12-03").

vLLM 0.32 (V2 GPU model runner only; sources read from the 0.32 wheel, `vllm/v1/worker/gpu/spec_decode/`):

- `acceptance_estimator.py`, `OnlineAcceptanceEstimator` (PR #52228): per (request, draft position k) the
  feature f = logit(q*), q* the draft's top-1 probability after temperature (`_predict_kernel`: computed from the
  logits as -log sum_{z != m*} exp(z - m*), clamped to +-40), and P(accept) = sigmoid(w f + b_k): one slope shared
  by every position, one intercept per position; cold start w = 0.5, b_k = -0.2. After each verification
  (`step`) the judged drafts (the accepted ones and the first rejected one, if admitted) are folded into Newton-IRLS
  statistics with the *predictions made at draft time* (`_accumulate_kernel`); every REFIT_INTERVAL = 100 steps
  one damped, ridged Newton step is solved in closed form on the arrowhead system (`_refit_kernel`), and the
  statistics are cleared. `OnlineAcceptanceEstimator` below mirrors this, operation for operation, in float32.
- `adaptive_verification.py`: the budget. On the host, from confidences one round stale (`record_confidences`
  keeps two D2H slots and reads the older, so no step waits on a copy), `get_num_tokens` sorts the survival
  probabilities (running products of each request's per-position confidences, float64) of every scheduled
  draft slot, and takes B* = argmax_n (sampling requests + sum of the n best survivals) / (draft_cost[requests] +
  verify_cost[non-draft tokens + n]) from cost tables built from profiled curves
  (`build_cost_tables_from_curves`). On the device `reallocate_drafts` / `_assign_draft_token_budget` admits the
  B* globally best slots by the *current* confidences (topk of the float32 cumprod) and turns them into each
  request's verified draft count. Every request drafts all num_speculative_steps positions: the drafter is not
  trimmed, only verification is.

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
5. State. vLLM keeps features and predictions in slots keyed by the persistent request-state index
   (`idx_mapping`); so does the estimator here (`idx_mapping` optional: the batch order is the slot).
6. Inputs. Traces hold q* (p_top1, float32), not logits: `log_odds` of it, clamped at +-40 as vLLM clamps; a
   q* that rounded to 1 reads +40 where vLLM's logits would give its exact log-odds (> 16.6).
   `log_odds_from_logits` is the kernel's formula for a proposer holding the logits.
7. No host sync of its own: `draft_budget`, `admit` and `select` return device tensors. (vLLM syncs once per
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

# --- the online acceptance estimator (acceptance_estimator.py) ---------------------------------------------

MAX_LOG_ODDS = 40.0  # acceptance_estimator._MAX_LOG_ODDS
INIT_SLOPE = 0.5  # acceptance_estimator._INIT_SLOPE
INIT_BIAS = -0.2  # acceptance_estimator._INIT_BIAS


def log_odds(p_top1: torch.Tensor) -> torch.Tensor:
    """The estimator's feature from the draft's top-1 probability: log(q / (1 - q)), clamped at +-MAX_LOG_ODDS
    (`_predict_kernel`'s clamp; a q of exactly 1 reads +40). float32, as vLLM's features buffer."""
    q = p_top1.to(torch.float64)
    f = torch.log(q) - torch.log1p(-q)
    return f.nan_to_num(nan=0.0, posinf=MAX_LOG_ODDS, neginf=-MAX_LOG_ODDS).clamp(-MAX_LOG_ODDS, MAX_LOG_ODDS).float()


def log_odds_from_logits(logits: torch.Tensor, temperature: torch.Tensor | None = None) -> torch.Tensor:
    """`_local_max_sumexp_kernel` + `_predict_kernel`'s feature of each row of draft logits (N, V): the logits
    divided by the request's temperature (a temperature <= 0 drafts greedily and leaves them alone), then
    logit(q(m*)) = -log(sum_{z != m*} exp(z - m*)) (the complement sum clamped at 0), clamped at +-40."""
    x = logits.float()
    if temperature is not None:
        t = temperature.float()
        x = x / torch.where(t > 0, t, torch.ones_like(t))[:, None]
    m = x.amax(1, keepdim=True)
    complement = ((x - m).exp().sum(1) - 1.0).clamp_min(0.0)
    return (-torch.log(complement)).clamp(-MAX_LOG_ODDS, MAX_LOG_ODDS)


class OnlineAcceptanceEstimator:
    """vLLM 0.32's `OnlineAcceptanceEstimator` (acceptance_estimator.py), in torch on any device.

    Per step, as vLLM's runner drives it (`speculator.py`: `sample_draft` -> `_maybe_predict_acceptance`; after
    verification `observe_verification` -> `step`, which must run before the next propose):
      predict(p_top1)                     the drafts' confidences (B, K) or one position (B,) with `step`
      step(num_accepted, num_admitted)    fold the verdict in; every REFIT_INTERVAL calls, refit()
    (`step_sampled(num_sampled, num_rejected)` takes vLLM's own sampler counts.)
    """

    REFIT_INTERVAL = 100  # OnlineAcceptanceEstimator.REFIT_INTERVAL
    DAMPING_OBSERVATIONS = 50.0  # OnlineAcceptanceEstimator.DAMPING_OBSERVATIONS
    L2 = 1e-3  # OnlineAcceptanceEstimator.L2

    def __init__(self, num_speculative_steps: int, max_num_reqs: int = 256, device: torch.device | None = None):
        if num_speculative_steps < 1:
            raise DiscoError("the acceptance estimator needs at least one draft position")
        K, dev = num_speculative_steps, torch.device("cpu") if device is None else torch.device(device)
        self.num_speculative_steps, self.device = K, dev
        self._steps_since_refit = 0
        self.refits = 0
        self.converged = False  # (fit: whether the last refit moved nothing)
        self.slope = torch.full((1,), INIT_SLOPE, dtype=torch.float32, device=dev)
        self.intercepts = torch.full((K,), INIT_BIAS, dtype=torch.float32, device=dev)
        # stable slots keyed by the persistent request index (vLLM's req_state_idx)
        self.features = torch.zeros(max_num_reqs, K, dtype=torch.float32, device=dev)
        self.predictions = torch.zeros(max_num_reqs, K, dtype=torch.float32, device=dev)
        # per-round Newton-IRLS statistics: info[k] = (a_k, b_k, c_k), grad[k] = (g0_k, g1_k), counts[k]
        self.info = torch.zeros(K, 3, dtype=torch.float32, device=dev)
        self.grad = torch.zeros(K, 2, dtype=torch.float32, device=dev)
        self.counts = torch.zeros(K, dtype=torch.float32, device=dev)

    def _slots(self, idx_mapping: torch.Tensor | None, n: int) -> torch.Tensor:
        if idx_mapping is None:
            idx_mapping, need = torch.arange(n, device=self.device), n
        else:  # a host tensor's largest slot is known without a sync; a device one must fit max_num_reqs
            need = int(idx_mapping.max()) + 1 if n and idx_mapping.device.type == "cpu" else 0
        if need > self.features.shape[0]:  # (vLLM sizes these by max_num_reqs; grown here, on the host)
            grow = need - self.features.shape[0]
            pad = torch.zeros(grow, self.num_speculative_steps, dtype=torch.float32, device=self.device)
            self.features, self.predictions = torch.cat([self.features, pad]), torch.cat([self.predictions, pad])
        return idx_mapping.to(self.device, torch.long)

    def reserve(self, slots: int) -> None:
        """Room for slots 0 .. slots - 1 (vLLM sizes its buffers by max_num_reqs once; a caller that hands device
        idx_mappings grows them here first, on the host)."""
        self._slots(torch.tensor([slots - 1]), 1 if slots > 0 else 0)

    def confidence(self, feature: torch.Tensor, step: torch.Tensor | int | slice) -> torch.Tensor:
        """sigmoid(w f + b_step) with the current coefficients (`_predict_kernel`)."""
        return torch.sigmoid(self.slope * feature + self.intercepts[step])

    def predict(
        self, p_top1: torch.Tensor, step: int | None = None, idx_mapping: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The drafts' confidences from their top-1 probabilities: (B, K') for positions 0 .. K' - 1 at once, or
        (B,) for position `step` (0-based) as vLLM's draft loop asks after each position. Stores the features
        and predictions in the requests' slots (idx_mapping; default: the batch order), for `step`."""
        return self.predict_features(log_odds(p_top1.to(self.device)), step, idx_mapping)

    def predict_logits(
        self,
        logits: torch.Tensor,
        step: int,
        idx_mapping: torch.Tensor | None = None,
        temperature: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`predict` from one position's draft logits (B, V), as vLLM's `predict` takes them."""
        return self.predict_features(log_odds_from_logits(logits, temperature), step, idx_mapping)

    def predict_features(
        self, feature: torch.Tensor, step: int | None = None, idx_mapping: torch.Tensor | None = None
    ) -> torch.Tensor:
        feature = feature.to(self.device, torch.float32)
        slots = self._slots(idx_mapping, feature.shape[0])
        if step is None:
            cols = slice(0, feature.shape[1])
            prob = self.confidence(feature, cols)
            self.features[slots, cols], self.predictions[slots, cols] = feature, prob
        else:
            prob = self.confidence(feature, step)
            self.features[slots, step], self.predictions[slots, step] = feature, prob
        return prob

    def observe(
        self, num_accepted: torch.Tensor, num_admitted: torch.Tensor, idx_mapping: torch.Tensor | None = None
    ) -> None:
        """Fold one verification into the statistics (`_accumulate_kernel`), with the features and predictions
        stored when the drafts were made: per position k < K, a request's draft there is judged when k <=
        accepted and k < admitted (the accepted ones and the first rejected one), labelled 1 when k < accepted."""
        acc = num_accepted.to(self.device, torch.long)
        slots = self._slots(idx_mapping, acc.shape[0])
        adm = num_admitted.to(self.device, torch.long)
        k = torch.arange(self.num_speculative_steps, device=self.device)
        observed = (k[None, :] <= acc[:, None]) & (k[None, :] < adm[:, None])
        label = (k[None, :] < acc[:, None]).float()
        self.accumulate(self.features[slots], self.predictions[slots], label, observed)

    def accumulate(self, feature: torch.Tensor, pred: torch.Tensor, label: torch.Tensor, observed: torch.Tensor):
        """(B, K) judged drafts into the per-position sums: a_k = sum w f^2, b_k = sum w f, c_k = sum w,
        g0_k = sum r f, g1_k = sum r, counts_k, with w = p (1 - p), r = y - p over the observed ones."""
        w = torch.where(observed, pred * (1.0 - pred), 0.0)
        resid = torch.where(observed, label - pred, 0.0)
        f = torch.where(observed, feature, 0.0)
        self.info += torch.stack([(w * f * f).sum(0), (w * f).sum(0), w.sum(0)], 1)
        self.grad += torch.stack([(resid * f).sum(0), resid.sum(0)], 1)
        self.counts += observed.float().sum(0)

    def step(
        self, num_accepted: torch.Tensor, num_admitted: torch.Tensor, idx_mapping: torch.Tensor | None = None
    ) -> bool:
        """`OnlineAcceptanceEstimator.step`: observe, and refit every REFIT_INTERVAL calls. True: it refitted."""
        self.observe(num_accepted, num_admitted, idx_mapping)
        self._steps_since_refit += 1
        if self._steps_since_refit < self.REFIT_INTERVAL:
            return False
        self._steps_since_refit = 0
        self.refit()
        return True

    def step_sampled(
        self, num_sampled: torch.Tensor, num_rejected: torch.Tensor, idx_mapping: torch.Tensor | None = None
    ) -> bool:
        """`step` from vLLM's sampler counts: accepted = max(num_sampled - 1, 0) (the bonus token subtracted),
        admitted = accepted + num_rejected (`_accumulate_kernel`)."""
        acc = (num_sampled.long() - 1).clamp_min(0)
        return self.step(acc, acc + num_rejected.long(), idx_mapping)

    def refit(self) -> None:
        """`_refit_kernel`: one Newton step on (X^T W X + L2 I) d = X^T (y - p) for theta = [w, b_0 .. b_K-1],
        solved on its arrowhead; the slope's step damped by N / (N + 50) (N: the round's judged drafts) and
        dropped if NaN or if it would make the slope negative; each intercept's step, taken with the damped
        slope step, damped by n_k / (n_k + 50) and dropped if NaN. Then the statistics are cleared."""
        a_k, b_k, c_k = self.info[:, 0], self.info[:, 1], self.info[:, 2] + self.L2
        a = a_k.sum() + self.L2
        g0, g1_k, n = self.grad[:, 0].sum(), self.grad[:, 1], self.counts
        w = self.slope[0]
        shrink = b_k * b_k / c_k
        coupling = b_k * g1_k / c_k
        step_w = (g0 - coupling.sum()) / (a - shrink.sum())
        total_n = n.sum()
        step_w = step_w * (total_n / (total_n + self.DAMPING_OBSERVATIONS))
        step_w = torch.where((step_w == step_w) & (w + step_w >= 0.0), step_w, torch.zeros_like(step_w))
        step_bias = (g1_k - b_k * step_w) / c_k
        step_bias = step_bias * (n / (n + self.DAMPING_OBSERVATIONS))
        step_bias = torch.where(step_bias == step_bias, step_bias, torch.zeros_like(step_bias))
        self.slope[0] = w + step_w
        self.intercepts += step_bias
        self.info.zero_()
        self.grad.zero_()
        self.counts.zero_()
        self.refits += 1

    def fit(self, feature: torch.Tensor, step: torch.Tensor, label: torch.Tensor, max_refits: int = 200) -> int:
        """Fit to a fixed set of judged drafts (feature, 0-based position, label; each a row) by the estimator's
        own refit, repeated to its fixed point: each round accumulates every row with the current predictions
        and refits once (as serving would, were the same traffic replayed every REFIT_INTERVAL steps). The fixed
        point is the unpenalised maximum-likelihood fit of sigmoid(w f + b_k) (the ridge enters only the
        Newton matrix), unless the slope would be negative; a position whose rows are all of one class has
        none (its intercept drifts on until max_refits). Returns the rounds run; `converged` says whether the
        last refit moved no coefficient by 1e-6 or more."""
        K = self.num_speculative_steps
        keep = (step >= 0) & (step < K)
        f = feature[keep].to(self.device, torch.float32)
        k = step[keep].to(self.device, torch.long)
        y = label[keep].to(self.device, torch.float32)
        onehot = torch.nn.functional.one_hot(k, K).bool()
        for rounds in range(1, max_refits + 1):
            before = torch.cat([self.slope, self.intercepts])
            pred = self.confidence(f, k)
            self.accumulate(f[:, None].expand(-1, K), pred[:, None].expand(-1, K), y[:, None].expand(-1, K), onehot)
            self.refit()
            self.converged = float((torch.cat([self.slope, self.intercepts]) - before).abs().max()) < 1e-6
            if self.converged:
                return rounds
        return max_refits


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
