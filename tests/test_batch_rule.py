"""The cost rules on vLLM's batched draft (batch_policy.BatchClassifier._pooled) and the lockstep simulation of
vLLM's draft loop (simulate.simulate_batched): one position is one batched forward whoever drafts in it, so the
batch runs it while its requests' summed gains pay for it; alone, the rule is the sequential cost rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from disco.base.errors import DiscoError
from disco.core.cost import CostModel
from disco.core.features import TOKEN_FEATURES
from disco.policies.batch_policy import (
    Batch,
    BatchClassifier,
    BatchConstant,
    BatchTarget,
    RequestState,
    RowState,
    never_drafts,
)
from disco.policies.classifier import ClassifierPolicy
from disco.training.simulate import PromptTrace, simulate_batched

P = TOKEN_FEATURES.index("p_chosen")
# a memory-bound stub profile: steps of up to 16 tokens cost the same, wider ones 5 % more a token
C_STEP = tuple(1.0 if t <= 16 else 1.0 + 0.05 * (t - 16) for t in range(1, 8 * 9 + 1))


def _load(position: float) -> CostModel:
    return CostModel(position, C_STEP[:9], "stub", C_STEP, (position,) * 8)


def _windows(p_rows: list[float], position: float, setting: float = 1.0, k_max: int = 8) -> list[int]:
    """Each request's window in one batched step when the model says p_rows[i] for every token of request i."""
    n, load = len(p_rows), _load(position)
    probs = torch.tensor(p_rows, dtype=torch.float64)
    policy = BatchClassifier(lambda x: probs, "cost", setting, load)
    batch = Batch([RequestState(str(i)) for i in range(n)], load.at_load(n, k_max), position)
    live = policy.drafts(batch)
    policy.start(batch, torch.device("cpu"))
    drafted, pos = torch.zeros(n, dtype=torch.long), 0
    while bool(live.any()) and pos < k_max:
        pos += 1
        feats = torch.full((n, len(TOKEN_FEATURES)), 0.5)
        stop = policy.stops(pos, feats, probs.float(), live)
        drafted = torch.where(live, pos, drafted)
        live = live & ~stop
    return drafted.tolist()


class _Sure:
    def __init__(self, p: float) -> None:
        self.p = p

    def predict_proba(self, X):
        return np.full(len(X), self.p)


@pytest.mark.parametrize("p", [0.3, 0.6, 0.8, 0.9, 0.97])
@pytest.mark.parametrize("position", [0.05, 0.2, 0.4])
def test_one_request_alone_is_the_sequential_cost_rule(p, position):
    """At batch size 1 the pooled rule is ClassifierPolicy's cost rule with c_d = the position's cost."""
    load = _load(position)
    seq = ClassifierPolicy(_Sure(p), 1.0, rule="cost", cost=load.at_load(1, 8))
    n = 0
    if seq.drafts():
        seq.start()
        while n < 8:
            n += 1
            if seq.stops(p):
                break
    assert _windows([p], position) == [n]


def test_a_position_paid_by_the_batch_carries_the_less_sure_requests():
    """A request whose gains would not pay a position on their own drafts on while a sure one keeps the batch's
    position running (its verification is almost free here), and stops with it."""
    alone = _windows([0.55] * 4, 0.4)
    assert alone == [1, 1, 1, 1]  # none of them pays one more batched position
    mixed = _windows([0.97, 0.55, 0.55, 0.55], 0.4)
    assert mixed[0] > 1 and mixed[1:] == [mixed[0]] * 3


def test_a_dearer_position_ends_the_batch_sooner():
    cheap, dear = _windows([0.8] * 4, 0.05), _windows([0.8] * 4, 0.8)
    assert cheap[0] > dear[0] >= 1


def test_verification_past_the_flat_region_stops_the_unsure():
    """Wide steps cost more: a request whose gain does not pay its verification token stops though the
    position runs for the others."""
    got = _windows([0.99] * 7 + [0.06], 0.01, k_max=8)
    assert got[-1] < got[0]


def _trace(labels: list[bool], p: float = 0.9) -> PromptTrace:
    n = len(labels)
    feats = torch.full((n, len(TOKEN_FEATURES)), p)
    return PromptTrace("x", np.array(labels), [1] * n, [1] * n, feats, n)


def test_simulate_batched_counts_a_constant_window_exactly():
    """Two prompts (5 and 3 tokens, every draft accepted) at batch 2, k=2: step 1 drafts 2 for both (6 tokens
    verified, 2 positions at batch 2); the 3-token prompt is done; step 2 has room for one draft (1 position at
    batch 1, 2 tokens verified)."""
    c_step = tuple(0.1 * t for t in range(1, 20))
    load = CostModel(0.5, c_step[:3], "stub", c_step, (0.5, 0.7))
    run = simulate_batched([_trace([True] * 5), _trace([True] * 3)], BatchConstant(2), load, 2, 4)
    assert (run.tokens, run.steps, run.positions, run.drafted, run.accepted) == (8, 2, 3, 5, 5)
    assert run.seconds == pytest.approx(2 * 0.7 + c_step[5] + 1 * 0.5 + c_step[1])
    target = simulate_batched([_trace([True] * 5), _trace([True] * 3)], None, load, 2, 4)
    assert (target.tokens, target.steps, target.positions) == (8, 5, 0)
    assert target.seconds == pytest.approx(3 * c_step[1] + 2 * c_step[0])


