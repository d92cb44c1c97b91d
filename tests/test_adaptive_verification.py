"""vLLM 0.32's adaptive verification re-implemented (disco/policies/adaptive_verification.py: the online acceptance
estimator and the global draft budget), disco's learned budget, their lockstep simulation
(simulate.simulate_adaptive_verification) and `disco train`'s calibration report (issue 45)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
from helpers import random_traces, synthetic_trace, write_traces

from disco.base.errors import DiscoError
from disco.core.cost import CostModel
from disco.core.features import FEATURES
from disco.policies.acceptance_estimator import (
    INIT_BIAS,
    INIT_SLOPE,
    MAX_LOG_ODDS,
    OnlineAcceptanceEstimator,
    log_odds,
    log_odds_from_logits,
)
from disco.policies.adaptive_verification import BatchAdaptiveVerification, BatchLearnedBudget
from disco.policies.artifact_models import Calibration
from disco.policies.batch_policy import Batch, BatchConstant, RequestState, RowState
from disco.policies.verify_budget import (
    ClassifierConfidence,
    CostTables,
    LearnedBudget,
    admit,
    budget_curve,
    build_cost_tables_from_curves,
    draft_budget,
    extrapolated,
    select,
)
from disco.training.fitting import calibration_figures, calibration_report, fit_model, reliability
from disco.training.simulate import prompt_traces, simulate_adaptive_verification, simulate_batched
from disco.training.train import TrainConfig, train

# c_step(t) = 1 + 0.2 (t - 1): one target step over t tokens; c_draft(b) = 0.1: one batched draft position
LINEAR = CostModel(0.1, (1.0, 1.2, 1.4), "stub", tuple(1.0 + 0.2 * (t - 1) for t in range(1, 65)), (0.1,) * 8)
CONF = torch.tensor([[0.9, 0.8, 0.5], [0.6, 0.5, 0.9]])  # survivals 0.9 0.72 0.36 | 0.6 0.3 0.27


# --- the budget -------------------------------------------------------------------------------------------


def test_hand_computed_budget_on_a_2x3_batch():
    # expected tokens 2 + the n best survivals (0.9, 0.72, 0.6, 0.36, 0.3, 0.27) over 3 x 0.1 + c_step(2 + n):
    # n = 0 .. 6: 2/1.5, 2.9/1.7, 3.62/1.9, 4.22/2.1, 4.58/2.3, 4.88/2.5, 5.15/2.7: the best is n = 3
    curve = budget_curve(CONF, LINEAR)
    hand = [2 / 1.5, 2.9 / 1.7, 3.62 / 1.9, 4.22 / 2.1, 4.58 / 2.3, 4.88 / 2.5, 5.15 / 2.7]
    assert curve.tolist() == pytest.approx(hand)
    assert int(draft_budget(CONF, LINEAR)) == 3
    assert select(CONF, LINEAR).tolist() == [2, 1]  # 0.9, 0.72 of the first, 0.6 of the second
    # request 0 may verify one draft: slots 0.9 | 0.6 0.3 0.27 -> 2/1.5, 2.9/1.7, 3.5/1.9, 3.8/2.1: n = 2
    assert select(CONF, LINEAR, torch.tensor([1, 3])).tolist() == [1, 1]
    # verification 5x dearer: 2/2.3, 2.9/3.3, 3.62/4.3: n = 1
    steep = CostModel(0.1, (1.0, 2.0), "stub", tuple(float(t) for t in range(1, 65)), (0.1,) * 8)
    assert select(CONF, steep).tolist() == [1, 0]
    # vLLM's split: the budget from (stale) confidences, the slots by the current ones
    stale = torch.ones(2, 3)  # a new request's stale confidences are 1.0: the budget sees 6 sure slots
    b = int(draft_budget(stale, LINEAR))
    assert b == 6 and select(CONF, LINEAR, budget_conf=stale).tolist() == [3, 3]
    assert admit(CONF, 4).tolist() == [3, 1]  # 0.9, 0.72, 0.6, 0.36
    assert admit(CONF, 0).tolist() == [0, 0] and admit(CONF, 99, torch.tensor([2, 1])).tolist() == [2, 1]


def _brute_force(conf: np.ndarray, caps: list[int], draft: float, verify: np.ndarray) -> tuple[float, tuple]:
    """The best (rate, counts) over every admission consistent with prefixes: each request its first n_i slots."""
    B = len(caps)
    surv = np.cumprod(conf, 1)
    best = (-1.0, ())
    for counts in itertools.product(*(range(c + 1) for c in caps)):
        tokens = B + sum(surv[i, :n].sum() for i, n in enumerate(counts))
        rate = tokens / (draft + verify[B + sum(counts)])
        if rate > best[0]:
            best = (rate, counts)
    return best


def test_budget_selection_equals_brute_force_enumeration_on_random_small_batches():
    rng = np.random.default_rng(0)
    for _ in range(300):
        B, K = int(rng.integers(1, 4)), int(rng.integers(1, 5))
        conf = rng.uniform(0.02, 1.0, (B, K))
        caps = [int(c) for c in rng.integers(0, K + 1, B)]
        steps = np.cumsum(rng.uniform(0.0, 0.4, 64)) + rng.uniform(0.2, 2.0)  # increasing step costs
        cost = CostModel(0.1, tuple(steps[:2]), "random", tuple(steps), tuple(np.cumsum(rng.uniform(0.01, 0.2, 8))))
        tables = CostTables.from_cost(cost, K, 8, 64)
        rate, counts = _brute_force(conf, caps, tables.draft[B], tables.verify)
        c = torch.tensor(conf, dtype=torch.float32)
        got = select(c, cost, torch.tensor(caps))
        assert tuple(got.tolist()) == counts, (conf, caps)
        assert float(budget_curve(c, cost, torch.tensor(caps)).max()) == pytest.approx(rate, rel=1e-6)


def test_ties_admit_earlier_positions_first_so_every_request_verifies_a_prefix():
    ones = torch.ones(2, 3)
    assert admit(ones, 3).tolist() == [2, 1]  # position-major: (r0, p0), (r1, p0), (r0, p1)
    assert admit(torch.tensor([[1.0, 1.0, 1.0, 0.5]]), 2).tolist() == [2]


def test_cost_tables_are_vllms():
    # a step function at the profiled sizes, the running maximum, linear past the last point
    draft, verify = build_cost_tables_from_curves([(1, 2.0), (4, 3.0)], [(2, 1.0), (4, 0.5), (8, 3.0)], 6, 10)
    assert draft.tolist() == [2.0, 2.0, 3.0, 3.0, 3.0, 3 + 1 / 3, 3 + 2 / 3]
    assert verify.tolist() == [1.0, 1.0, 1.0, 1.0, 1.0, 3.0, 3.0, 3.0, 3.0, 3.5, 4.0]
    # disco's profile: the drafter's step is k batched positions, c_step by tokens as profiled
    t = CostTables.from_cost(LINEAR, 3, 4, 8)
    assert t.draft.tolist() == pytest.approx([0.3] * 5)
    assert t.verify.tolist() == pytest.approx([1.0, 1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2, 2.4])


# --- the online estimator ---------------------------------------------------------------------------------


def test_estimator_features_cold_start_and_judged_drafts():
    est = OnlineAcceptanceEstimator(4)
    p = torch.tensor([[0.5, 0.9, 1.0, 1e-30]])
    f = log_odds(p)
    assert f[0].tolist() == pytest.approx([0.0, np.log(9), MAX_LOG_ODDS, -MAX_LOG_ODDS], rel=1e-5)
    conf = est.predict(p)
    assert conf[0].tolist() == pytest.approx(torch.sigmoid(INIT_SLOPE * f + INIT_BIAS)[0].tolist())
    # from the logits, with temperature: the same feature as the softmax's top-1 probability
    logits = torch.tensor([[2.0, 0.0, -1.0, 0.5], [0.0, 0.0, 0.0, 0.0]])
    for temp in (1.0, 0.7):
        q = torch.softmax(logits / temp, 1).amax(1)
        got = log_odds_from_logits(logits, torch.tensor([temp, temp]))
        assert got.tolist() == pytest.approx(log_odds(q).tolist(), abs=1e-5)
    assert log_odds_from_logits(logits, torch.tensor([0.0, 0.0])).tolist() == pytest.approx(
        log_odds_from_logits(logits).tolist()
    )
    # judged drafts: the accepted ones and the first rejected one if it was verified (_accumulate_kernel)
    est = OnlineAcceptanceEstimator(4)
    est.predict(torch.full((3, 4), 0.8))
    est.step_sampled(torch.tensor([3, 4, 1]), torch.tensor([2, 0, 0]))  # accepted 2 of 4, 3 of 3, 0 of 0
    assert est.counts.tolist() == [2.0, 2.0, 2.0, 0.0]
    pred = float(torch.sigmoid(torch.tensor(INIT_SLOPE * np.log(4) + INIT_BIAS)))
    assert est.grad[:, 1].tolist() == pytest.approx([2 * (1 - pred), 2 * (1 - pred), (1 - pred) - pred, 0.0])


def _outcomes(seed: int, K: int = 4, reqs: int = 24, steps: int = 100):
    """`steps` verification steps of `reqs` requests: p_top1 (steps, reqs, K), accepted and admitted (steps, reqs)
    from a known per-position logistic on logit(p_top1)."""
    rng = np.random.default_rng(seed)
    p = rng.beta(3, 1.5, (steps, reqs, K))
    true = 1 / (1 + np.exp(-(0.8 * np.log(p / (1 - p)) + np.array([0.6, 0.2, -0.1, -0.4])[:K])))
    ok = rng.random((steps, reqs, K)) < true
    admitted = rng.integers(1, K + 1, (steps, reqs))
    accepted = np.minimum(np.cumprod(ok, 2).sum(2), admitted)
    return p, accepted, admitted


def _direct_fit(p, accepted, admitted, K):
    """Unpenalised logistic regression (sklearn) on the judged drafts: design [logit(p), one-hot position]."""
    from sklearn.linear_model import LogisticRegression

    k = np.arange(K)
    observed = (k <= accepted[..., None]) & (k < admitted[..., None])
    label = (k < accepted[..., None])[observed]
    f = np.log(p / (1 - p))[observed]
    pos = np.broadcast_to(k, p.shape)[observed]
    X = np.concatenate([f[:, None], np.eye(K)[pos]], 1)
    lr = LogisticRegression(C=np.inf, fit_intercept=False, tol=1e-10, max_iter=10_000).fit(X, label)
    return lr.coef_[0, 0], lr.coef_[0, 1:], (f, pos, label)


def test_online_refit_converges_to_a_direct_logistic_fit_of_the_same_outcomes():
    K = 4
    p, accepted, admitted = _outcomes(0, K)
    est = OnlineAcceptanceEstimator(K)
    refits = 0
    for _ in range(12):  # the same 100 steps replayed: one refit per replay, on vLLM's schedule
        for t in range(len(p)):
            est.predict(torch.tensor(p[t], dtype=torch.float32))
            refits += est.step(torch.tensor(accepted[t]), torch.tensor(admitted[t]))
    assert refits == est.refits == 12
    slope, intercepts, (f, pos, label) = _direct_fit(p, accepted, admitted, K)
    assert float(est.slope[0]) == pytest.approx(slope, abs=2e-3)
    assert est.intercepts.tolist() == pytest.approx(intercepts.tolist(), abs=2e-3)
    # fit(): the same refits, on rows
    rows = OnlineAcceptanceEstimator(K)
    rows.fit(torch.tensor(f), torch.tensor(pos), torch.tensor(label, dtype=torch.float32))
    assert rows.converged and float(rows.slope[0]) == pytest.approx(slope, abs=2e-3)
    assert rows.intercepts.tolist() == pytest.approx(intercepts.tolist(), abs=2e-3)


def test_one_undamped_refit_is_the_ridged_newton_step():
    K = 3
    p, accepted, admitted = _outcomes(1, K, steps=5)
    est = OnlineAcceptanceEstimator(K)
    est.DAMPING_OBSERVATIONS = 0.0
    for t in range(len(p)):
        est.predict(torch.tensor(p[t], dtype=torch.float32))
        est.observe(torch.tensor(accepted[t]), torch.tensor(admitted[t]))
    est.refit()
    _, _, (f, pos, label) = _direct_fit(p, accepted, admitted, K)
    X = np.concatenate([f[:, None], np.eye(K)[pos]], 1)
    theta = np.array([INIT_SLOPE, *[INIT_BIAS] * K])
    pr = 1 / (1 + np.exp(-X @ theta))
    H = X.T @ (X * (pr * (1 - pr))[:, None]) + est.L2 * np.eye(K + 1)
    new = theta + np.linalg.solve(H, X.T @ (label - pr))
    assert [float(est.slope[0]), *est.intercepts.tolist()] == pytest.approx(new.tolist(), abs=1e-4)


# --- disco's learned budget -------------------------------------------------------------------------------


def test_learned_budget_without_stopping_is_the_budget_on_its_confidences():
    lb = LearnedBudget(LINEAR, 3, stop_drafting=False)
    lb.start(torch.tensor([3, 3]))
    for pos in (1, 2, 3):
        live = lb.after_position(pos, CONF[:, pos - 1])
    assert not bool(live.any())
    assert lb.select().tolist() == select(CONF, LINEAR).tolist() == [2, 1]


def test_learned_budget_stops_drafting_when_survival_no_longer_pays():
    lb = LearnedBudget(LINEAR, 3)
    lb.start(torch.tensor([3, 3]))
    assert lb.after_position(1, torch.tensor([0.9, 0.0])).tolist() == [True, False]  # a sure rejection stops
    assert lb.after_position(2, torch.tensor([0.05, 0.5])).tolist() == [False, False]  # 0.045 pays nothing
    assert lb.drafted.tolist() == [2, 1] and lb.select().tolist() == [1, 0]
    # verification nearly free, drafting cheap: every request drafts to k and verifies everything
    flat = CostModel(0.01, (1.0, 1.0), "flat", (1.0,) * 64, (0.01,) * 8)
    lb = LearnedBudget(flat, 3)
    lb.start(torch.tensor([3, 2]))
    lives = [lb.after_position(pos, torch.tensor([0.9, 0.9])).tolist() for pos in (1, 2, 3)]
    assert lives == [[True, True], [True, False], [False, False]] and lb.select().tolist() == [3, 2]


# --- the simulator ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def traces():
    return prompt_traces(random_traces(16, 40, seed=3))


def _load(step_slope: float) -> CostModel:
    c_step = tuple(0.01 * (1 + step_slope * t) for t in range(256))
    return CostModel(0.004, c_step[:9], "stub", c_step, tuple(0.003 * (1 + 0.1 * b) for b in range(16)))


def test_adaptive_verification_replays_a_hand_counted_step():
    df = synthetic_trace("a", [True, False, True])
    load = CostModel(0.5, (1.0, 1.1), "stub", (1.0, 1.1, 1.2, 1.3), (0.5,))
    run = simulate_adaptive_verification(prompt_traces(df), load, 1, 2, "oracle")
    # step 1: slots (1, 0): 1/(1 + 1.0), 2/(1 + 1.1), 2/(1 + 1.2): verify one, accept it, commit 2;
    # step 2: the last token, no slot: 2 draft positions + c_step(1)
    assert (run.tokens, run.steps, run.drafted, run.accepted, run.proposed) == (3, 2, 1, 1, 2)
    assert run.seconds == pytest.approx(2 * 0.5 + 1.1 + 2 * 0.5 + 1.0)


def test_verifying_every_slot_is_vllms_fixed_length(traces):
    flat = _load(0.0)  # verification costs nothing more: every slot pays
    for b in (1, 4):
        fixed = simulate_batched(traces, BatchConstant(4), flat, b, 4)
        run = simulate_adaptive_verification(traces, flat, b, 4, "online")
        assert (run.tokens, run.steps, run.drafted, run.accepted) == (
            fixed.tokens,
            fixed.steps,
            fixed.drafted,
            fixed.accepted,
        )


def test_adaptive_verification_is_lossless_and_the_oracle_bounds_it(traces):
    load = _load(0.05)
    total = sum(len(tr) for tr in traces)
    online = simulate_adaptive_verification(traces, load, 4, 4, "online")
    oracle = simulate_adaptive_verification(traces, load, 4, 4, "oracle")
    fresh = simulate_adaptive_verification(traces, load, 4, 4, "online", stale_budget=False)
    est = OnlineAcceptanceEstimator(4, len(traces))
    alone = simulate_adaptive_verification(traces, load, 1, 4, est)  # one request at a time: more steps
    for run in (online, oracle, fresh, alone):
        assert run.tokens == total and run.drafted <= run.proposed
    assert est.refits == alone.steps // est.REFIT_INTERVAL > 0
    assert online.drafted < online.proposed  # the budget trimmed some slots
    assert oracle.tokens_per_s >= max(online.tokens_per_s, fresh.tokens_per_s)
    assert oracle.accepted == oracle.drafted  # the oracle verifies accepted slots only


def test_disco_classifier_as_the_budgets_estimator(traces):
    df = random_traces(16, 40, seed=4)
    drafted = df["oracle_drafted"].to_numpy(bool)
    model = fit_model("logistic", df[list(FEATURES)].to_numpy(float)[drafted], df["label"].to_numpy(int)[drafted])
    predict = model.torch_predictor(torch.device("cpu"), Calibration())
    load, total = _load(0.05), sum(len(tr) for tr in traces)
    full = simulate_adaptive_verification(traces, load, 4, 4, ClassifierConfidence(predict))
    stopping = simulate_adaptive_verification(traces, load, 4, 4, ClassifierConfidence(predict), stop_drafting=True)
    assert full.tokens == stopping.tokens == total
    assert full.positions == 4 * full.steps and stopping.positions < 4 * stopping.steps  # it stopped drafting
    assert stopping.proposed < full.proposed


# --- calibration figures ----------------------------------------------------------------------------------


def test_calibration_figures_on_known_probabilities():
    from sklearn.metrics import brier_score_loss, roc_auc_score

    rng = np.random.default_rng(0)
    p = rng.random(200_000)
    y = (rng.random(len(p)) < p).astype(int)
    good = calibration_figures(y, p)
    assert good["ece"] < 0.01
    assert good["auroc"] == pytest.approx(roc_auc_score(y, p)) and good["brier"] == pytest.approx(
        brier_score_loss(y, p)
    )
    bad = calibration_figures(y, p**2)  # |p - p^2| averages 1/6 over [0, 1]
    assert bad["ece"] == pytest.approx(1 / 6, abs=0.01) and bad["auroc"] == pytest.approx(good["auroc"])
    conf, rate, count = reliability(np.array([1, 0, 1, 1]), np.array([0.05, 0.05, 0.95, 1.0]))
    assert count.tolist() == [2, 0, 0, 0, 0, 0, 0, 0, 0, 2] and rate[0] == 0.5 and rate[-1] == 1.0
    assert conf[-1] == pytest.approx(0.975) and np.isnan(rate[1])


def test_calibration_report_per_position_before_and_after():
    rng = np.random.default_rng(1)
    n = 40_000
    positions = rng.integers(1, 4, n)
    p = np.clip(rng.beta(2, 2, n) - 0.1 * (positions - 1), 0.01, 0.99)  # known P(accept), lower deeper
    y = (rng.random(n) < p).astype(int)
    over = 1 / (1 + np.exp(-2.5 * np.log(p / (1 - p))))  # overconfident: Platt undoes it
    groups = rng.integers(0, 200, n).astype(str)
    report = calibration_report({"true": p, "over": over}, y, positions, groups, 3)
    assert report["positions"] == [1, 2, 3, "all"] and report["cross_fitted"]
    for key in report["positions"]:
        assert report["models"]["true"]["before"][key]["ece"] < 0.03
        assert report["models"]["over"]["before"][key]["ece"] > 0.08
        assert report["models"]["over"]["after"][key]["ece"] < 0.03
        rows = positions == key if key != "all" else slice(None)
        assert report["models"]["over"]["before"][key] == calibration_figures(y[rows], over[rows])


def test_disco_train_writes_the_calibration_report_and_a_reliability_diagram(tmp_path):
    traces_dir = write_traces(tmp_path / "t", random_traces(24, 40, seed=5))
    out = tmp_path / "m"
    report = train(TrainConfig([traces_dir], out, model="logistic", max_window=6, progress=False))
    md = (out / "metrics.md").read_text()
    assert "Calibration per draft position on the validation prompts" in md
    assert "10 equal-width bins" in md and "vLLM online estimator: vLLM 0.32's acceptance_estimator.py" in md
    assert "| disco logistic | 1 |" in md and "| vLLM online estimator | all |" in md
    assert (out / "reliability.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    cal = report.calibration
    assert set(cal["models"]) == {"disco logistic", "vLLM online estimator"} and len(cal["online"]["intercepts"]) == 6
    assert json.loads((out / "manifest.json").read_text())["rule"]  # the artifact as before


# --- the batched policies (BudgetPolicy: vLLM's draft through batch_policy.verified, simulate_batched) -----------


def _p_for(conf: torch.Tensor) -> torch.Tensor:
    """The draft's top-1 probabilities that the cold-start estimator maps to `conf`: sigmoid(INIT_SLOPE f + INIT_BIAS)."""
    return torch.sigmoid((torch.logit(conf.double()) - INIT_BIAS) / INIT_SLOPE).float()


