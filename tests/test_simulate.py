"""The policy simulator: exact counts on hand-made traces, agreement with the real loop on stub
and tiny models, the cost model, and `disco profile`."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from helpers import ProbModel, cli, collected_trace, counts, random_traces, synthetic_trace
from tiny import POSITION_VOCAB as V
from tiny import position_stub_pair, tiny_pair

from disco.base.errors import DiscoError
from disco.core.cost import CostModel
from disco.core.features import TOKEN_CLASSES
from disco.loop.decode import DecodeConfig, GenStats, speculative_generate
from disco.policies.classifier import ClassifierPolicy
from disco.policies.policy_registry import make_policy
from disco.training.simulate import prompt_traces, replay_policy, simulate, simulate_many

# --- a hand-made trace: exact counts for each policy ----------------------------------------

LABELS = [1, 1, 0, 1, 1, 1, 1, 0, 1, 1]
P = [0.9, 0.9, 0.3, 0.9, 0.9, 0.35, 0.9, 0.9, 0.9, 0.9]


def run(policy, labels=LABELS, p=P, max_window=4, max_new=None, **kw):
    traces = prompt_traces(synthetic_trace("a", labels, p, max_window=max_window), max_new)
    return simulate(traces, policy, max_window, **kw)


def test_constant_counts():
    s = run(replay_policy("constant", k=2))
    # windows [0,1] acc 2 | [3,4] acc 2 | [6,7] acc 1 | budget: k_max = 1 at 8, bonus 9
    assert counts(s.stats[0]) == (10, 4, 7, [2, 2, 2, 1], [2, 2, 1, 1])
    assert s.approx_drafts == 0


def test_oracle_counts_stop_at_each_mismatch():
    s = run(replay_policy("oracle"))
    # [0,1,2] acc 2 | [3,4,5,6] acc 4 (cap) + bonus 7 | [8] k_max = 1, bonus 9
    assert counts(s.stats[0]) == (10, 3, 8, [3, 4, 1], [2, 4, 1])


def test_threshold_counts_and_drafting_past_a_mismatch():
    s = run(replay_policy("threshold", threshold=0.4))
    # tau 0.4 stops after 2 (p .3) and 5 (p .35): [0,1,2] acc 2 | [3,4,5] acc 3 + bonus 6 |
    # [7,8] (k_max 2; 7 mismatches, 8 drafted anyway) acc 0 | [8] (k_max 1) acc 1 + bonus 9
    assert counts(s.stats[0]) == (10, 4, 9, [3, 3, 2, 1], [2, 3, 0, 1])
    assert s.approx_drafts == 1  # position 8 was drafted after the mismatch at 7


def test_heuristic_counts():
    s = run(replay_policy("heuristic", k=1), max_window=20)
    # k 1: [0] + bonus 1 -> k 3: [2,3,4] acc 0 -> k 2: [3,4] + bonus 5 -> k 4, cut to k_max 3: [6,7,8] acc 1
    # -> k 3, k_max 1: [8] + bonus 9
    assert counts(s.stats[0]) == (10, 5, 10, [1, 3, 2, 3, 1], [1, 0, 2, 1, 1])
    assert s.approx_drafts == 3  # 3, 4 after the mismatch at 2; 8 after the one at 7


def test_target_only_and_budget():
    s = run(replay_policy("constant", k=3), max_window=0)
    assert counts(s.stats[0]) == (10, 10, 0, [], [])
    s = run(replay_policy("constant", k=3), max_new=4)  # a shorter budget replays y's prefix
    assert counts(s.stats[0]) == (4, 2, 3, [3], [2])  # [0,1,2] acc 2 + correction 2, then k_max 0


def test_eos_ends_the_trace_when_the_budget_is_larger():
    # y ended at EOS after 10 tokens of a 64-token budget: k_max is not cut by the budget at the end,
    # a window reaching y's last position ends there.
    s = run(replay_policy("constant", k=20), max_window=20, max_new=64)
    assert counts(s.stats[0]) == (10, 3, 19, [10, 7, 2], [2, 4, 2])


def test_classifier_replay_recomputes_window_features():
    model = ProbModel(lambda f: 0.1 if f["p_chosen"] < 0.4 else 0.9)
    s = run(replay_policy("classifier", classifier_setting=0.5, model=model))
    assert counts(s.stats[0]) == counts(run(replay_policy("threshold", threshold=0.4)).stats[0])
    seen = [(f["gen_pos"], f["window_pos"], round(f["window_prob_prod"], 4), f["prev_accepted"]) for f in model.seen]
    assert seen == [
        (0, 1, 0.9, 0),
        (1, 2, 0.81, 0),
        (2, 3, 0.243, 0),
        (3, 1, 0.9, 2),
        (4, 2, 0.81, 2),
        (5, 3, 0.2835, 2),
        (7, 1, 0.9, 3),
        (8, 2, 0.81, 3),
        (8, 1, 0.9, 0),
    ]


def test_many_policies_in_one_pass_equal_one_at_a_time():
    df = random_traces(6, 40, seed=3)
    traces = prompt_traces(df)
    model = ProbModel(lambda f: f["p_chosen"] * (1.2 if f["copy_1"] else 0.8) / f["window_pos"] ** 0.1)
    factories = {("clf", t): replay_policy("classifier", classifier_setting=t, model=model) for t in (0.3, 0.5, 0.7)}
    factories["oracle"] = replay_policy("oracle")
    together = simulate_many(traces, factories, 8)
    for key, factory in factories.items():
        alone = simulate(traces, factory, 8)
        assert [counts(s) for s in together[key].stats] == [counts(s) for s in alone.stats]


def test_oracle_replay_drafts_exactly_the_oracle_rows():
    df = random_traces(5, 50, seed=1)
    for tr, (_, rows) in zip(prompt_traces(df), df.groupby("prompt_id", sort=False)):
        s = simulate([tr], replay_policy("oracle"), 20).stats[0]
        assert s.draft_forwards == rows["oracle_drafted"].sum()
        assert len(s.windows) == rows.loc[rows["oracle_drafted"], "window_id"].nunique()


def test_bad_traces_are_clear_errors():
    df = synthetic_trace("a", LABELS)
    with pytest.raises(DiscoError, match="lack columns.*label"):
        prompt_traces(df.drop(columns=["label"]))
    with pytest.raises(DiscoError, match="gen_pos"):
        prompt_traces(pd.concat([df, df]))


# --- the cost model ----------------------------------------------------------------------------


def test_cost_model_speedup():
    cost = CostModel(0.5, (1.0, 1.5, 2.0))
    s = GenStats(new_tokens=10, target_forwards=4, draft_forwards=6, windows=[2, 2, 1], accepted_per_window=[2, 2, 1])
    # rounds: c_t(3) + c_t(3) + c_t(2) + one target-only c_t(1); drafts 6 * 0.5
    assert cost.time(s) == pytest.approx(2 + 2 + 1.5 + 1 + 3)
    assert cost.baseline(s) == 10
    with pytest.raises(DiscoError, match="max-window 3"):
        cost.verify(4)
    default = CostModel.default(4)
    assert default.c_d == 0.35 and len(default.c_t) == 5 and default.c_t[0] == 1.0
    # target-only decoding simulates to exactly 1x
    assert run(replay_policy("constant", k=2), max_window=0).speedup(default) == pytest.approx(1.0)


# --- agreement with the real loop ---------------------------------------------------------------

POLICIES = [
    ("constant", dict(k=3)),
    ("heuristic", dict(k=2)),
    ("threshold", dict(threshold=0.5)),
    ("threshold", dict(threshold=0.8)),
    ("threshold", dict(threshold=0.6, adaptive=True)),
    ("oracle", {}),
]


@pytest.mark.parametrize("name, kw", POLICIES)
def test_simulation_equals_real_runs_on_position_stubs(name, kw):
    target, draft = position_stub_pair()
    table = torch.zeros(V, dtype=torch.long)
    prompts = [[i % V] * (1 + i % 3) for i in range(6)]
    approx = 0
    for i, prompt in enumerate(prompts):
        max_new = 10 + 7 * i
        df = collected_trace(target, draft, prompt, max_new, table, f"p{i}", max_window=6)
        assert len(df) == max_new
        sim = simulate(prompt_traces(df, max_new), replay_policy(name, **kw), 6)
        y = df["target_token"].tolist()
        real = speculative_generate(
            target, draft, prompt, make_policy(name, target_tokens=y, **kw), DecodeConfig(max_new, 6)
        )
        assert real.tokens == y
        assert counts(sim.stats[0]) == counts(real.stats)
        approx += sim.approx_drafts
    if name == "threshold" and not kw.get("adaptive"):
        assert approx > 0  # the case the approximation is about is exercised (and exact here)


@pytest.fixture(scope="module")
def tiny_traces():
    target, draft = tiny_pair(noise=0.3)
    table = torch.arange(target.config.vocab_size) % len(TOKEN_CLASSES)
    prompts = [[(7 * i + 3 * j) % 90 + 3 for j in range(1 + i % 7)] for i in range(12)]
    frames = [collected_trace(target, draft, p, 24, table, f"p{i}", max_window=8) for i, p in enumerate(prompts)]
    return target, draft, table, prompts, frames


def _compare_real(tiny_traces, make_real, factory, max_window=8):
    """Simulated vs real counts per prompt; returns (exact prompts, prompts with approximated drafts, draft error)."""
    target, draft, _, prompts, frames = tiny_traces
    exact = approximated = 0
    sim_drafts = real_drafts = 0
    for prompt, df in zip(prompts, frames):
        y = df["target_token"].tolist()
        sim = simulate(prompt_traces(df), factory, max_window)
        s = sim.stats[0]
        real = speculative_generate(target, draft, prompt, make_real(y), DecodeConfig(24, max_window))
        assert real.tokens == y
        # always exact: the tokens committed per round and what was accepted
        assert (s.new_tokens, s.target_forwards, s.accepted_per_window) == (
            real.stats.new_tokens,
            real.stats.target_forwards,
            real.stats.accepted_per_window,
        )
        if sim.approx_drafts == 0:
            assert counts(s) == counts(real.stats)
            exact += 1
        else:
            approximated += 1
        sim_drafts += s.draft_forwards
        real_drafts += real.stats.draft_forwards
    return exact, approximated, abs(sim_drafts - real_drafts) / real_drafts


def test_oracle_simulation_equals_real_runs_on_tiny_models(tiny_traces):
    exact, approximated, err = _compare_real(
        tiny_traces, lambda y: make_policy("oracle", target_tokens=y), replay_policy("oracle")
    )
    assert approximated == 0 and err == 0


def test_threshold_simulation_matches_real_runs_on_tiny_models(tiny_traces):
    # tau 0.3 keeps drafting past many mismatches: the approximation is exercised and measured
    exact, approximated, err = _compare_real(
        tiny_traces, lambda y: make_policy("threshold", threshold=0.3), replay_policy("threshold", threshold=0.3)
    )
    assert exact > 0 and approximated > 0
    assert err < 0.1  # 5% of draft forwards on these random models


def test_live_classifier_policy_decides_as_the_replay(tiny_traces):
    table = tiny_traces[2]
    model = ProbModel(lambda f: f["p_chosen"] * (0.97 ** f["window_pos"]) * (1.1 if f["prev_accepted"] > 1 else 1))
    live = ClassifierPolicy(model, 0.45, table)
    exact, approximated, err = _compare_real(
        tiny_traces, lambda y: live.fresh(), replay_policy("classifier", classifier_setting=0.45, model=model)
    )
    assert exact > 0 and err < 0.1


def test_classifier_policy_needs_token_classes_live():
    target, draft = position_stub_pair()
    with pytest.raises(DiscoError, match="for_pair"):
        speculative_generate(target, draft, [0], ClassifierPolicy(ProbModel(lambda f: 0.5), 0.4), DecodeConfig(5, 3))


# --- disco profile -----------------------------------------------------------------------------


def test_profile_tiny_pair(tmp_path):
    from tiny import char_tokenizer

    from disco.jobs.profile import format_profile, profile_pair
    from disco.loop.pair import pair_from_models

    target, draft = tiny_pair(dtype=torch.float32)
    pair = pair_from_models(target, draft, char_tokenizer(), "tiny")
    prof = profile_pair(pair, max_window=3, context=40, repeats=3, warmup=1, progress=False)
    assert len(prof["c_t"]) == 4 and all(c > 0 for c in prof["c_t"]) and prof["c_d"] > 0
    assert prof["c_t_ratio"][0] == 1.0 and prof["pair"]["target"] == "tiny:target"
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof))
    cost = CostModel.load(path)
    assert cost.c_t == tuple(prof["c_t"]) and cost.source == str(path)
    assert "c_t(k)/c_t(1)" in format_profile(prof)
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(DiscoError, match="not a disco profile"):
        CostModel.load(bad)


def test_disco_profile_command(tmp_path, capsys, monkeypatch):
    from tiny import char_tokenizer, save_tiny

    from disco.base.defaults import DEFAULT_CPU_BACKEND
    from disco.sources.embedded import CACHE_ENV

    target, draft = tiny_pair(dtype=torch.float32)
    t, d = (
        save_tiny(target, char_tokenizer(), tmp_path / "target"),
        save_tiny(draft, char_tokenizer(), tmp_path / "draft"),
    )
    args = [
        "profile",
        "--target",
        t,
        "--draft",
        d,
        "--device",
        "cpu",
        "--max-window",
        2,
        "--context",
        30,
        "--repeats",
        2,
        "--warmup",
        0,
    ]
    code, stdout, err = cli(capsys, *args, "--out", tmp_path / "p.json")
    assert code == 0, err
    assert "c_d = " in stdout and CostModel.load(tmp_path / "p.json").c_t[0] > 0
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    code, _, err = cli(capsys, *args)
    assert code == 0, err
    (written,) = (tmp_path / "cache" / "profiles").iterdir()
    assert written.name == f"target__draft__cpu-{DEFAULT_CPU_BACKEND}__float32.json" and str(written) in err
    assert len(json.loads(written.read_text())["c_t"]) == 3
    code, _, err = cli(capsys, *args, "--context", 300)
    assert code == 2 and "exceeds the models' context" in err