def test_simulate_batched_accepts_the_leading_run():
    c_step = tuple(0.1 * t for t in range(1, 40))
    load = CostModel(0.5, c_step[:5], "stub", c_step, (0.5,))
    run = simulate_batched([_trace([True, False, True, True, True, True])], BatchConstant(3), load, 1, 4)
    # step 1: drafts 3, accepts 1 (+1) -> out 2; step 2: drafts 3 (room 3), accepts 3 (+1) -> out 6
    assert (run.tokens, run.steps, run.drafted, run.accepted) == (6, 2, 6, 4)


def test_simulate_batched_needs_a_batched_profile():
    with pytest.raises(DiscoError, match="no batched costs"):
        simulate_batched([_trace([True])], None, CostModel(0.1, (1.0,)), 1)


def test_simulate_batched_charges_no_draft_pass_to_a_policy_that_never_drafts():
    """The target policy, and the cost rule where a step costs its tokens (no window pays even fully accepted),
    run as target-only: vLLM's draft loop is skipped (vllm/draft.py), its catch-up pass too, so the
    simulation charges no draft position; the cost rule where verification is cheap drafts and pays them."""
    traces = [_trace([True] * 6), _trace([True] * 4), _trace([True] * 5)]
    compute_bound = CostModel(0.75, (1.0, 2.0), "stub", tuple(1.0 * t for t in range(1, 80)), (0.75, 1.3, 1.9))
    target = simulate_batched(traces, None, compute_bound, 2, 4)
    for policy in (BatchTarget(), BatchClassifier(lambda x: torch.ones(len(x)), "cost", 1.0, compute_bound)):
        assert never_drafts(policy, compute_bound, 2, 4)
        run = simulate_batched(traces, policy, compute_bound, 2, 4)
        assert (run.seconds, run.steps, run.positions, run.drafted) == (target.seconds, target.steps, 0, 0)
    cheap = _load(0.05)
    drafts = BatchClassifier(lambda x: torch.full((len(x),), 0.99, dtype=torch.float64), "cost", 1.0, cheap)
    assert not never_drafts(drafts, cheap, 2, 4)
    run = simulate_batched(traces, drafts, cheap, 2, 4)
    assert run.drafted > 0 and run.positions > 0


@pytest.mark.parametrize("on_rows", [False, True], ids=["states", "rows"])
@pytest.mark.parametrize(
    "rule, setting", [("token", 0.55), ("cumulative", 0.6), ("cost", 1.0), ("cost", 1.8), ("cost-adaptive", 1.0)]
)
def test_the_batched_classifier_decides_as_the_scalar_one_for_every_request(rule, setting, on_rows):
    """BatchClassifier (one call for all rows) and one ClassifierPolicy per request, fed the same P(accept)s and the
    same verification outcomes over several windows, draft, stop and update alike (rules.py's one dispatch)."""
    rng = np.random.default_rng(3)
    n, k_max, cost = 64, 8, CostModel(0.25, tuple(1.0 + 0.15 * k for k in range(9)))
    p = torch.tensor(rng.uniform(0.2, 1.0, (6, k_max, n)))  # window, position, request
    batched = BatchClassifier(lambda x: p[w, pos - 1], rule, setting, cost)
    scalar = [ClassifierPolicy(_Sure(0.5), setting, rule=rule, cost=cost) for _ in range(n)]
    states = [RequestState(str(i)) for i in range(n)]
    rows = RowState.fresh(n, "cpu") if on_rows else None
    windows = []
    for w in range(6):
        batch = Batch(states, rows=rows)
        live = batched.drafts(batch)
        assert live.tolist() == [s.drafts() for s in scalar]
        batched.start(batch, torch.device("cpu"))
        for s in scalar:
            s.start()
        drafted, pos = torch.zeros(n, dtype=torch.long), 0
        while bool(live.any()) and pos < k_max:
            pos += 1
            stop = batched.stops(pos, torch.full((n, len(TOKEN_FEATURES)), 0.5), p[w, pos - 1].float(), live)
            want = [s.stops(float(p[w, pos - 1, i])) for i, s in enumerate(scalar)]
            assert [bool(x) for x, on in zip(stop.tolist(), live.tolist()) if on] == [
                x for x, on in zip(want, live.tolist()) if on
            ]
            drafted = torch.where(live, pos, drafted)
            live = live & ~stop
        accepted = torch.minimum(torch.tensor(rng.integers(0, k_max + 1, n)), drafted)
        if rows is not None:
            batched.update(rows, drafted, accepted)
        for i, s in enumerate(scalar):
            s.update(int(drafted[i]), int(accepted[i]))
            if rows is None:
                batched.update(states[i], int(drafted[i]), int(accepted[i]))
        forecasts = rows.forecast.tolist() if rows is not None else [st.forecast for st in states]
        assert forecasts == [s._forecast for s in scalar]
        windows += drafted.tolist()
    assert len(set(windows)) > 2  # windows of several lengths: the rule decided something
