"""The speculative loop: exact counts on stub models, greedy losslessness on tiny real models,
distribution preservation under sampling."""

import pytest
import torch
from scipy.stats import chisquare
from tiny import DistStubLM, StubLM, tiny_pair

from disco.base.errors import DiscoError
from disco.loop.decode import DecodeConfig, speculative_generate, target_generate
from disco.policies.policy import ConstantPolicy, HeuristicPolicy, OraclePolicy, ThresholdPolicy
from disco.policies.policy_registry import make_policy

V = 16
count = lambda t, i: (t + 1) % V  # noqa: E731  the target's rule: next token = previous + 1


def run(draft_rule, policy, max_new, eos=frozenset(), prompt=(0,), confidence=lambda i: 0.9, window=20):
    target = StubLM(count, V)
    draft = StubLM(draft_rule, V, confidence)
    res = speculative_generate(target, draft, list(prompt), policy, DecodeConfig(max_new, window), set(eos))
    return res, target, draft


def test_always_accept_constant():
    res, target, draft = run(count, ConstantPolicy(4), 10)
    assert res.tokens == list(range(1, 11))
    s = res.stats
    assert (s.windows, s.accepted_per_window) == ([4, 4], [4, 4])
    assert (s.target_forwards, s.draft_forwards, s.drafted, s.accepted) == (2, 8, 8, 8)
    # (cache length before the call, tokens fed): the target never recomputes a token
    assert target.calls == [(0, 5), (5, 5)]
    assert draft.calls == [(0, 1), (1, 1), (2, 1), (3, 1), (4, 2), (6, 1), (7, 1), (8, 1)]


def test_never_accept_shrinks_window_at_the_budget():
    res, target, _ = run(lambda t, i: (t + 2) % V, ConstantPolicy(3), 5)
    assert res.tokens == [1, 2, 3, 4, 5]
    s = res.stats
    assert (s.windows, s.accepted_per_window) == ([3, 3, 2, 1], [0, 0, 0, 0])
    assert (s.target_forwards, s.draft_forwards) == (5, 9)
    assert [start for start, _ in target.calls] == [0, 1, 2, 3, 4]  # rolled back to the accepted prefix


def test_sometimes_accept_rolls_back_both_caches():
    res, target, draft = run(lambda t, i: (t + 1 + (i % 3 == 2)) % V, ConstantPolicy(3), 9)
    assert res.tokens == list(range(1, 10))
    assert (res.stats.windows, res.stats.accepted_per_window) == ([3, 3, 2], [2, 2, 2])
    assert target.calls == [(0, 4), (3, 4), (6, 3)]
    assert draft.calls == [(i, 1) for i in range(8)]


def test_heuristic_grows_by_two():
    res, _, _ = run(count, HeuristicPolicy(2), 20)
    assert res.stats.windows == [2, 4, 6, 4]
    shrink = HeuristicPolicy(5)
    shrink.update(5, 3)
    shrink.update(4, 0)
    assert shrink.k == 3
    shrink.update(1, 0), shrink.update(1, 0), shrink.update(1, 0)
    assert shrink.k == 1


def test_threshold_stops_after_a_low_probability_token():
    conf = lambda i: 0.3 if i % 5 == 4 else 0.9  # noqa: E731
    res, _, _ = run(count, ThresholdPolicy(0.4), 12, confidence=conf)
    assert res.tokens == list(range(1, 13))
    assert res.stats.windows == [5, 4]
    assert res.stats.target_forwards == 3


def test_eos_inside_window_and_as_bonus():
    res, _, _ = run(count, ConstantPolicy(4), 10, eos={3})
    assert res.tokens == [1, 2, 3]
    res, _, _ = run(count, ConstantPolicy(4), 10, eos={5})
    assert res.tokens == [1, 2, 3, 4, 5]
    assert res.stats.target_forwards == 1


def test_oracle_stops_exactly_at_first_mismatch():
    rule = lambda t, i: (t + 1 + (i % 3 == 2)) % V  # noqa: E731
    res, _, _ = run(rule, OraclePolicy(list(range(1, 10))), 9)
    # the mismatching token is drafted (that is how the oracle sees it) then replaced
    assert res.stats.windows == [3, 3, 2]
    assert res.stats.accepted_per_window == [2, 2, 2]


def test_adaptive_threshold_moves():
    pol = ThresholdPolicy(0.4, adaptive=True)
    for probs, accepted in [([0.9, 0.8, 0.2], 2), ([0.95, 0.3], 1), ([0.7, 0.6, 0.1], 2), ([0.5, 0.25], 1)]:
        pol.start()
        for p in probs:
            pol._window_probs.append(p)
        pol.update(len(probs), accepted)
    # the accepted probabilities are all >= 0.5, the rejected ones <= 0.3
    assert 0.3 < pol.threshold <= 0.5


