"""A synthetic clock for the closed loop's tests on vLLM (tests/test_vllm_closed_loop.py, on vLLM's own draft;
tests/test_vllm_side_closed_loop.py, on the side engine): the loop sees a cost model's seconds instead of this
machine's, so what it learns and decides does not depend on the machine's load (two tiny models cost about the same
per forward here, so whether drafting pays would otherwise turn on the load of a shared CPU)."""

from __future__ import annotations

import dataclasses

import numpy as np
from vllm_pair import K_MAX

from disco.core.cost import CostModel
from disco.online.governor import Governor
from disco.online.online_costs import OnlineCosts

TABLE_BATCH = 8  # the tiny instances' max_num_seqs (DEFAULT_VLLM_MAX_SEQS): the running tables' sizes

# a load profile in made-up seconds (a target step by tokens, a batched draft position by batch size) under which
# drafting pays while the draft agrees; it covers the running table's every bucket (8 requests x (K_MAX + 1) tokens)
SEED = CostModel(0.004, tuple(0.01 + 0.001 * t for t in range(1, K_MAX + 2)), "seed",
                 tuple(0.01 + 0.001 * t for t in range(1, TABLE_BATCH * (K_MAX + 1) + 1)),
                 tuple(0.004 + 0.0005 * b for b in range(TABLE_BATCH)))  # fmt: skip


def scaled(cost: CostModel, by: float) -> CostModel:
    """`cost` with every figure times `by` (another machine's profile, an in-process one)."""
    return dataclasses.replace(
        cost,
        c_d=cost.c_d * by,
        c_t=tuple(x * by for x in cost.c_t),
        c_step=tuple(x * by for x in cost.c_step),
        c_draft=tuple(x * by for x in cost.c_draft),
        source=f"seed x{by:g}",
    )


def matches(model: CostModel, truth: CostModel, rel: float = 1e-9) -> bool:
    """Every bucket of a running table's cost model equals `truth`'s (to rounding)."""
    return (
        len(model.c_step) == len(truth.c_step)
        and len(model.c_draft) == len(truth.c_draft)
        and np.allclose(model.c_step, truth.c_step, rtol=rel, atol=0)
        and np.allclose(model.c_draft, truth.c_draft, rtol=rel, atol=0)
    )


def synthetic_clock(monkeypatch, truth: CostModel = SEED) -> None:
    """The closed loop sees `truth`'s seconds instead of this machine's: a target step over t tokens costs
    truth.c_step[t - 1], a draft position over b rows truth.c_draft[b - 1] (the last entries past their ends: a
    prefill's hundreds of tokens, which the running table leaves out anyway), a step's wall time (the governor's) its
    verification and its longest window's positions, its target step (the governor's pace) its verification."""
    step, position, observe = OnlineCosts.observe_step, OnlineCosts.observe_draft, Governor.observe
    plain = OnlineCosts.observe_plain

    def at(costs: tuple[float, ...], n: int) -> float:
        return costs[min(n, len(costs)) - 1]

    def seconds(drafted) -> float:
        d = np.asarray(drafted)
        return at(truth.c_step, int((d + 1).sum())) + int(d.max(initial=0)) * at(truth.c_draft, len(d))

    monkeypatch.setattr(OnlineCosts, "observe_step", lambda self, t, s: step(self, t, at(truth.c_step, t)))
    monkeypatch.setattr(OnlineCosts, "observe_draft", lambda self, b, s: position(self, b, at(truth.c_draft, b)))
    monkeypatch.setattr(OnlineCosts, "observe_plain", lambda self, b, s: plain(self, b, at(truth.c_step, b)))

    def observed(self, d, a, s, spell=True, target=None, verified=0, probe=0) -> None:
        # the step's target step as the synthetic clock times it too (the governor's pace: governor.Spell.pace)
        timed = None if target is None else at(truth.c_step, verified)
        observe(self, d, a, seconds(d), spell, timed, verified, probe)

    monkeypatch.setattr(Governor, "observe", observed)
