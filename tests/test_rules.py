"""Stopping rules beyond the per-token threshold: AdaEDL and SVIP (hand-computed), the classifier's
cumulative and cost-aware rules (simulated = live, the cost rule's "do not draft"), the acceptance
head's artifact, damaged trace shards, and compare's --policies."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from helpers import CONFIG, ProbModel, cli, collected_trace, counts, make_prompts, synthetic_trace
from tiny import POSITION_VOCAB as V
from tiny import position_stub_pair

from disco.base.errors import DiscoError
from disco.base.settings import SettingError
from disco.core.cost import CostModel
from disco.core.features import FEATURES, TOKEN_FEATURES
from disco.jobs.compare import default_entries, select_entries
from disco.loop.decode import DecodeConfig, speculative_generate
from disco.policies.artifact import (
    ARTIFACT_FORMAT,
    Calibration,
    DenseModel,
    integrity_sha256,
    load_artifact,
    rehash_artifact,
    save_artifact,
)
from disco.policies.batch_policy import BatchClassifier
from disco.policies.classifier import ClassifierPolicy, chosen_rule
from disco.policies.policy import AdaEDLPolicy, DraftStep, SVIPPolicy
from disco.policies.policy_registry import BuildContext, PolicySpec, make_policy
from disco.policies.rules import RULES as RULE_OBJECTS
from disco.policies.rules import forecast_after, forecast_relaxed
from disco.training.simulate import prompt_traces, replay_policy, simulate


def step_with_entropy(probs: list[float], pos: int = 1) -> DraftStep:
    p = torch.tensor(probs, dtype=torch.float64)
    return DraftStep(p.log(), p, torch.tensor(0), pos, pos - 1, torch.tensor([1]), [])


# --- AdaEDL and SVIP: hand-computed ----------------------------------------------------------------


def test_svip_stops_when_sqrt_c_entropy_exceeds_h():
    # H(0.5, 0.5) = ln 2 = 0.693 nats: sqrt(0.15 * 0.693) = 0.322 > 0.3 -> stop
    # H(0.9, 0.1) = 0.325 nats: sqrt(0.15 * 0.325) = 0.221 <= 0.3 -> go on
    svip = SVIPPolicy()
    assert svip.should_stop(step_with_entropy([0.5, 0.5]))
    assert not svip.should_stop(step_with_entropy([0.9, 0.1]))
    assert not SVIPPolicy(h=0.33).should_stop(step_with_entropy([0.5, 0.5]))  # 0.322 <= 0.33
    with pytest.raises(DiscoError, match="h must be at least 0"):  # a policy's knobs are checked by its spec
        make_policy("svip", h=-1)


def test_adaedl_bound_and_lambda_update():
    # bound = 1 - sqrt(0.2 * H): H = ln 2 -> 1 - sqrt(0.1386) = 0.62767; H(0.9, 0.1) -> 1 - 0.2550 = 0.7450
    assert 1 - math.sqrt(0.2 * math.log(2)) == pytest.approx(0.62767, abs=1e-5)
    pol = AdaEDLPolicy(lam=0.7, max_window=4)
    assert pol.should_stop(step_with_entropy([0.5, 0.5]))  # 0.628 < 0.7
    assert not pol.should_stop(step_with_entropy([0.9, 0.1]))  # 0.745 >= 0.7
    # Algorithm 1, by hand: AR = 0.5 * 0 + 0.5 * 3/4 = 0.375 < 0.9 -> lambda' = 0.71;
    # lambda = 0.9 * 0.7 + 0.1 * 0.71 = 0.701
    pol.update(4, 3)
    assert pol.ar == pytest.approx(0.375) and pol.lam == pytest.approx(0.701)
    # AR = 0.5 * 0.375 + 0.5 * 1 = 0.6875 < 0.9 -> up again: 0.9 * 0.701 + 0.1 * 0.711 = 0.702
    pol.update(2, 2)
    assert pol.lam == pytest.approx(0.702)
    # once AR >= alpha: a window shorter than the cap lowers lambda, a full one keeps it
    pol.ar = 1.0
    pol.update(2, 2)
    assert pol.lam == pytest.approx(0.9 * 0.702 + 0.1 * 0.692)
    lam = pol.lam
    pol.update(4, 4)
    assert pol.lam == pytest.approx(lam)
    fixed = AdaEDLPolicy(lam=0.7, adaptive=False)
    fixed.update(4, 0)
    assert fixed.lam == 0.7


@pytest.mark.parametrize(
    "name, kw",
    [
        ("adaedl", {}),
        ("adaedl", dict(lam=0.5)),
        ("adaedl", dict(lam=0.8, lam_adaptive=False)),
        ("svip", {}),
        ("svip", dict(h=0.45)),
    ],
)
def test_adaedl_and_svip_simulate_exactly_and_losslessly(name, kw):
    """Position stubs: teacher-forced features equal the live ones, so the counts must agree exactly."""
    target, draft = position_stub_pair()
    table = torch.zeros(V, dtype=torch.long)
    stopped_early = 0
    for i, prompt in enumerate([[i % V] * (1 + i % 3) for i in range(6)]):
        max_new = 10 + 7 * i
        df = collected_trace(target, draft, prompt, max_new, table, f"p{i}", max_window=6)
        sim = simulate(prompt_traces(df, max_new), replay_policy(name, max_window=6, **kw), 6)
        y = df["target_token"].tolist()
        real = speculative_generate(
            target, draft, prompt, make_policy(name, max_window=6, **kw), DecodeConfig(max_new, 6)
        )
        assert real.tokens == y
        assert counts(sim.stats[0]) == counts(real.stats)
        stopped_early += sum(w < 6 for w in real.stats.windows[:-1])
    assert stopped_early > 0  # the rule did stop windows


# --- the classifier's rules -------------------------------------------------------------------------

COST = CostModel(0.3, tuple(1.0 + 0.1 * k for k in range(9)))


def test_cumulative_rule_stops_when_a_rejection_becomes_likely():
    model = ProbModel(lambda f: 0.8)
    pol = ClassifierPolicy(model, 0.5, rule="cumulative")
    pol.start()
    # P(all accepted) = 0.8, 0.64, 0.512, 0.41: 1 - that passes 0.5 at the 4th token
    assert [pol.stops(0.8) for _ in range(4)] == [False, False, False, True]
    tokens = ClassifierPolicy(model, 0.75, rule="token")
    assert not any(tokens.stops(0.8) for _ in range(6))  # the per-token rule never stops at p = 0.8


def test_cost_rule_by_hand():
    # c_d = 0.3, c_t(k) = 1 + 0.1 (k - 1); rate to beat rho = r / c_t(1) = r.
    pol = ClassifierPolicy(ProbModel(lambda f: 0.5), 1.0, rule="cost", cost=COST)
    assert pol.drafts()  # a perfectly accepted window gains m tokens for 0.4 m: pays at r = 1
    pol.start()
    # after one token at p = 0.9: S = 0.9; one more gains 0.81 for 0.3 + 0.1 = 0.4: go on
    assert not pol.stops(0.9)
    # after a token at p = 0.2: S = 0.18; more gains 0.036, 0.0432, ... < 0.4 m: stop
    assert pol.stops(0.2)
    # at r = 3 one more token at p = 0.9 (gain 0.81) costs 3 * 0.4 = 1.2, two gain 1.54 for 2.4, ...: stop
    greedy = ClassifierPolicy(ProbModel(lambda f: 0.5), 3.0, rule="cost", cost=COST)
    greedy.start()
    assert greedy.stops(0.9)
    # an engine where no window pays even when all is accepted: the rule does not draft at all
    dear = CostModel(0.5, tuple(1.0 + 0.9 * k for k in range(9)))
    assert not ClassifierPolicy(ProbModel(lambda f: 1.0), 1.0, rule="cost", cost=dear).drafts()


@pytest.mark.parametrize(
    "rule, setting, cost",
    [
        ("cumulative", 0.6, COST),
        ("cumulative", 0.3, COST),
        ("cost", 1.0, COST),
        ("cost", 1.6, COST),
        ("cost-adaptive", 1.0, CostModel(0.3, tuple(1.0 + 0.3 * k for k in range(9)))),
        ("cost-adaptive", 1.0, CostModel(0.5, tuple(1.0 + 0.9 * k for k in range(9)))),
        ("cost", 1.0, CostModel(0.5, tuple(1.0 + 0.9 * k for k in range(9)))),
    ],
)
def test_classifier_rules_simulate_exactly_and_losslessly(rule, setting, cost):
    target, draft = position_stub_pair()
    table = torch.zeros(V, dtype=torch.long)
    model = ProbModel(lambda f: min(0.99, f["p_chosen"] * (0.8 + 0.2 * f["last_target_p"])))
    drafted = 0
    for i, prompt in enumerate([[i % V] * (1 + i % 3) for i in range(5)]):
        max_new = 12 + 5 * i
        df = collected_trace(target, draft, prompt, max_new, table, f"p{i}", max_window=6)
        sim = simulate(
            prompt_traces(df, max_new),
            replay_policy("classifier", classifier_setting=setting, model=model, classifier_rule=rule, cost=cost),
            6,
        )
        live = ClassifierPolicy(model, setting, table, rule, cost)
        real = speculative_generate(target, draft, prompt, live, DecodeConfig(max_new, 6))
        assert real.tokens == df["target_token"].tolist()
        assert counts(sim.stats[0]) == counts(real.stats)
        drafted += real.stats.drafted
    assert (drafted == 0) == (cost.c_d == 0.5)  # the dear engine: target-only decoding, nothing drafted


def test_cost_adaptive_rule_skips_where_acceptance_is_low_and_probes_again():
    # c_d = 0.3, c_t(k) = 1 + 0.3 (k - 1): a window of m tokens pays over target-only decoding when
    # sum_{l<=m} f^l > 0.6 m, i.e. only when tokens are accepted with f > ~0.6
    dear = CostModel(0.3, tuple(1.0 + 0.3 * k for k in range(9)))
    pol = ClassifierPolicy(ProbModel(lambda f: 0.5), 1.0, rule="cost-adaptive", cost=dear)
    assert pol.drafts()  # f = 1 at first
    pol.update(4, 0)  # nothing accepted: f = 0.5 * 1 + 0.5 * 0 = 0.5
    assert pol._forecast == pytest.approx(0.5)
    assert not pol.drafts()  # skipped: f moves a quarter of the way back to 1
    assert pol._forecast == pytest.approx(0.625)
    assert pol.drafts()  # 0.625 + 0.39 > 0.6 * 2 ... a window pays again: probe
    pol.update(3, 3)  # all accepted: f = 0.5 * 0.625 + 0.5 * 1
    assert pol._forecast == pytest.approx(0.8125)
    static = ClassifierPolicy(ProbModel(lambda f: 0.5), 1.0, rule="cost", cost=dear)
    static.update(4, 0)
    assert static.drafts()  # the static rule asks only whether a perfectly accepted window would pay


def test_target_signals_reach_the_classifier_as_the_loop_sees_them():
    """The simulated classifier reads last_* features computed from the trace's signal columns; the
    live one from the loop's verification: the decisions (hence counts) agree only if they are equal."""
    target, draft = position_stub_pair()
    table = torch.zeros(V, dtype=torch.long)
    model = ProbModel(lambda f: 0.95 if f["last_rejected"] == 0 and f["last_target_entropy"] < 1.0 else 0.3)
    df = collected_trace(target, draft, [1, 2], 40, table, "p", max_window=6)
    sim = simulate(prompt_traces(df, 40), replay_policy("classifier", classifier_setting=0.5, model=model), 6)
    real = speculative_generate(target, draft, [1, 2], ClassifierPolicy(model, 0.5, table), DecodeConfig(40, 6))
    assert counts(sim.stats[0]) == counts(real.stats)
    seen = {(r["last_rejected"], round(r["last_target_p"], 5)) for r in model.seen}
    assert len(seen) > 2  # the signals changed between windows