# --- tiny real models: greedy output identical to the target's for every policy ---------------

PROMPTS = [[(7 * i + 3 * j) % 90 + 3 for j in range(1 + i % 7)] for i in range(20)]


@pytest.fixture(scope="module")
def models():
    return tiny_pair(noise=0.3)


def test_target_loop_matches_transformers_generate(models):
    target, _ = models
    for prompt in PROMPTS[:5]:
        ours = target_generate(target, prompt, DecodeConfig(max_new_tokens=12)).tokens
        ref = target.generate(
            torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0
        )
        assert ours == ref[0, len(prompt) :].tolist()


@pytest.mark.parametrize("policy_name", ["constant", "heuristic", "threshold", "adaptive", "oracle"])
def test_greedy_lossless_every_policy(models, policy_name):
    target, draft = models
    total_accepted = 0
    for i, prompt in enumerate(PROMPTS):
        max_new = [1, 2, 7, 16, 33][i % 5]
        ref = target_generate(target, prompt, DecodeConfig(max_new_tokens=max_new)).tokens
        policy = make_policy(
            policy_name if policy_name != "adaptive" else "threshold",
            adaptive=policy_name == "adaptive",
            k=3,
            target_tokens=ref,
        )
        res = speculative_generate(target, draft, prompt, policy, DecodeConfig(max_new_tokens=max_new, max_window=6))
        assert res.tokens == ref, (policy_name, prompt)
        assert res.stats.new_tokens == max_new
        assert all(w <= 6 for w in res.stats.windows)
        total_accepted += res.stats.accepted
    assert total_accepted > 0  # the draft does agree sometimes: the accept path is exercised


def test_greedy_lossless_with_eos_mid_window(models):
    target, draft = models
    hits = 0
    for prompt in PROMPTS:
        ref = target_generate(target, prompt, DecodeConfig(max_new_tokens=20)).tokens
        eos = {ref[6]}  # pretend the 7th generated token is an end-of-sequence token
        ref_eos = target_generate(target, prompt, DecodeConfig(max_new_tokens=20), eos).tokens
        assert ref_eos == ref[: ref.index(ref[6]) + 1]
        res = speculative_generate(target, draft, prompt, ConstantPolicy(5), DecodeConfig(20, 8), eos)
        assert res.tokens == ref_eos
        hits += any(w > 0 for w in res.stats.accepted_per_window)
    assert hits > 0


def test_bad_config_is_a_clear_error(models):
    target, draft = models
    with pytest.raises(DiscoError, match="max_new_tokens"):
        speculative_generate(target, draft, [5], ConstantPolicy(2), DecodeConfig(max_new_tokens=0))
    with pytest.raises(DiscoError, match="empty"):
        speculative_generate(target, draft, [], ConstantPolicy(2), DecodeConfig())
    with pytest.raises(DiscoError, match="k must be"):  # a policy's knobs are checked by its spec
        make_policy("constant", k=0)
    with pytest.raises(DiscoError, match="threshold"):
        make_policy("threshold", threshold=1.5)
    with pytest.raises(DiscoError, match="unknown policy"):
        make_policy("sometimes")


# --- sampling: the target's distribution is preserved ---------------------------------------


def test_rejection_sampling_preserves_target_distribution():
    vocab = 5
    g = torch.Generator().manual_seed(0)
    p_rows = [torch.softmax(torch.randn(vocab, generator=g) * 1.5, 0) for _ in range(3)]
    q_rows = [torch.softmax(torch.randn(vocab, generator=g) * 1.5, 0) for _ in range(3)]
    target = DistStubLM(lambda pos: p_rows[min(pos, 2)], vocab)
    draft = DistStubLM(lambda pos: q_rows[min(pos, 2)], vocab)
    n = 3000
    counts = torch.zeros(3, vocab)
    for seed in range(n):
        cfg = DecodeConfig(max_new_tokens=3, max_window=2, temperature=1.0, seed=seed)
        toks = speculative_generate(target, draft, [0], ConstantPolicy(2), cfg).tokens
        for j, t in enumerate(toks):
            counts[j, t] += 1
    for j in range(3):
        expected = p_rows[j] * n
        assert chisquare(counts[j].numpy(), expected.numpy()).pvalue > 1e-3, (j, counts[j], expected)
        # a loop that kept every draft token would produce q instead: make sure the test can tell
        assert chisquare(counts[j].numpy(), (q_rows[j] * n).numpy()).pvalue < 1e-3
