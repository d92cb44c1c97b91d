"""vLLM 0.32's adaptive verification and disco's learned budget on vLLM's own draft (adaptive_verification.BudgetPolicy
through vllm/draft.py's `_Step.windows` and batch_policy.verified), on tiny float32 Qwen2 models: lossless at one
request and four, and the windows handed to vLLM equal the budget recomputed here, independently (numpy), from the
confidences of each step (issue 45)."""

from __future__ import annotations

import numpy as np
import pytest
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

from disco.base.errors import DiscoError
from disco.core.cost import CostModel
from disco.policies.policy_registry import PolicySpec

pytest.importorskip("vllm")

K = 4  # the budget policies' draft length (<= K_MAX, the instance's num_speculative_tokens)
# a load profile in made-up seconds: a target step by its tokens (verification cheap enough that some slots pay,
# dear enough that not all do), a batched draft position by batch size
LOAD = CostModel(0.002, tuple(0.01 + 0.0004 * t for t in range(1, K_MAX + 2)), "stub",
                 tuple(0.01 + 0.0004 * t for t in range(1, 8 * (K_MAX + 1) + 1)), tuple(0.002 + 0.0002 * b for b in range(8)))  # fmt: skip


def _policy(name: str, pair, tmp_path) -> PolicySpec:
    if name == "adaptive-verification":
        return PolicySpec(name, k=K)
    return PolicySpec(name, k=K, classifier=str(logistic_artifact(tmp_path / "clf", pair, "token", 0.5)))


@pytest.mark.parametrize("name", ["adaptive-verification", "learned-budget"])
def test_lossless_at_one_request_and_four(pair, ids, spec, reference, name, tmp_path):
    """Alone and four together, with budgets of 8..32 tokens: vLLM target-only's outputs; the windows handed to vLLM
    are the budget's (at most what was drafted, fewer somewhere), and each request's counts add up."""
    proposer = pair.target_engine.proposer(spec)
    proposer.set_policy(_policy(name, pair, tmp_path), LOAD)
    alone = [vllm_generate(pair, spec, [p], 8 + 8 * n) for n, p in enumerate(ids[:4])]
    together, rids = vllm_budgets(pair, spec, ids[:4])
    assert [out[0][0] for out in alone] == reference[:4]
    assert together == reference[:4]
    verified = proposed = 0
    runs = [(o[1][0], p) for o, p in zip(alone, ids)] + list(zip(rids, ids))
    for rid, prompt in runs:
        stats = proposer.stats_for(prompt, rid)
        assert sum(stats.windows) == stats.drafted and 0 <= stats.accepted <= stats.drafted
        verified, proposed = verified + stats.drafted, proposed + stats.draft_forwards
    assert 0 < verified < proposed  # it verified drafts, and not every one it drafted


def _by_hand(conf: np.ndarray, stale: np.ndarray, drafted: np.ndarray, positions: int) -> list[int]:
    """vLLM's budget for one step, recomputed from its definition: B* = the first argmax over n of (B + the n best
    survivals of `stale`) / (positions x c_draft(B) + c_step(B + n)), then each request's count of the B* best
    survivals of `conf` (ties: the earlier position, then the lower row)."""
    B, k = conf.shape
    valid = np.arange(k)[None, :] < drafted[:, None]
    best = np.sort(np.cumprod(stale.astype(np.float64), 1)[valid])[::-1]
    rates = [
        (B + best[:n].sum()) / (positions * LOAD.c_draft[B - 1] + LOAD.c_step[B + n - 1]) for n in range(len(best) + 1)
    ]
    budget = int(np.argmax(rates))
    surv = np.where(valid, np.cumprod(conf, 1), -np.inf)
    order = sorted((-surv[i, j], j, i) for i in range(B) for j in range(k) if valid[i, j])[:budget]
    return [sum(1 for _, _, i in order if i == row) for row in range(B)]


def test_the_windows_are_the_budget_computed_by_hand(pair, ids, spec, reference):
    """Three requests together under vLLM's method: at every step the windows handed to vLLM have the lengths the
    budget gives, recomputed from the step's confidences (this step's for the slots, each request's previous step's
    for B*), and vLLM's output is target-only's."""
    proposer = pair.target_engine.proposer(spec)
    proposer.set_policy(PolicySpec("adaptive-verification", k=K), LOAD)
    policy = proposer.policy
    steps: list[tuple[list[int], list[int]]] = []
    begin = proposer._begin

    def spy(*args, **kwargs):
        step = begin(*args, **kwargs)
        windows, trim = step.windows, policy.trim

        def trimmed(drafted):
            b = policy.budget
            seen = (b.conf.numpy().copy(), policy.previous[policy.rows].numpy().copy(), b.drafted.numpy().copy())
            out = trim(drafted)
            steps.append((_by_hand(*seen, b.positions), out.tolist(), int(b.drafted.sum())))
            return out

        def handed():
            policy.trim = trimmed
            try:
                out = windows()
            finally:
                del policy.trim
            if steps and len(steps[-1]) == 3:
                steps[-1] = (*steps[-1], [len(w) for w in out])
            return out

        step.windows = handed
        return step

    proposer._begin = spy
    try:
        outs, _ = vllm_budgets(pair, spec, ids[:3])
    finally:
        del proposer._begin
    assert outs == reference[:3]
    assert len(steps) > 5 and any(len(set(lengths)) > 1 for *_, lengths in steps)  # ragged somewhere
    assert any(0 < sum(trimmed) < drafted for _, trimmed, drafted, _ in steps)  # the budget cut some slots
    for hand, trimmed, _, lengths in steps:
        assert trimmed == hand == lengths


def test_budget_policies_need_a_load_profile(pair, spec):
    proposer = pair.target_engine.proposer(spec)
    with pytest.raises(
        DiscoError, match="adaptive-verification policy sizes each step's verification from vLLM's load profile"
    ):
        proposer.set_policy(PolicySpec("adaptive-verification", k=K))
    with pytest.raises(DiscoError, match="learned-budget policy needs a trained artifact"):
        PolicySpec("learned-budget", k=K).build()  # (its one-request form in disco's loop: tests/test_loop_budget.py)


def test_compare_rows_on_vllms_draft(pair, tmp_path, capsys):
    """`disco compare --engine vllm` lines up vLLM's method (and, given a classifier, disco's learned budget) as rows
    on vLLM's draft, only given a load profile (else one line says why not), never on the side engine."""
    from disco.jobs.compare import ADAPTIVE_LABEL, LEARNED_BUDGET_LABEL, default_entries
    from disco.vllm.stages import serving_rows

    clf = str(logistic_artifact(tmp_path / "clf", pair))
    entries = [e for e in default_entries(clf, pair=pair) if e.spec is not None and e.spec.kind.batch_budget]
    assert [e.label for e in entries] == [ADAPTIVE_LABEL, LEARNED_BUDGET_LABEL]
    settings = {"fixed_k": [], "proposers": ("draft", "side")}
    rows = serving_rows(pair, entries, K_MAX, settings, load=True)
    assert [r.label for r in rows] == [
        "vllm target-only",
        "vllm draft + adaptive verification (vLLM 0.32 method)",
        "vllm draft + learned budget",
    ]
    assert [r.label for r in serving_rows(pair, entries, K_MAX, settings, load=False)] == ["vllm target-only"]
    assert "no vLLM load profile, so no rows for adaptive verification" in capsys.readouterr().err
