"""The closed loop inside vLLM (docs/architecture.md, "Closed loop"; closed_loop.ClosedLoop in vllm/draft.py), on tiny
float32 Qwen2 models: lossless at one request and several, a wrong seed profile (×3, ×⅓) corrected by the costs
this process measures, the classifier's probabilities recalibrated from what vLLM verified, and the governor
falling back to a fixed length where the policy's drafting loses. The modules' own bounds: tests/test_closed_loop.py."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from tiny import save_char_tiny, tiny_vllm_qwen
from vllm_pair import (  # noqa: F401 -- pytest fixtures
    K_MAX,
    folders,
    ids,
    logistic_artifact,
    pair,
    reference,
    spec,
    vllm_budgets,
    vllm_generate,
)

from disco.base.defaults import GOVERNOR_HOLD, GOVERNOR_WINDOW
from disco.base.options import PairOptions
from disco.core.cost import CostModel
from disco.loop.pair import load_pair
from disco.policies.policy_registry import PolicySpec
from disco.vllm.engine import DISCO_DRAFT, SpecConfig
from disco.vllm.settings import ENV, settings_from_env

pytest.importorskip("vllm")

# a load profile in made-up seconds (a target step by tokens, a batched draft position by batch size)
SEED = CostModel(0.004, tuple(0.01 + 0.001 * t for t in range(1, K_MAX + 2)), "seed",
                 tuple(0.01 + 0.001 * t for t in range(1, 8 * (K_MAX + 1) + 1)), tuple(0.004 + 0.0005 * b for b in range(8)))  # fmt: skip


def _scaled(cost: CostModel, by: float) -> CostModel:
    return dataclasses.replace(
        cost,
        c_d=cost.c_d * by,
        c_t=tuple(x * by for x in cost.c_t),
        c_step=tuple(x * by for x in cost.c_step),
        c_draft=tuple(x * by for x in cost.c_draft),
        source=f"seed x{by:g}",
    )


@pytest.mark.parametrize("rule", ["threshold", "classifier-cost"])
def test_lossless_with_the_closed_loop_at_one_request_and_five(pair, ids, spec, reference, rule, tmp_path):
    policy = PolicySpec("threshold", threshold=0.4)
    if rule != "threshold":
        policy = PolicySpec("classifier", classifier=str(logistic_artifact(tmp_path / "clf", pair, "cost", 1.0)))
    proposer = pair.target_engine.proposer(spec)
    proposer.set_policy(policy, SEED, closed_loop=True)
    assert proposer.loop is not None and (proposer.loop.calibration is not None) == (rule != "threshold")
    alone = [vllm_generate(pair, spec, [p], 8 + 8 * n)[0][0] for n, p in enumerate(ids)]
    together, _ = vllm_budgets(pair, spec, ids)  # all five at once, each with its own budget
    assert alone == reference and together == reference
    assert proposer.loop.costs.steps.observed > 0 and proposer.loop.governor.steps > 0


def test_a_wrong_seed_is_corrected_by_the_costs_measured_here(pair, ids, spec):
    """The same stream with a seed ×3 and one ×⅓ (another machine's, an in-process profile): after it, both
    running tables hold this process's costs: within 1.6× of each other, where the seeds were 9× apart."""
    proposer = pair.target_engine.proposer(spec)
    tables = {}
    for by in (3.0, 1 / 3):
        proposer.set_policy(PolicySpec("constant", k=3), _scaled(SEED, by), closed_loop=True)
        for _ in range(2):
            vllm_budgets(pair, spec, ids)
        loop = proposer.loop
        assert loop.costs.warm  # both kinds observed past the warm-up (ONLINE_COST_WARMUP)
        tables[by] = loop.cost_model()
    high, low = tables[3.0], tables[1 / 3]
    for t in (1, 2, 4, 5 * 4):  # target steps of 1, 2, 4 tokens and five requests verifying 3 drafts
        assert 1 / 1.6 < high.c_step[t - 1] / low.c_step[t - 1] < 1.6
    assert 1 / 1.6 < high.c_draft[0] / low.c_draft[0] < 1.6


@pytest.fixture(scope="module")
def losing(folders, tmp_path_factory):
    """The target beside a draft that knows nothing of it (another random model): drafting never pays."""
    draft = save_char_tiny(tiny_vllm_qwen(seed=7), tmp_path_factory.mktemp("losing") / "draft")
    p = load_pair(PairOptions(target=str(folders[0]), draft=str(draft), engine="vllm", dtype="float32"))
    yield p, SpecConfig(DISCO_DRAFT, K_MAX, str(draft))
    p.target_engine.close()


def test_the_governor_falls_back_where_drafting_loses(losing, ids, reference):
    """A policy that always drafts K_MAX tokens on a draft whose tokens the target rejects: within the
    governor's bound (GOVERNOR_WINDOW steps once the costs are measured) it drafts nothing (k = 0) and skips the
    draft's pass for a hold, and the outputs stay the target's."""
    p, spec = losing
    proposer = p.target_engine.proposer(spec)
    proposer.set_policy(PolicySpec("constant", k=K_MAX), closed_loop=True)
    outs = [vllm_generate(p, spec, [prompt], 96)[0][0] for prompt in ids[:2]]
    gov = proposer.loop.governor
    # off (k = 0) for a hold of GOVERNOR_HOLD steps at least: the draft's pass skipped (after it, the policy's trial)
    assert proposer.n_skipped >= GOVERNOR_HOLD, (proposer.n_skipped, gov.mode, gov.estimates, gov.policy_speedup)
    want = [vllm_generate(p, SpecConfig(), [prompt], 96)[0][0] for prompt in ids[:2]]
    assert outs == want


def test_settings_turn_the_closed_loop_on(monkeypatch):
    monkeypatch.setenv(ENV, '{"policy": {"name": "threshold"}, "closed_loop": true}')
    assert settings_from_env().closed_loop is True
    monkeypatch.setenv(ENV, '{"policy": {"name": "threshold"}, "closed_loop": "yes"}')
    with pytest.raises(Exception, match='"closed_loop" is true or false'):
        settings_from_env()
    monkeypatch.setenv(ENV, '{"policy": {"name": "threshold"}}')
    assert settings_from_env().closed_loop is False


def _stream(pair, spec, ids, steps: int, seen: list) -> list[list[int]]:
    """Requests one after another (the prompts in turn, 40 tokens each) until `seen` holds `steps` steps."""
    outs = []
    while len(seen) < steps:
        outs.append(vllm_generate(pair, spec, [ids[len(outs) % len(ids)]], 40)[0][0])
    return outs


SHIFT = 80  # the step from which the draft's tokens are wrong


def _synthetic_clock(monkeypatch) -> None:
    """The closed loop sees SEED's seconds instead of this machine's (where two tiny models cost about the same per
    forward, drafting pays or not by the machine's load): a step over t tokens costs SEED.c_step[t - 1], a draft
    position over b rows SEED.c_draft[b - 1], so that drafting pays while the draft agrees."""
    from disco.online.governor import Governor
    from disco.online.online_costs import OnlineCosts

    step, position, observe = OnlineCosts.observe_step, OnlineCosts.observe_draft, Governor.observe

    def seconds(drafted) -> float:
        d = np.asarray(drafted)
        return SEED.c_step[int((d + 1).sum()) - 1] + int(d.max(initial=0)) * SEED.c_draft[len(d) - 1]

    monkeypatch.setattr(OnlineCosts, "observe_step", lambda self, t, s: step(self, t, SEED.c_step[t - 1]))
    monkeypatch.setattr(OnlineCosts, "observe_draft", lambda self, b, s: position(self, b, SEED.c_draft[b - 1]))
    monkeypatch.setattr(Governor, "observe", lambda self, d, a, s, spell=True: observe(self, d, a, seconds(d), spell))


def test_a_shift_in_acceptance_moves_the_windows(pair, ids, spec, monkeypatch):
    """A draft that agrees with the target (perturbed by 3 %) until step SHIFT, then hands vLLM other tokens (its
    probabilities unchanged: a confidence that no longer means anything) under a policy that always drafts K_MAX
    (the governor may prefer a shorter fixed length before the shift, where every step drafts): within 9/8
    GOVERNOR_WINDOW steps of the shift plus one judgement the windows are at most one token (but for a trial of the
    policy), the governor believes no window of two pays, and the outputs stay the target's."""
    from disco.vllm import draft

    _synthetic_clock(monkeypatch)
    proposer = pair.target_engine.proposer(spec)
    proposer.set_policy(PolicySpec("constant", k=K_MAX), closed_loop=True)
    real, seen = draft._Step.windows, []

    def windows(step):
        real(step)
        for st in step.states:
            if len(seen) >= SHIFT:
                st.window = [(t + 1) % 384 for t in st.window]  # (the tiny vLLM model's vocabulary)
        seen.append(sum(len(st.window) for st in step.states))
        return [st.window for st in step.states]

    monkeypatch.setattr(draft._Step, "windows", windows)
    bound = SHIFT + GOVERNOR_WINDOW * 9 // 8 + GOVERNOR_WINDOW // 8
    outs = _stream(pair, spec, ids, bound + 2 * GOVERNOR_WINDOW, seen)
    assert all(seen[SHIFT - GOVERNOR_WINDOW : SHIFT]), seen[:SHIFT]  # before: every step drafts (the policy, or k)
    # after: drafting nothing (k = 0, or k = 1 while its estimate decays), but for one trial of the policy at most
    # (GOVERNOR_WINDOW steps; the next comes a hold of GOVERNOR_HOLD steps or more later)
    assert sum(w <= 1 for w in seen[bound : bound + 2 * GOVERNOR_WINDOW]) >= GOVERNOR_WINDOW, seen
    est = proposer.loop.governor.estimates
    assert est is not None and max(est[2:]) < 1.0, est  # windows of two or more: believed to lose
    monkeypatch.undo()
    assert outs == [vllm_generate(pair, SpecConfig(), [ids[n % len(ids)]], 40)[0][0] for n in range(len(outs))]


def test_memory_is_flat_over_a_long_stream(pair, ids, spec):
    """Twelve requests one after another, then twelve more: the proposer keeps no state per finished request (its
    requests, table rows, stale set), and the closed loop's arrays keep their sizes."""
    proposer = pair.target_engine.proposer(spec)
    proposer.set_policy(PolicySpec("threshold", threshold=0.0), SEED, closed_loop=True)
    sizes = []
    for _ in range(2):
        for n in range(12):
            vllm_generate(pair, spec, [ids[n % len(ids)]], 24)
        loop = proposer.loop
        arrays = (loop.costs.steps.ring, loop.costs.drafts.ring, loop.governor.judged, loop.governor.spell.tokens)
        sizes.append(
            (len(proposer.requests), len(proposer._tables.slots), len(proposer._stale), *(a.shape for a in arrays))
        )
    assert sizes[0] == sizes[1] and sizes[1][0] <= 1 and sizes[1][1] <= 1, sizes