def test_adaptive_verification_policy_trims_to_the_hand_computed_budget():
    """Two requests, two steps, the confidences of test_hand_computed_budget_on_a_2x3_batch each step: at the first
    the stale confidences are a new request's 1.0 (B* = 6: every slot), at the second the first step's (B* = 3, the
    slots 0.9, 0.72 | 0.6)."""
    policy = BatchAdaptiveVerification(3)
    states = [RequestState("a"), RequestState("b")]
    rows = RowState.fresh(2, "cpu")
    p = _p_for(CONF)
    got = []
    for step in range(2):
        batch = Batch.under(states, LINEAR, 3, rows)
        policy.update(
            rows, torch.tensor([3, 3]) if step else torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long)
        )
        assert policy.drafts(batch).tolist() == [True, True]
        policy.start(batch, torch.device("cpu"))
        live = torch.ones(2, dtype=torch.bool)
        for pos in (1, 2, 3):
            stop = policy.stops(pos, None, p[:, pos - 1], live)
            live = live & ~stop
        assert not bool(live.any())
        got.append(policy.trim(torch.tensor([3, 3])).tolist())
    assert got == [[3, 3], [2, 1]]
    assert policy.trim(torch.tensor([1, 0])).tolist() == [1, 0]  # never more than was drafted
    with pytest.raises(DiscoError, match="needs|load profile"):
        policy.drafts(Batch(states))


