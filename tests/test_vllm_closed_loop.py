"""The closed loop inside vLLM (docs/architecture.md, "Closed loop"; closed_loop.ClosedLoop in vllm/draft.py), on tiny
float32 Qwen2 models: lossless at one request and several, a wrong seed profile (×3, ×⅓) corrected by the costs
this process measures, the classifier's probabilities recalibrated from what vLLM verified, and the governor
falling back to a fixed length where the policy's drafting loses. The modules' own bounds: tests/test_closed_loop.py."""

from __future__ import annotations

import json

import pytest
from closed_loop_clock import SEED, matches, scaled, synthetic_clock
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

from disco.base.defaults import CLOSED_LOOP_PROBES, GOVERNOR_HOLD, GOVERNOR_MARGIN, GOVERNOR_WINDOW
from disco.base.options import PairOptions
from disco.loop.pair import load_pair
from disco.policies.policy_registry import PolicySpec
from disco.vllm.engine import DISCO_DRAFT, SpecConfig
from disco.vllm.settings import ENV, settings_from_env

pytest.importorskip("vllm")


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


@pytest.mark.parametrize("by", [3.0, 1 / 3])
def test_a_wrong_seed_is_corrected_by_the_costs_measured_here(pair, ids, spec, by, monkeypatch):
    """A seed ×3 or ×⅓ (another machine's profile, an in-process one) in a process whose steps cost SEED's seconds
    (a synthetic clock: nothing here depends on the machine's load): the cost model the policy reads is the seed at
    the first two steps of the stream and SEED in every bucket, observed or not, from the third on. The bound: the
    first observation of each kind corrects the scale (online_costs.OnlineCosts); the second step times both (the
    first step's target step, and the first draft position past the first: its probe drafts two), and the third
    step's rebuild takes them in. The target steps are timed by the tokens in them: five requests verifying three
    drafts each, 20."""
    synthetic_clock(monkeypatch)
    proposer = pair.target_engine.proposer(spec)
    proposer.set_policy(PolicySpec("constant", k=3), scaled(SEED, by), closed_loop=True)
    read, propose = [], proposer.propose

    def reading(*args, **kwargs):
        read.append(proposer.loop.cost_model())  # (what the step's policy reads: nothing is observed in between)
        return propose(*args, **kwargs)

    monkeypatch.setattr(proposer, "propose", reading)  # (vLLM's runner calls its drafter's propose by name)
    vllm_generate(pair, spec, ids, 40)  # the five prompts together
    assert all(matches(model, scaled(SEED, by)) for model in read[:2]), [model.source for model in read]
    assert all(matches(model, SEED) for model in read[2:]), [model.source for model in read]
    assert proposer.loop.costs.steps.count[5 * (3 + 1) - 1] > 0


@pytest.fixture(scope="module")
def losing(folders, tmp_path_factory):
    """The target beside a draft that knows nothing of it (another random model): drafting never pays."""
    draft = save_char_tiny(tiny_vllm_qwen(seed=7), tmp_path_factory.mktemp("losing") / "draft")
    p = load_pair(PairOptions(target=str(folders[0]), draft=str(draft), engine="vllm", dtype="float32"))
    yield p, SpecConfig(DISCO_DRAFT, K_MAX, str(draft))
    p.target_engine.close()


def test_the_governor_falls_back_where_drafting_loses(losing, ids, reference, tmp_path, monkeypatch):
    """A policy that always drafts K_MAX tokens on a draft whose tokens the target rejects: within the
    governor's bound (GOVERNOR_WINDOW steps once the costs are measured) it drafts nothing (k = 0) and skips the
    draft's pass for a hold, and the outputs stay the target's. The second request starts while drafting is off
    (stale from its prefill): when the policy's trial is due, the pass stays skipped while it is the batch's only
    request (the pass would keep no one whole)."""
    path = tmp_path / "loop.jsonl"
    monkeypatch.setenv("DISCO_CLOSED_LOOP_LOG", str(path))
    p, spec = losing
    proposer = p.target_engine.proposer(spec)
    proposer.set_policy(PolicySpec("constant", k=K_MAX), closed_loop=True)
    outs = [vllm_generate(p, spec, [prompt], 96)[0][0] for prompt in ids[:2]]
    gov = proposer.loop.governor
    # off (k = 0) for a hold of GOVERNOR_HOLD steps at least: the draft's pass skipped (after it, the policy's trial)
    assert proposer.n_skipped >= GOVERNOR_HOLD, (proposer.n_skipped, gov.mode, gov.estimates, gov.policy_speedup)
    decided = [json.loads(x)["decided"] for x in path.read_text().splitlines()]
    assert "stale-off" in decided and "stale" not in decided, decided
    want = [vllm_generate(p, SpecConfig(), [prompt], 96)[0][0] for prompt in ids[:2]]
    assert outs == want


def test_the_log_pairs_each_step_with_the_decision_that_drafted_it(pair, ids, spec, tmp_path, monkeypatch):
    """vLLM's draft reads a step's outcomes only after the next step's decision (draft.py): each outcome is judged,
    and logged (DISCO_CLOSED_LOOP_LOG), under the decision that drafted it, so the first band's probe lines show
    exactly their probe's length verified, in the probes' order (k = 0 first: target-only's step timed)."""
    path = tmp_path / "loop.jsonl"
    monkeypatch.setenv("DISCO_CLOSED_LOOP_LOG", str(path))
    proposer = pair.target_engine.proposer(spec)
    proposer.set_policy(PolicySpec("threshold", threshold=0.4), SEED, closed_loop=True)
    vllm_generate(pair, spec, [ids[0]], 40)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    widths = [k for k in CLOSED_LOOP_PROBES if k <= K_MAX]
    probes = ["probe 0"] * 3 + [f"probe {widths[i % len(widths)]}" for i in range(3 * len(widths))]
    assert [x["decided"] for x in lines[: len(probes)]] == probes
    assert [x["drafted"] for x in lines[: len(probes)]] == [[int(p.split()[1])] for p in probes]
    assert all(x["batch"] == 1 and x["tokens"] == x["drafted"][0] + 1 for x in lines[: len(probes)])


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


def test_a_shift_in_acceptance_moves_the_windows(pair, ids, spec, monkeypatch):
    """A draft that agrees with the target (perturbed by 3 %) until step SHIFT, then hands vLLM other tokens (its
    probabilities unchanged: a confidence that no longer means anything) under a policy that always drafts K_MAX
    (the governor may prefer a shorter fixed length before the shift, where every step drafts): within 9/8
    GOVERNOR_WINDOW steps of the shift plus one judgement the windows are at most one token (but for a trial of the
    policy), the governor believes no window of two pays enough to leave k = 0, and the outputs stay the target's."""
    from disco.vllm import draft

    synthetic_clock(monkeypatch)  # (SEED's seconds: drafting pays while the draft agrees)
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
    # windows of two or more: believed not to beat k = 0 by the margin a move from it needs (Governor._fixed; the
    # estimate of k = 2 lands within 0.1 % of k = 0's in some schedules of the stream)
    assert est is not None and max(est[2:]) < 1.0 + GOVERNOR_MARGIN, est
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
    # (the last request's state is freed at the next step: at most one each)
    assert sizes[0][3:] == sizes[1][3:] and all(x <= 1 for x in sizes[1][:3]), sizes