# --- the acceptance head: a safetensors artifact ------------------------------------------------

PAIR = {"target": "/models/tiny-target", "draft": "/models/tiny-draft", "tokenizer_hash": "abc"}


class DraftPair:
    def __init__(self, hidden: int):
        self.draft_hidden_size = hidden

    def describe(self):
        return dict(PAIR)


def _head(hidden_dim: int = 4) -> DenseModel:
    rng = np.random.default_rng(0)
    cols = [FEATURES.index("p_chosen"), FEATURES.index("last_target_p")]
    n_in = len(cols) + hidden_dim
    return DenseModel(
        "head",
        rng.normal(size=n_in),
        rng.random(n_in) + 0.5,
        [(rng.normal(size=(n_in, 8)), rng.normal(size=8)), (rng.normal(size=(8, 1)), rng.normal(size=1))],
        "relu",
        cols,
        hidden_dim,
    )


def test_head_artifact_round_trip_and_refusals(tmp_path):
    head = _head()
    folder = save_artifact(
        tmp_path / "h",
        head,
        {
            "setting": 0.5,
            "pair": PAIR,
            "calibration": {"a": 1.2, "b": -0.1},
            "hidden": {"dim": 4, "stored_dim": 4, "projection_seed": None},
        },
    )
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json", "model.safetensors"]
    art = load_artifact(folder, expect_pair=DraftPair(4))
    X = np.random.default_rng(1).random((7, len(FEATURES) + 4))
    assert art.hidden_dim == 4 and art.kind == "head"
    assert np.allclose(art.predict_proba(X), Calibration(1.2, -0.1)(head.predict_proba(X)))
    live = art.torch_predictor("cpu")
    assert np.allclose(
        [float(live(torch.tensor(row, dtype=torch.float32))) for row in X], art.predict_proba(X), atol=1e-5
    )
    policy = ClassifierPolicy(art, 0.5)
    assert policy.needs_hidden
    with pytest.raises(DiscoError, match="reads the draft's hidden state"):
        policy.features(torch.zeros(len(TOKEN_FEATURES)), 1)
    # a pair whose draft is wider than the one the head was trained on
    with pytest.raises(DiscoError, match="hidden state of 4 dims, but this pair's draft has 8"):
        load_artifact(folder, expect_pair=DraftPair(8))
    # a feature list it cannot read
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "columns": ["p_chosen", "target_mood"]}))
    with pytest.raises(DiscoError, match="does not compute"):
        load_artifact(folder)
    # the file is plain tensors: nothing in it can run code, and a tampered one is refused
    (folder / "manifest.json").write_text(json.dumps(manifest))
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (folder / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(DiscoError, match="modified after training"):
        load_artifact(folder)


def test_wide_hidden_states_are_projected_with_the_recorded_seed():
    from disco.core.features import HIDDEN_MAX_DIM, HIDDEN_PROJECTED_DIM, hidden_info, hidden_projection
    from disco.formats.trace import encode_hidden

    states = torch.randn(3, HIDDEN_MAX_DIM + 8)
    stored = [np.frombuffer(b, np.float16) for b in encode_hidden(states)]
    assert all(len(s) == HIDDEN_PROJECTED_DIM for s in stored)
    info = hidden_info(HIDDEN_MAX_DIM + 8)
    proj = hidden_projection(info["dim"], info["projection_seed"])  # what the live policy rebuilds
    np.testing.assert_allclose(stored[0], (states[0] @ proj).numpy(), rtol=1e-2, atol=1e-2)
    assert hidden_projection(896) is None and hidden_info(896)["stored_dim"] == 896


# --- damaged shards ---------------------------------------------------------------------------------


def test_damaged_shard_is_a_one_line_error_and_collect_redoes_it(pair32, tmp_path, capsys):
    from disco.formats.trace import read_trace_rows
    from disco.jobs.collect import collect

    out = tmp_path / "t"
    collect(pair32, make_prompts(6), out, CONFIG, shard_prompts=2, progress=False)
    shards = sorted((out / "data").glob("*.parquet"))
    whole = read_trace_rows(out)
    shards[1].write_bytes(shards[1].read_bytes()[:200])  # a copy cut short
    code, _, err = cli(capsys, "train", "--traces", out, "--out", tmp_path / "m")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert str(shards[1]) in err and "damaged" in err and "rerun the disco collect" in err
    stats = collect(pair32, make_prompts(6), out, CONFIG, shard_prompts=2, progress=False)
    assert stats.prompts_traced == 2 and stats.prompts_skipped == 4  # exactly that shard's prompts
    assert "set aside" in capsys.readouterr().err
    again = read_trace_rows(out)
    assert again.equals(whole)


# --- compare --policies -----------------------------------------------------------------------------


def test_policies_selects_rows(pair32):
    entries = default_entries(
        "models/x",
        3,
        0.5,
        pair=pair32,
        tuned={"adaedl_lambda": 0.6, "svip_h": 0.4, "rules": {"token": 0.9, "cost": 1.2}},
    )
    labels = [e.label for e in entries]
    for want in (
        "adaedl λ0=0.9",
        "adaedl λ0=0.6 (tuned)",
        "svip h=0.3",
        "svip h=0.4 (tuned)",
        "classifier",
        "classifier token rule 0.9 (tuned)",
        "classifier cost rule 1.2 (tuned)",
        "transformers",
    ):
        assert want in labels, want
    chosen = select_entries(entries, "classifier,svip")
    assert {e.spec.name for e in chosen} == {"classifier", "svip"} and len(chosen) == 3  # the shipped classifier
    chosen = select_entries(entries, "classifier,rules")  # ... and its other rules
    assert [e.label for e in chosen] == [
        "classifier",
        "classifier token rule 0.9 (tuned)",
        "classifier cost rule 1.2 (tuned)",
    ]
    assert [e.label for e in select_entries(entries, "transformers")] == ["transformers"]
    assert select_entries(entries, None) == entries
    with pytest.raises(DiscoError, match="unknown clasifier"):
        select_entries(entries, "clasifier")


def test_adaedl_and_svip_replay_on_a_hand_made_trace():
    trace = prompt_traces(synthetic_trace("a", [1, 1, 0, 1, 1, 1]))
    for name in ("adaedl", "svip"):
        assert simulate(trace, replay_policy(name), 4).totals.new_tokens == 6


# --- one rule, one name (issue 46): the rules' scalar and batched forms, the setting's name, early refusals ------


def _random_cost(rng: np.random.Generator) -> CostModel:
    top = int(rng.integers(3, 22))
    slope = float(rng.choice([0.0, rng.uniform(0.0, 0.3), rng.uniform(0.3, 1.0)]))
    return CostModel(float(rng.uniform(0.0, 0.5)), tuple(1.0 + slope * k for k in range(top)), "random")


@pytest.mark.parametrize("name", list(RULE_OBJECTS))
def test_scalar_and_batched_rules_decide_alike_on_random_rows(name):
    """Every rule's scalar form (the live loop, the simulator) and batched form (vLLM's draft) give the same
    decision, row by row, on a few hundred random rows: p, S, position, setting and cost model."""
    rule, rng = RULE_OBJECTS[name], np.random.default_rng(46)
    stops = drafts = 0
    for _ in range(8):
        cost = _random_cost(rng)
        top = len(cost.c_t)
        setting = float(rng.uniform(0.0, 1.0) if rule.setting_range.admits(1.0) else rng.uniform(0.0, 3.0))
        n = 50
        p = rng.uniform(0.0, 1.0, n)
        p[:5] = [0.0, 1.0, setting if setting <= 1 else 0.5, 1.0 - setting if setting <= 1 else 0.5, 0.999]
        survive = p * rng.uniform(0.0, 1.0, n) ** rng.integers(0, 4, n)
        for pos in (1, int(rng.integers(1, top + 2)), top):
            batched = rule.stops_rows(
                pos, torch.tensor(p), torch.tensor(survive), setting, cost, torch.ones(n, dtype=torch.bool)
            )
            scalar = [rule.stops(pos, float(a), float(s), setting, cost) for a, s in zip(p, survive)]
            assert batched.tolist() == scalar
            stops += sum(scalar)
        forecast = rng.uniform(0.0, 1.0, n)
        batched = rule.drafts_rows(torch.tensor(forecast), setting, cost)
        scalar = [rule.drafts(float(f), setting, cost) for f in forecast]
        assert batched.tolist() == scalar
        drafts += sum(scalar)
    assert 0 < stops < 8 * 3 * 50  # both answers occur: the comparison is not vacuous
    if rule.forecasts:
        assert 0 < drafts < 8 * 50


def test_the_forecast_is_the_same_arithmetic_for_one_request_and_for_rows():
    rng = np.random.default_rng(7)
    f = rng.uniform(0, 1, 200)
    drafted = rng.integers(1, 9, 200)
    accepted = np.minimum(rng.integers(0, 9, 200), drafted)
    rows = forecast_after(torch.tensor(f), torch.tensor(drafted), torch.tensor(accepted).double())
    assert rows.tolist() == [forecast_after(float(a), int(d), int(k)) for a, d, k in zip(f, drafted, accepted)]
    assert forecast_relaxed(torch.tensor(f)).tolist() == [forecast_relaxed(float(a)) for a in f]


def test_an_unknown_rule_or_a_setting_outside_the_rules_range_is_refused_by_the_spec():
    with pytest.raises(DiscoError, match=r"unknown classifier rule 'costly': choose one of token, cumulative, cost, "):
        PolicySpec("classifier", classifier_rule="costly", classifier_setting=1.0)
    with pytest.raises(SettingError, match=r"classifier_setting must be within \[0, 1\] \(got 1.5\)"):
        PolicySpec("classifier", classifier_rule="token", classifier_setting=1.5)
    assert PolicySpec("classifier", classifier_rule="cost", classifier_setting=1.5).classifier_setting == 1.5
    # the batched form no longer falls through to the cost rule's branch for a name it does not know
    with pytest.raises(DiscoError, match="unknown classifier rule 'costly'"):
        BatchClassifier(lambda x: x[:, 0], "costly", 1.0, COST)
    with pytest.raises(DiscoError, match="the cost-adaptive rule needs the pair's cost model"):
        BatchClassifier(lambda x: x[:, 0], "cost-adaptive", 1.0, None)


def test_an_unknown_rule_is_one_line_exit_2_before_any_model_loads(capsys, monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("a pair was loaded before the rule was checked")

    monkeypatch.setattr("disco.loop.pair.load_pair", no_loading)
    code, out, err = cli(
        capsys, "generate", "--prompt", "x", "--policy", "classifier", "--classifier", "embedded-qwen2.5-coder",
        "--classifier-rule", "costly", "--classifier-setting", "1.0",
    )  # fmt: skip
    assert code == 2 and out == ""
    assert err == (
        "error: unknown classifier rule 'costly': choose one of token, cumulative, cost, cost-adaptive "
        "(--classifier-rule)\n"
    )
    code, out, err = cli(
        capsys, "generate", "--prompt", "x", "--policy", "classifier", "--classifier-rule", "token",
        "--classifier-setting", "1.5",
    )  # fmt: skip
    assert (code, err) == (2, "error: --classifier-setting must be within [0, 1] (got 1.5)\n")


def test_the_setting_flows_by_one_name_from_the_cli_to_the_rule(capsys, monkeypatch):
    """--classifier-setting -> PolicySpec.classifier_setting -> the policy's `setting`, which its rule decides by;
    the old flag --classifier-threshold still reads, with a warning, and never beside the new one."""
    specs = []
    monkeypatch.setattr("disco.cli.commands.generate", lambda prompt, prompts, spec, *rest: specs.append(spec))
    args = ("generate", "--prompt", "x", "--policy", "classifier", "--classifier", "embedded-qwen2.5-coder")
    args += ("--classifier-rule", "token")
    code, _, err = cli(capsys, *args, "--classifier-setting", "0.37")
    assert (code, err) == (0, "")
    code, _, err = cli(capsys, *args, "--classifier-threshold", "0.37")
    assert code == 0 and "--classifier-threshold is deprecated: use --classifier-setting" in err
    code, _, err = cli(capsys, *args, "--classifier-threshold", "0.3", "--classifier-setting", "0.4")
    assert (code, err.count("\n")) == (2, 1) and "give only the latter" in err
    assert [s.classifier_setting for s in specs] == [0.37, 0.37]
    policy = specs[0].kind.build(specs[0], BuildContext(model=ProbModel(lambda f: 0.5)))
    assert (policy.rule, policy.setting) == ("token", 0.37)
    policy.start()
    assert [policy.stops(p) for p in (0.38, 0.37, 0.36)] == [False, False, True]


def test_an_old_manifest_with_threshold_still_loads(tmp_path):
    """Format 2 recorded the rule's setting as "threshold"; format 3 names it "setting" (its one name)."""
    n = len(FEATURES)
    model = DenseModel(
        "logistic", np.zeros(n), np.ones(n), [(np.full((n, 1), 0.1), np.zeros(1))], "identity", list(range(n))
    )
    folder = save_artifact(tmp_path / "a", model, {"setting": 0.42, "rule": "cumulative", "pair": {}})
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["format"] == ARTIFACT_FORMAT == 3 and "threshold" not in manifest
    assert load_artifact(folder).setting == 0.42
    # as a format-2 disco wrote it
    manifest["threshold"] = manifest.pop("setting")
    manifest["format"] = 2
    manifest["integrity_sha256"] = integrity_sha256(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    old = load_artifact(folder)
    assert old.setting == 0.42 and chosen_rule(old) == ("cumulative", 0.42)
    # the old key in a format-3 manifest is an edit, refused like any other
    manifest["format"] = 3
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DiscoError, match="lacks or garbles a required field"):
        load_artifact(folder)
    # rehash_artifact brings it to the current format, under the new name
    manifest["format"] = 2
    (folder / "manifest.json").write_text(json.dumps(manifest))
    rehash_artifact(folder)
    upgraded = json.loads((folder / "manifest.json").read_text())
    assert (upgraded["format"], upgraded["setting"], "threshold" in upgraded) == (3, 0.42, False)
    assert load_artifact(folder).setting == 0.42
    # a shipped artifact (format 2) reads its setting by the old key
    shipped = load_artifact("embedded-qwen2.5-coder")
    assert shipped.setting == shipped.manifest["threshold"]