def test_budget_policies_in_simulate_batched(traces):
    """vLLM's method as a batched policy: where verification costs nothing more every slot pays, and it runs as
    vLLM's fixed length (the same counts and costs); where it costs, it verifies fewer than it drafted, as the
    lockstep simulation does, and every prompt ends. disco's learned budget stops drafting and calibrates."""
    flat, load = _load(0.0), _load(0.05)
    total = sum(len(tr) for tr in traces)
    for b in (1, 4):
        fixed = simulate_batched(traces, BatchConstant(4), flat, b, 4)
        assert simulate_batched(traces, BatchAdaptiveVerification(4), flat, b, 4) == fixed
        run = simulate_batched(traces, BatchAdaptiveVerification(4), load, b, 4)
        lockstep = simulate_adaptive_verification(traces, load, b, 4, "online")
        assert run.tokens == lockstep.tokens == total and run.steps == lockstep.steps
        assert run.drafted < fixed.drafted and abs(run.drafted - lockstep.drafted) <= 2  # (trace ends differ)
    df = random_traces(16, 40, seed=4)
    drafted = df["oracle_drafted"].to_numpy(bool)
    model = fit_model("logistic", df[list(FEATURES)].to_numpy(float)[drafted], df["label"].to_numpy(int)[drafted])
    policy = BatchLearnedBudget(model.torch_predictor(torch.device("cpu"), Calibration()), 4)
    run = simulate_batched(traces, policy, load, 4, 4)
    assert run.tokens == total and run.positions < 4 * run.steps  # it stopped drafting
    assert int(policy.calibration.seen[1]) > 0 and policy.calibration.refits > 0  # what was verified teaches it


