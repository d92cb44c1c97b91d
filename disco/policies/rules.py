"""The classifier's stopping rules on P(accept), each written once, in a scalar and a batched form.

A rule decides, from the model's P(accept) p of the token just drafted and S = prod(p_i) over the window
so far, whether to stop drafting; and, before a window, whether to draft at all. Its one parameter, the
rule's `setting`, is what `disco train` tunes (PolicySpec.classifier_setting, the CLI's
--classifier-setting, the manifest's "setting"): a probability for token and cumulative, a rate for the
cost rules.

    token          stop when p < t                                              (DISCO)
    cumulative     stop when P(at least one rejection in the window) = 1 - S > h (SpecDec++)
    cost           renewal-reward rule under the pair's cost model: with the next tokens forecast at the
                   current p, keep drafting while some longer window m gains more expected tokens than it
                   costs at rate rho = r / c_t(1):  S * sum_{l=1..m-i} p^l  >  rho * (cost(m) - cost(i)),
                   cost(m) = m * c_d + c_t(m + 1); before a window, draft at all only when a perfectly
                   accepted window of some length would pay at that rate (else: a target-only step).
                   r = 1 is target-only decoding's rate; the tuned r is the long-run rate to beat.
    cost-adaptive  the cost rule, but "draft at all" forecasts every token accepted at f, a running
                   estimate of per-token acceptance (accepted / judged tokens of recent windows, starting
                   at 1; each skipped round moves it a quarter of the way back to 1, so a prompt where
                   drafting stopped paying is probed again), and drafts when such a window beats
                   target-only decoding.

Each rule is an object of `RULES` with a scalar method (classifier.ClassifierPolicy: the live loop and the
simulator, Python floats) and a batched one (batch_policy.BatchClassifier: vLLM's draft, (B,) float64
tensors, one vectorised call); both do the same products and sums in the same order, so they decide
alike (tests/test_rules.py checks it on random rows). A new rule: a Rule subclass and an entry in RULES
(and its name in defaults.RULES, which the CLI's help lists without importing torch).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import overload

import torch

from disco.base.defaults import RULES as RULE_NAMES
from disco.base.errors import DiscoError
from disco.base.settings import UNIT, Range, at_least, check_setting
from disco.core.cost import CostModel

FORECAST_KEEP = 0.5  # cost-adaptive: weight of the old acceptance estimate after each window
FORECAST_RELAX = 0.25  # cost-adaptive: share of the way back to 1 the estimate moves per skipped round


# --- the cost-adaptive forecast: the same arithmetic on a float (one request) or a tensor (rows) -----------


@overload
def forecast_after(forecast: float, drafted: int, accepted: int) -> float: ...
@overload
def forecast_after(forecast: torch.Tensor, drafted: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor: ...
def forecast_after(forecast, drafted, accepted):
    """The running per-token acceptance after a verified window of `drafted` tokens, `accepted` of them
    (float64 for rows). Judged tokens: the accepted ones and the first rejected one."""
    judged = accepted + (accepted < drafted)
    return FORECAST_KEEP * forecast + (1 - FORECAST_KEEP) * accepted / judged


@overload
def forecast_relaxed(forecast: float) -> float: ...
@overload
def forecast_relaxed(forecast: torch.Tensor) -> torch.Tensor: ...
def forecast_relaxed(forecast):
    """The estimate after a skipped round: a share of the way back to 1 (the prompt is probed again)."""
    return forecast + (1.0 - forecast) * FORECAST_RELAX


# --- does a longer window pay? ---------------------------------------------------------------------------


def _extra(c: CostModel, base: float, j: int, rho: float, c_d: float) -> float:
    """rho x what a window of j tokens costs beyond `base` (one of i tokens: i * c_d + c_t(i + 1))."""
    return rho * (j * c_d + c.c_t[j] - base)


def _base(c: CostModel, i: int, c_d: float) -> float:
    return i * c_d + c.c_t[min(i, len(c.c_t) - 1)]


def pays(c: CostModel, i: int, survive: float, forecast: float, rho: float) -> bool:
    """Does some window longer than i tokens (the next tokens accepted at `forecast` each, the i so far with
    probability `survive`) gain more expected tokens than its extra cost at rate rho? (Stops at the first
    that does: this runs once per draft token in the live loop and the simulator.)"""
    base = _base(c, i, c.c_d)
    gain, a = 0.0, 1.0
    for m in range(i + 1, len(c.c_t)):
        a *= forecast
        gain += survive * a
        if gain > _extra(c, base, m, rho, c.c_d):
            return True
    return False


def pays_rows(
    c: CostModel, i: int, survive: torch.Tensor, forecast: torch.Tensor, rho: float, c_d: float | None = None
) -> torch.Tensor:
    """`pays` for every row, (B,) bool: the same products and sums in the same order (cumprod, cumsum) in
    float64. c_d: a draft token's cost when not the cost model's own (a share of a batched position)."""
    n = survive.shape[0]
    if i + 1 >= len(c.c_t):
        return torch.zeros(n, dtype=torch.bool, device=survive.device)
    extra = _extra_costs(c, i, rho, c.c_d if c_d is None else c_d, survive.device)
    a = forecast.double()[:, None].expand(n, len(extra)).cumprod(1)
    gain = (survive.double()[:, None] * a).cumsum(1)
    return (gain > extra).any(1)


@functools.lru_cache(maxsize=512)
def _extra_costs(c: CostModel, i: int, rho: float, c_d: float, device: torch.device) -> torch.Tensor:
    """(top - i - 1,) float64: `_extra` for j = i + 1 .. top - 1. Made once per cost model, position and rate
    (every draft position asks: the decision's cost is measured)."""
    base = _base(c, i, c_d)
    return torch.tensor(
        [_extra(c, base, j, rho, c_d) for j in range(i + 1, len(c.c_t))], dtype=torch.float64, device=device
    )


@functools.lru_cache(maxsize=64)
def _as_tensor(values: tuple[float, ...], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64, device=device)


@dataclass
class Pooled:
    """vLLM's batched draft (docs/architecture.md, "vLLM's own draft"): one more position is one batched forward
    whoever drafts in it, its cost shared by the requests still drafting (batch_policy.Batch.position_cost)."""

    position_cost: float  # one batched draft position
    verified: torch.Tensor  # 0-dim float64 on the device: the step's tokens so far (each drafted one is verified)


def pooled_pays(
    c: CostModel, pos: int, survive: torch.Tensor, p: torch.Tensor, rho: float, live: torch.Tensor, pooled: Pooled
) -> torch.Tensor:
    """The cost rules on vLLM's batched draft: the batch runs one more position while the expected tokens of
    the requests drafting on, summed, pay for it and for their verification; a request drafts on in it while
    its own next tokens pay their verification, the position being paid already. (B,) bool: drafts on.
    Tensor operations only (no host sync): the proposer's one sync per position decides."""
    pooled.verified = pooled.verified + live.sum()  # each token drafted this step is verified with it
    top = len(c.c_t)
    keep = live & pays_rows(c, pos, survive, p, rho, 0.0)
    if pos + 1 >= top:
        return torch.zeros_like(keep)
    m = torch.arange(1, top - pos, dtype=torch.float64, device=p.device)  # m more positions
    a = p.double()[:, None].expand(-1, len(m)).cumprod(1)
    gain = ((survive[:, None] * a).cumsum(1) * keep[:, None]).sum(0)  # (M,) the batch's tokens
    c_step = _as_tensor(c.c_step, p.device)
    last = len(c_step) - 1
    now = (pooled.verified.long() - 1).clamp(0, last)
    then = (pooled.verified.long() - 1 + keep.sum() * m.long()).clamp(0, last)
    extra = m * float(pooled.position_cost) + c_step[then] - c_step[now]  # seconds, the whole batch
    return keep & (gain > rho * extra).any()


# --- the rules -------------------------------------------------------------------------------------------


class Rule:
    """A stopping rule on P(accept). Scalar methods: one request, Python floats; `_rows` methods: (B,) float64
    tensors, one vectorised call. pos: the draft token's 1-based position in the window; p: its P(accept);
    survive: S, the product of P(accept) over the window so far, this token included."""

    name = ""
    setting_range: Range = UNIT  # the values its setting admits
    needs_cost = False  # decides with the pair's cost model (a disco profile)
    forecasts = False  # whether to draft at all reads each request's running acceptance (forecast)

    def check(self, setting: float | None, cost: CostModel | None | bool = True) -> None:
        """Refuse a setting outside this rule's range (None: not given yet) or, when `cost` is None, a
        missing cost model the rule needs."""
        check_setting("classifier_setting", setting, self.setting_range)
        if self.needs_cost and cost is None:
            raise DiscoError(f"the {self.name} rule needs the pair's cost model (a disco profile)")

    def stops(self, pos: int, p: float, survive: float, setting: float, cost: CostModel | None) -> bool:
        raise NotImplementedError

    def stops_rows(
        self,
        pos: int,
        p: torch.Tensor,
        survive: torch.Tensor,
        setting: float,
        cost: CostModel | None,
        live: torch.Tensor,
        pooled: Pooled | None = None,
    ) -> torch.Tensor:
        raise NotImplementedError

    def drafts(self, forecast: float, setting: float, cost: CostModel | None) -> bool:
        """Draft at all this round? (The caller relaxes the forecast where not: forecast_relaxed.)"""
        return True

    def drafts_rows(self, forecast: torch.Tensor, setting: float, cost: CostModel | None) -> torch.Tensor:
        """(B,) bool, on the host unless `forecasts` (then on the forecast's device)."""
        return torch.ones(forecast.shape[0], dtype=torch.bool)


class Token(Rule):
    name = "token"

    def stops(self, pos, p, survive, setting, cost):
        return p < setting

    def stops_rows(self, pos, p, survive, setting, cost, live, pooled=None):
        return p < setting


class Cumulative(Rule):
    name = "cumulative"

    def stops(self, pos, p, survive, setting, cost):
        return 1.0 - survive > setting

    def stops_rows(self, pos, p, survive, setting, cost, live, pooled=None):
        return 1.0 - survive > setting


def _costs(cost: CostModel | None) -> CostModel:
    assert cost is not None, "the cost rules need a cost model (Rule.check, when the policy is built)"
    return cost


class Cost(Rule):
    name = "cost"
    setting_range = at_least(0)  # a rate, in target-only decoding's tokens per c_t(1)
    needs_cost = True

    @staticmethod
    def rate(setting: float, cost: CostModel) -> float:
        return setting / cost.c_t[0]  # tokens per unit time to beat

    def stops(self, pos, p, survive, setting, cost):
        c = _costs(cost)
        return not pays(c, pos, survive, p, self.rate(setting, c))

    def stops_rows(self, pos, p, survive, setting, cost, live, pooled=None):
        c = _costs(cost)
        if pooled is None:  # a draft token costs c_d, whoever else drafts
            return ~pays_rows(c, pos, survive, p, self.rate(setting, c))
        return ~pooled_pays(c, pos, survive, p, self.rate(setting, c), live, pooled)

    def drafts(self, forecast, setting, cost):  # would a perfectly accepted window pay at the tuned rate?
        c = _costs(cost)
        return pays(c, 0, 1.0, 1.0, self.rate(setting, c))

    def drafts_rows(self, forecast, setting, cost):  # (the same answer for every request)
        c = _costs(cost)
        one = torch.ones_like(forecast, dtype=torch.float64)
        return pays_rows(c, 0, one, one, self.rate(setting, c))


class CostAdaptive(Cost):
    name = "cost-adaptive"
    forecasts = True

    def drafts(self, forecast, setting, cost):  # would a window accepted at the forecast beat target-only decoding?
        c = _costs(cost)
        return pays(c, 0, 1.0, forecast, 1.0 / c.c_t[0])

    def drafts_rows(self, forecast, setting, cost):
        c = _costs(cost)
        return pays_rows(c, 0, torch.ones_like(forecast, dtype=torch.float64), forecast, 1.0 / c.c_t[0])


RULES: dict[str, Rule] = {r.name: r for r in (Token(), Cumulative(), Cost(), CostAdaptive())}
assert tuple(RULES) == RULE_NAMES, "defaults.RULES lists the registry's keys, for --help"


def rule_named(name: str) -> Rule:
    """The rule called `name`, or a one-line refusal naming the rules there are."""
    try:
        return RULES[name]
    except (KeyError, TypeError):
        raise DiscoError(
            f"unknown classifier rule {name!r}: choose one of {', '.join(RULES)} (--classifier-rule)"
        ) from None
