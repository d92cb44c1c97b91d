"""Sampling (temperature > 0): the loop keeps the target's distribution under every policy, sampled
traces record what the live loop would see, and the simulator's expected counts are the live mean."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import ProbModel, make_prompts, synthetic_trace
from scipy.stats import chisquare
from tiny import POSITION_VOCAB as V
from tiny import VOCAB, DistStubLM, position_stub_pair

import disco.loop.decode as decode_mod
from disco.base.errors import DiscoError
from disco.core.features import token_class_table
from disco.formats.trace import read_trace_rows
from disco.jobs.collect import collect, coupled_draft, teacher_forced_trace, trace_prompt
from disco.loop.decode import DecodeConfig, speculative_generate, target_generate, warp
from disco.loop.pair import Pair
from disco.policies.artifact import SamplingMismatch, load_artifact
from disco.policies.classifier import ClassifierPolicy
from disco.policies.policy_registry import make_policy
from disco.training.simulate import prompt_traces, replay_policy, simulate

SAMPLED = DecodeConfig(max_new_tokens=16, max_window=5, temperature=0.8, top_p=0.9, seed=7)


# --- the coupling behind sampled traces ------------------------------------------------------------


def test_coupled_draft_has_the_loops_joint_law():
    """Given y ~ p, coupled_draft's draft token is distributed as q, accepted with probability
    sum min(p, q) overall and min(1, p(x)/q(x)) given x, as rejection sampling accepts."""
    g = torch.Generator().manual_seed(0)
    vocab, n = 6, 40000
    p = torch.softmax(torch.randn(vocab, generator=g) * 1.5, 0)
    q = torch.softmax(torch.randn(vocab, generator=g) * 1.5, 0)
    y = torch.multinomial(p, n, replacement=True, generator=g)
    x, accepted = coupled_draft(p.expand(n, vocab), q.expand(n, vocab), y, g)
    assert (x[accepted] == y[accepted]).all() and (x[~accepted] != y[~accepted]).all()
    assert chisquare(torch.bincount(x, minlength=vocab).numpy(), (q * n).numpy()).pvalue > 1e-3
    alpha = float(torch.minimum(p, q).sum())
    assert abs(float(accepted.float().mean()) - alpha) < 4 * (alpha * (1 - alpha) / n) ** 0.5
    for tok in range(vocab):
        mine = x == tok
        want = min(1.0, float(p[tok] / q[tok]))
        got = float(accepted[mine].float().mean())
        assert abs(got - want) < 4 * max(want * (1 - want), 1e-3) ** 0.5 / int(mine.sum()) ** 0.5 + 1e-9, tok
    # a draft token drawn from q independently of y would be accepted (x == y) with sum p*q instead
    naive = torch.multinomial(q, n, replacement=True, generator=g) == y
    assert abs(float(naive.float().mean()) - alpha) > 0.05


def test_sampled_trace_records_min_1_p_over_q_of_the_warped_distributions(pair32):
    pair = pair32
    classes = token_class_table(pair.tokenizer, VOCAB)
    prompt = pair.encode("def f(x):\n    return x")
    y = target_generate(pair.target, prompt, SAMPLED, pair.eos_token_ids).tokens
    df = teacher_forced_trace(pair, prompt, y, SAMPLED, classes, "p", "t").to_pandas()
    ids = torch.tensor([prompt + y])
    with torch.no_grad():
        t_logits = pair.target(ids).logits[0, len(prompt) - 1 : -1]
        d_logits = pair.draft(ids).logits[0, len(prompt) - 1 : -1]
    p, q = warp(t_logits, 0.8, 0.9), warp(d_logits, 0.8, 0.9)
    x = torch.tensor(df["draft_token"].to_numpy())
    rows = torch.arange(len(y))
    assert (q[rows, x] > 0).all()  # the draft token is one the draft can sample
    want = (p[rows, x] / q[rows, x]).clamp_max(1.0).numpy()
    np.testing.assert_allclose(df["accept_prob"], want, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(df["draft_prob"], q[rows, x].numpy(), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(df["target_prob_target"], p[rows, torch.tensor(y)].numpy(), rtol=1e-4, atol=1e-7)
    assert (df["label"] == (df["draft_token"] == df["target_token"])).all()
    assert (df.loc[df["label"] == 0, "accept_prob"] < 1).all()  # a token min(1, p/q) = 1 is never rejected
    # the token features are those of the warped draft distribution
    np.testing.assert_allclose(df["p_chosen"], q[rows, x].numpy(), rtol=1e-4, atol=1e-7)


def test_sampled_collection_is_seeded_per_prompt_and_resumes(pair32, tmp_path):
    prompts = make_prompts(4)
    out = tmp_path / "t"
    collect(pair32, prompts[:2], tmp_path / "x", SAMPLED, progress=False)  # another folder: other prompt list
    stats = collect(pair32, prompts, out, SAMPLED, progress=False, shard_prompts=1)
    assert stats.prompts_traced == 4
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["generation"]["temperature"] == 0.8 and manifest["generation"]["top_p"] == 0.9
    assert manifest["generation"]["seed"] == 7
    whole = read_trace_rows(out)
    # a prompt's rows do not depend on what else the run traced: the first two equal the other folder's
    first = read_trace_rows(tmp_path / "x")
    pd.testing.assert_frame_equal(whole[whole["prompt_id"].isin(first["prompt_id"])].reset_index(drop=True), first)
    # another temperature cannot resume into the folder
    with pytest.raises(DiscoError, match="generation.temperature"):
        collect(pair32, prompts, out, dataclasses.replace(SAMPLED, temperature=1.0), progress=False)


# --- the simulator's expected counts are the live loop's mean --------------------------------------


def _sampled_stub_traces(n: int, max_new: int, max_window: int) -> tuple[list, object, object]:
    target, draft = position_stub_pair()
    pair = Pair(target, draft, None, "t", "d", torch.device("cpu"), torch.float64, frozenset())
    table = torch.zeros(V, dtype=torch.long)
    frames = [
        trace_prompt(pair, [1], DecodeConfig(max_new, max_window, 1.0, 1.0, seed), table, f"s{seed}").to_pandas()
        for seed in range(n)
    ]
    return frames, target, draft


@pytest.mark.parametrize("name, kw", [("constant", dict(k=3)), ("threshold", dict(threshold=0.5))])
def test_expected_counts_equal_the_mean_of_live_sampled_runs(name, kw):
    n, max_new, window = 300, 14, 4
    frames, target, draft = _sampled_stub_traces(n, max_new, window)
    df = pd.concat(frames, ignore_index=True)
    expected = simulate(prompt_traces(df, max_new, expected=True), replay_policy(name, **kw), window)
    sampled = simulate(prompt_traces(df, max_new), replay_policy(name, **kw), window)
    live = [
        speculative_generate(
            target, draft, [1], make_policy(name, **kw), DecodeConfig(max_new, window, 1.0, 1.0, s)
        ).stats
        for s in range(10_000, 10_000 + n)
    ]

    def per_run(stats, key):
        return np.array([float(getattr(s, key)) for s in stats])

    for key in ("accepted", "draft_forwards", "target_forwards"):
        a, b = per_run(live, key), per_run(expected.stats, key)
        se = (a.var() / n + b.var() / n) ** 0.5
        assert abs(a.mean() - b.mean()) < 4 * se + 1e-9, (key, a.mean(), b.mean())
        c = per_run(sampled.stats, key)
        assert abs(a.mean() - c.mean()) < 4 * (a.var() / n + c.var() / n) ** 0.5 + 1e-9, (key, a.mean(), c.mean())
    # tokens per target forward, the throughput the speedup is made of
    tpf = lambda stats: sum(s.new_tokens for s in stats) / sum(s.target_forwards for s in stats)  # noqa: E731
    assert tpf(expected.stats) == pytest.approx(tpf(live), rel=0.03)


def test_expected_counts_by_hand():
    """Two windows of a made-up sampled trace: sum over m of prod_{i<=m} min(1, p/q)."""
    df = synthetic_trace("a", [1, 0, 1, 1, 1, 1], max_window=2)
    df["accept_prob"] = [0.5, 0.4, 1.0, 0.8, 0.9, 0.7]
    stats = simulate(prompt_traces(df, expected=True), replay_policy("constant", k=2), 2).stats[0]
    # windows at 0 (drafts 0, 1: one accepted, then the target's token at 1) and 2 (drafts 2, 3: both
    # accepted, bonus at 4), then 5 is the last token: a target-only round
    assert stats.windows == [2, 2]
    assert stats.accepted_per_window == pytest.approx([0.5 + 0.5 * 0.4, 1.0 + 1.0 * 0.8])
    assert stats.new_tokens == pytest.approx(0.7 + 1 + 1.8 + 1 + 1)


# --- the loop samples from the target's distribution under every policy ----------------------------

VOCAB_SMALL = 12  # at least the 10 top probabilities the classifier's features read


def _policies() -> dict:
    table = torch.zeros(VOCAB_SMALL, dtype=torch.long)
    return {
        "constant": lambda: make_policy("constant", k=2),
        "heuristic": lambda: make_policy("heuristic", k=2),
        "threshold": lambda: make_policy("threshold", threshold=0.35),
        "threshold adaptive": lambda: make_policy("threshold", threshold=0.35, adaptive=True),
        "adaedl": lambda: make_policy("adaedl", lam=0.3, max_window=3),
        "svip": lambda: make_policy("svip", h=0.55),
        "classifier": lambda: ClassifierPolicy(ProbModel(lambda f: f["p_chosen"]), 0.4, table),
        "classifier cumulative": lambda: ClassifierPolicy(ProbModel(lambda f: f["p_chosen"]), 0.6, table, "cumulative"),
    }


def _first_tokens(policy, n: int, length: int = 4) -> tuple[torch.Tensor, list]:
    vocab = VOCAB_SMALL
    g = torch.Generator().manual_seed(1)

    def peaked(peak: float, j: int) -> torch.Tensor:
        """`peak` on token j, the rest spread at random: the draft is confident or not at each position
        depending on the token it samples, so the policies stop at varying window positions."""
        rest = torch.softmax(torch.randn(vocab, generator=g) * 0.5, 0)
        rest[j] = 0
        out = rest / rest.sum() * (1 - peak)
        out[j] = peak
        return out

    p_rows = [peaked(pk, j) for j, pk in enumerate((0.5, 0.45, 0.4, 0.6)[:length])]
    q_rows = [peaked(pk, j) for j, pk in enumerate((0.7, 0.3, 0.6, 0.8)[:length])]
    target = DistStubLM(lambda pos: p_rows[min(pos, length - 1)], vocab)
    draft = DistStubLM(lambda pos: q_rows[min(pos, length - 1)], vocab)
    counts = torch.zeros(length, vocab)
    windows = set()
    for seed in range(n):
        res = speculative_generate(target, draft, [0], policy(), DecodeConfig(length, 3, 1.0, 1.0, seed))
        for j, t in enumerate(res.tokens):
            counts[j, t] += 1
        windows.add(tuple(res.stats.windows))
    return counts, p_rows, windows


def _matches(counts: torch.Tensor, p_rows: list) -> bool:
    n = counts[0].sum()
    return all(chisquare(counts[j].numpy(), (p_rows[j] * n).numpy()).pvalue > 1e-4 for j in range(len(p_rows)))


@pytest.mark.parametrize("name", list(_policies()))
def test_every_policy_samples_the_target_distribution(name):
    counts, p_rows, windows = _first_tokens(_policies()[name], 2500)
    assert len(windows) > 2  # the windows end in different places from run to run
    assert _matches(counts, p_rows), (name, counts)


_CORRECT_REJECTION_SAMPLE = decode_mod._rejection_sample


def _broken_rejection_sample(p, q_rows, draft_ids, gen):
    """A classic bug: after a rejection, sample from p instead of the residual max(0, p - q)."""
    n, _ = _CORRECT_REJECTION_SAMPLE(p, q_rows, draft_ids, gen)
    return n, torch.multinomial(p[n], 1, generator=gen).squeeze(-1)


@pytest.mark.parametrize("name", ["constant", "classifier"])
def test_the_distribution_test_fails_for_a_broken_sampler(name, monkeypatch):
    monkeypatch.setattr(decode_mod, "_rejection_sample", _broken_rejection_sample)
    counts, p_rows, _ = _first_tokens(_policies()[name], 2500)
    assert not _matches(counts, p_rows)


# --- artifacts remember their sampling setting ------------------------------------------------------


def test_artifact_warns_at_another_temperature(tmp_path):
    import warnings

    from disco.policies.artifact import DenseModel, save_artifact

    model = DenseModel("logistic", np.zeros(2), np.ones(2), [(np.ones((2, 1)), np.zeros(1))], "identity", [0, 1])
    save_artifact(tmp_path / "a", model, {"setting": 0.5, "sampling": {"temperature": 0.7, "top_p": 0.95}}, "# m\n")
    art = load_artifact(tmp_path / "a")
    assert art.sampling == {"temperature": 0.7, "top_p": 0.95}
    with pytest.warns(SamplingMismatch, match="trained for temperature 0.7, top-p 0.95 but runs at greedy decoding"):
        art.check_sampling(0.0, 1.0)
    with pytest.warns(SamplingMismatch, match="runs at temperature 1, top-p 0.95"):
        art.check_sampling(1.0, 0.95)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        art.check_sampling(0.7, 0.95)  # its own setting: silent


def test_sampled_traces_match_live_runs_on_tiny_models():
    """On a real (tiny) pair, whose distributions depend on the context, the one approximation of
    sampled traces is greedy's (drafting past a rejection): accepted tokens and rounds average to the
    live loop's, and draft forwards come close."""
    from tiny import tiny_pair

    target, draft = tiny_pair(noise=0.3)
    pair = Pair(target, draft, None, "t", "d", torch.device("cpu"), torch.float64, frozenset())
    table = torch.arange(VOCAB) % 3
    n, max_new, window, prompt = 80, 12, 4, [5, 9, 14]
    frames = [
        trace_prompt(pair, prompt, DecodeConfig(max_new, window, 1.0, 0.95, s), table, f"s{s}").to_pandas()
        for s in range(n)
    ]
    sim = simulate(
        prompt_traces(pd.concat(frames, ignore_index=True), max_new, expected=True),
        replay_policy("threshold", threshold=0.3),
        window,
    )
    live = [
        speculative_generate(
            target, draft, prompt, make_policy("threshold", threshold=0.3), DecodeConfig(max_new, window, 1.0, 0.95, s)
        ).stats
        for s in range(1000, 1000 + n)
    ]
    for key, slack in (("accepted", 0.0), ("target_forwards", 0.0), ("draft_forwards", 0.05)):
        a = np.array([float(getattr(s, key)) for s in live])
        b = np.array([float(getattr(s, key)) for s in sim.stats])
        assert abs(a.mean() - b.mean()) < 4 * (a.var() / n + b.var() / n) ** 0.5 + slack * a.mean(), (
            key,
            a.mean(),
            b.mean(),
        )