def test_the_load_profile_extrapolated_as_vllm_extends_its_curves():
    """extrapolated: the profile as it is where it was timed, a straight line through its last two points past it."""
    load = CostModel(0.1, (1.0, 1.5), "p", (1.0, 1.5, 2.5, 3.0), (0.2, 0.3))
    e = extrapolated(load, 4, 2)  # 4 requests x 3 tokens
    assert e.c_step[:4] == load.c_step and e.c_step[4:] == pytest.approx([3.5, 4.0, 4.5, 5.0, 5.5, 6.0, 6.5, 7.0])
    assert e.c_draft == pytest.approx([0.2, 0.3, 0.4, 0.5]) and e.c_t == load.c_t


# --- held-out calibration (bench/vllm/adaptive/heldout.py) --------------------------------------------------


def test_heldout_calibration_fits_on_validation_traces_and_reports_the_test_ones(tmp_path):
    """The held-out script end to end on tiny traces: figures on the test rows only, every fit (the online
    logistic, each Platt scaling) on the validation rows; traces sharing prompts refused in one line."""
    import importlib.util
    from pathlib import Path

    from disco.policies.artifact import load_artifact
    from disco.training.fitting import online_logistic, online_proba, platt

    script = Path(__file__).resolve().parents[1] / "bench" / "vllm" / "adaptive" / "heldout.py"
    spec = importlib.util.spec_from_file_location("heldout", script)
    heldout = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(heldout)
    model = tmp_path / "m"
    train(
        TrainConfig(
            [write_traces(tmp_path / "tr", random_traces(24, 40, seed=5))],
            model,
            model="logistic",
            max_window=4,
            progress=False,
        )
    )
    frames = {name: random_traces(12, 40, seed=seed) for name, seed in (("val", 6), ("test", 7))}
    for name, df in frames.items():
        df["prompt_id"] = name + df["prompt_id"]
        write_traces(tmp_path / name, df)
    args = ["report", "--val", str(tmp_path / "val"), "--test", str(tmp_path / "test"), "--classifier", str(model)]
    r = heldout.main([*args, "--prompts", "all", "--out", str(tmp_path / "out")])

    def rows(df):  # drafted rows at window positions 1..4
        keep = df["oracle_drafted"].to_numpy(bool) & (df["window_pos"].to_numpy() <= 4)
        return df[list(FEATURES)].to_numpy(float)[keep], df["label"].to_numpy(int)[keep]

    (Xv, yv), (Xt, yt) = rows(frames["val"]), rows(frames["test"])
    assert r["positions"] == [1, 2, 3, 4, "all"] and r["rows"]["test"] == {"prompts": 12, "rows": len(yt)}
    m = load_artifact(model).model
    online = online_logistic(Xv, yv, 4)
    for name, p_val, p_test in (
        (heldout.DISCO, m.predict_proba(Xv), m.predict_proba(Xt)),
        (heldout.ONLINE, online_proba(online, Xv), online_proba(online, Xt)),
    ):
        figs = r["models"][name]
        assert figs["before"]["all"] == pytest.approx(calibration_figures(yt, p_test))
        assert figs["after"]["all"] == pytest.approx(calibration_figures(yt, platt(p_val, yv)(p_test)))
        third = Xt[:, FEATURES.index("window_pos")] == 3
        assert figs["before"][3] == pytest.approx(calibration_figures(yt[third], p_test[third]))
    # the online logistic cannot read the copy flag random_traces' acceptance depends on: disco's model can
    goals = r["goals"]
    assert goals["auroc"]["met"] and goals["auroc"]["disco"] >= goals["auroc"]["online"] + 0.02
    assert goals["ece_after"]["met"] == (r["models"][heldout.DISCO]["after"]["all"]["ece"] <= 0.02)
    md = (tmp_path / "out" / "heldout.md").read_text()
    assert "| vLLM online estimator | all |" in md and "goal ECE after calibration" in md
    assert json.loads((tmp_path / "out" / "heldout.json").read_text())["goals"] == goals
    assert (tmp_path / "out" / "reliability.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit, match="share prompts"):
        heldout.main([*args[:4], str(tmp_path / "val"), *args[5:], "--prompts", "all"])
    with pytest.raises(SystemExit, match="no drafted rows of held-out test prompts"):
        heldout.main(args)  # --prompts test: these tiny prompts are not the shipped test set
