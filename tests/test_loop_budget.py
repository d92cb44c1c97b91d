"""vLLM 0.32's adaptive verification and disco's learned budget in disco's one-request loop (loop_budget.py, the round's
trim phase rounds.verified_count): the budget against a brute-force enumeration, a trim counted exactly, lossless on
the tiny torch pair and the tiny GGUF pair, the simulator's replay counting as the live loop, the CLI's refusals.
The batched forms on vLLM's draft: tests/test_adaptive_verification.py."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import ProbModel, cli, collected_trace, counts, one_error_line
from scipy.stats import chisquare
from tiny import POSITION_VOCAB, DistStubLM, StubLM, position_stub_pair

from disco.base.errors import DiscoError
from disco.base.options import PairOptions
from disco.core.cost import CostModel
from disco.core.features import FEATURES, TOKEN_FEATURES
from disco.formats.prompts import Prompt
from disco.jobs.compare import ADAPTIVE_LABEL, LEARNED_BUDGET_LABEL, default_entries, run_compare
from disco.loop.decode import DecodeConfig, generate_ids, speculative_generate, target_generate
from disco.loop.pair import load_pair
from disco.policies.artifact import DenseModel, save_artifact
from disco.policies.classifier import ClassifierPolicy
from disco.policies.loop_budget import LoopAdaptiveVerification, LoopLearnedBudget
from disco.policies.policy_registry import PolicySpec
from disco.training.simulate import prompt_traces, replay_policy, simulate

K = 6
COST = CostModel(0.1, tuple(1.0 + 0.25 * n for n in range(K + 1)), "stub")  # c_t(n) = 1 + 0.25 (n - 1)
PROMPTS = ["def add(a, b):\n    return a + b\n", "Hello, world! The quick brown fox", "x = [1, 2, 3]\nfor i in x:"]
CONFIG = DecodeConfig(max_new_tokens=40, max_window=K)


# --- the budget, by brute force ---------------------------------------------------------------------------------


def rates(conf: list[float], cost: CostModel, drafted: int) -> list[float]:
    """Expected tokens over the round's cost for n = 0 .. drafted verified: (1 + S_1 + ... + S_n) / (drafted c_d +
    c_t(n + 1)), S_i the product of the first i confidences."""
    out = []
    for n in range(drafted + 1):
        tokens = 1 + sum(math.prod(conf[: i + 1]) for i in range(n))
        out.append(tokens / (drafted * cost.c_d + cost.c_t[n]))
    return out


def brute_budget(conf: list[float], cost: CostModel, drafted: int) -> int:
    r = rates(conf, cost, drafted)
    return max(range(len(r)), key=lambda n: (r[n], -n))  # the first argmax


def brute_rising(conf: list[float], cost: CostModel, drafted: int) -> int:
    r = rates(conf, cost, drafted)
    n = 0
    while n < drafted and r[n + 1] > r[n]:
        n += 1
    return n


def step(pos: int, q: float):
    """The part of a DraftStep adaptive verification reads: the window position and the draft's top-1 probability."""
    return SimpleNamespace(window_pos=pos, top1=lambda: q)


def drafted_window(policy: LoopAdaptiveVerification, qs: list[float]) -> tuple[list[float], list[bool]]:
    """The policy decides on a window of tokens with these top-1 probabilities: (each confidence, each stop)."""
    policy.start()
    stops = [policy.should_stop(step(pos, q)) for pos, q in enumerate(qs, 1)]
    return policy.estimator.predictions[0, : len(qs)].double().tolist(), stops


def test_adaptive_verification_budget_equals_brute_force():
    """Hand cases and random windows: vLLM's budget for one request (drafted to k, priced k c_d + c_t(n + 1)) is the
    first argmax of the enumeration; under sampling, the initial run over which the rate rises."""
    g = np.random.default_rng(0)
    cases = [[0.99] * K, [0.5] * K, [0.999, 0.99, 0.6, 0.2, 0.99, 0.99], [0.01] * K]
    cases += [list(g.uniform(0.05, 0.9999, K)) for _ in range(40)]
    seen = set()
    for qs in cases:
        for drafted in (K, 3):  # the whole window, and one cut short by the token budget
            policy = LoopAdaptiveVerification(COST, K)
            conf, stops = drafted_window(policy, qs[:drafted])
            assert stops == [False] * (drafted - 1) + [drafted == K]  # it drafts to k, never stopping early
            want = brute_budget(conf, COST, drafted)
            assert policy.trim(drafted) == want, (qs, drafted)
            seen.add(want)
            sampled = LoopAdaptiveVerification(COST, K, sampled=True)
            drafted_window(sampled, qs[:drafted])
            assert sampled.trim(drafted) == brute_rising(conf, COST, drafted)
    assert {0, K} < seen and len(seen) > 3  # every kind of budget came up


def test_the_sampled_budget_stops_where_the_rate_first_falls():
    """A verification cost with a step (c_t(3) jumps): the rate rises at n = 1, falls at 2, then rises past its first
    peak at 4. Greedy verifies the argmax (4); under sampling, n = 1 (deciding on a token must not read later ones)."""
    cost = CostModel(0.1, (1.0, 1.0, 2.5, 2.5, 2.5), "step")
    q = 1 / (1 + math.exp(-(math.log(9) + 0.2) / 0.5))  # the cold estimator's confidence is 0.9 here
    greedy, sampled = LoopAdaptiveVerification(cost, 4), LoopAdaptiveVerification(cost, 4, sampled=True)
    conf, _ = drafted_window(greedy, [q] * 4)
    drafted_window(sampled, [q] * 4)
    assert conf == pytest.approx([0.9] * 4)
    assert (greedy.trim(4), sampled.trim(4)) == (4, 1) == (brute_budget(conf, cost, 4), brute_rising(conf, cost, 4))


def test_learned_budget_stops_drafting_and_trims_to_its_budget():
    """The learned budget's confidences are its classifier's (identity calibration while cold): a confident window
    drafts to k; one whose survival soon stops paying stops early; the trim is the budget over what it drafted."""
    for p, drafted_to in ((0.99, K), (0.3, 1)):
        model = ProbModel(lambda f, p=p: p)
        policy = LoopLearnedBudget(ClassifierPolicy(model, 0.5, rule="token"), COST, K)
        policy.start()
        feats = torch.zeros(len(TOKEN_FEATURES))
        stops = []
        for pos in range(1, K + 1):
            s = SimpleNamespace(window_pos=pos, hidden=None, token_features=lambda table: feats)
            stops.append(policy.should_stop(s))
            if stops[-1]:
                break
        assert len(stops) == drafted_to and stops[-1]
        assert policy.trim(drafted_to) == brute_budget([p] * drafted_to, COST, drafted_to)


# --- the loop: a trim counted exactly, lossless ----------------------------------------------------------------


def test_a_trim_is_counted_exactly():
    """Stub models that always agree, the draft 90% sure at every position: the cold estimator's confidence is
    sigmoid(0.5 logit(0.9) - 0.2) at every position, so every round drafts min(k, room) tokens and verifies the
    budget of that window (3 of 6 here), all accepted: draft forwards count the drafted, windows the verified."""
    rule = lambda t, i: (t * 5 + i) % 16  # noqa: E731
    target, draft = StubLM(rule, confidence=lambda i: 0.99), StubLM(rule, confidence=lambda i: 0.9)
    c = 1 / (1 + math.exp(-(0.5 * math.log(9) - 0.2)))
    max_new = 23
    out, drafted, windows = 0, 0, []
    while out < max_new:  # the rounds by hand
        room = min(K, max_new - out - 1)
        if room <= 0:
            out += 1
            continue
        v = brute_budget([c] * room, COST, room)
        drafted, out = drafted + room, out + v + 1
        windows.append(v)
    assert windows[0] == 3 and sum(windows) < drafted  # the case is built for a trim
    res = speculative_generate(target, draft, [1, 2], LoopAdaptiveVerification(COST, K), DecodeConfig(max_new, K))
    s = res.stats
    assert (s.draft_forwards, s.windows, s.accepted_per_window) == (drafted, windows, windows)
    assert (
        s.drafted == sum(windows)
        and s.new_tokens == max_new
        and s.target_forwards == len(windows) + (max_new - sum(w + 1 for w in windows))
    )
    assert res.tokens == target_generate(target, [1, 2], DecodeConfig(max_new, K)).tokens


def _artifact(folder, pair, cost: CostModel | None = COST) -> str:
    """A hand-made logistic model over p_top1 and window_pos (P(accept) rises with the draft's confidence, falls along
    the window), saved as a real artifact for this pair, with a cost model (or none)."""
    cols = [FEATURES.index("p_top1"), FEATURES.index("window_pos")]
    model = DenseModel(
        "logistic", np.zeros(2), np.ones(2), [(np.array([[6.0], [-0.4]]), np.array([-2.0]))], "identity", cols
    )
    manifest = {"setting": 0.5, "rule": "token", "pair": pair.describe()}
    if cost is not None:
        manifest["cost_model"] = cost.to_dict()
    return str(save_artifact(folder, model, manifest))


@pytest.mark.parametrize("engine", ["torch", "llama.cpp"])
def test_lossless_on_the_tiny_pairs(engine, noisy_torch_pair, noisy_gguf_pair, tmp_path):
    """Both policies, built from the registry as `disco generate` builds them (the artifact's cost model, its
    classifier): greedy output is target-only's token for token, and some round verified fewer than it drafted."""
    pair = noisy_torch_pair if engine == "torch" else noisy_gguf_pair
    clf = _artifact(tmp_path / "clf", pair)
    for name in ("adaptive-verification", "learned-budget"):
        spec = PolicySpec(name, k=K, classifier=clf)
        trimmed = 0
        for text in PROMPTS:
            ids = pair.encode(text, chat=False)
            reference = target_generate(pair.target, ids, CONFIG, pair.eos_token_ids).tokens
            res = generate_ids(pair, ids, spec, CONFIG)
            assert res.tokens == reference, (name, text)
            s = res.stats
            assert s.drafted == sum(s.windows) <= s.draft_forwards
            trimmed += s.draft_forwards - s.drafted
        assert trimmed > 0, name


def test_sampling_verifies_a_prefix_of_the_drafts(noisy_torch_pair, tmp_path):
    """Under sampling both run (rejection sampling on the verified prefix): the learned budget verifies all it drafts
    (its P(accept) reads each token itself), adaptive verification trims by the rising rate."""
    clf = _artifact(tmp_path / "clf", noisy_torch_pair)
    config = DecodeConfig(max_new_tokens=40, max_window=K, temperature=0.8, seed=3)
    ids = noisy_torch_pair.encode(PROMPTS[0], chat=False)
    learned = generate_ids(noisy_torch_pair, ids, PolicySpec("learned-budget", k=K, classifier=clf), config).stats
    assert learned.drafted == learned.draft_forwards > 0 and learned.new_tokens == 40
    adaptive = generate_ids(
        noisy_torch_pair, ids, PolicySpec("adaptive-verification", k=K, classifier=clf), config
    ).stats
    assert adaptive.drafted == sum(adaptive.windows) < adaptive.draft_forwards and adaptive.new_tokens == 40


V = 6  # the sampling stubs' vocabulary


def _peaked(peak: float, j: int, g: torch.Generator) -> torch.Tensor:
    rest = torch.softmax(torch.randn(V, generator=g) * 0.5, 0)
    rest[j] = 0
    out = rest / rest.sum() * (1 - peak)
    out[j] = peak
    return out


class ContextStub(DistStubLM):
    """A stub whose next-token distribution depends on the absolute position and the token read there: dist(pos,
    token). A draft like it makes a later position's confidence depend on an earlier drafted token."""

    def forward(self, input_ids, cache, use_cache=True, logits_to_keep=0, output_hidden_states=False):
        start, n = cache.get_seq_length(), input_ids.shape[1]
        cache.update(torch.zeros(1, 1, n, 1), torch.zeros(1, 1, n, 1), 0)
        logits = torch.stack([self.dist(start + j, int(input_ids[0, j])).log() for j in range(n)]).unsqueeze(0)
        return SimpleNamespace(logits=logits[:, -(logits_to_keep or n) :])


def _sampled_outputs(cost: CostModel, sampled: bool, n: int) -> tuple[list[dict], list[torch.Tensor], set]:
    """n generations of 4 tokens at temperature 1 under adaptive verification (k = 3): the counts of each output
    position's tokens, the target's distributions there, the windows seen. The draft: sure of x1 (q* 0.999), unsure
    of x2 (q* 0.5), and at x3 sure again (0.999) if x2 was token 2, else not (0.2): x3's confidence reads x2."""
    g = torch.Generator().manual_seed(1)
    p_rows = [_peaked(0.9, 3, g)] + [_peaked(pk, j, g) for j, pk in enumerate((0.45, 0.4, 0.6), 1)]
    sure, mixed, unsure = _peaked(0.999, 3, g), _peaked(0.5, 2, g), _peaked(0.2, 4, g)
    target = DistStubLM(lambda pos: p_rows[min(pos, 3)], V)
    draft = ContextStub(lambda pos, tok: sure if pos == 0 else mixed if pos == 1 else sure if tok == 2 else unsure, V)
    counts = torch.zeros(4, V)
    windows = set()
    for seed in range(n):
        policy = LoopAdaptiveVerification(cost, 3, sampled)
        res = speculative_generate(target, draft, [1], policy, DecodeConfig(4, 3, 1.0, 1.0, seed))
        for j, t in enumerate(res.tokens):
            counts[j, t] += 1
        windows.add(tuple(res.stats.windows))
    return counts, p_rows, windows


def test_the_sampled_trim_keeps_the_targets_distribution():
    """Under sampling adaptive verification trims where the budget's rate stops rising: the windows vary with the
    drafted tokens, and every output position follows the target's distribution (chi-square). The budget's argmax,
    which reads x3's confidence to decide on x2 (here: x2 verified only when it is token 2), would not: over-weighted
    token 2 at position 2 (a verification cost with a step, where the argmax skips a dip)."""
    linear = CostModel(0.01, (1.0, 1.2, 1.4, 1.6), "linear")
    counts, p_rows, windows = _sampled_outputs(linear, True, 2500)
    assert len(windows) > 4
    pvalues = [chisquare(counts[j].numpy(), (p_rows[j] * counts[j].sum()).numpy()).pvalue for j in range(4)]
    assert min(pvalues) > 1e-4, pvalues
    step = CostModel(0.01, (1.0, 1.05, 1.45, 1.45), "step")
    counts, p_rows, _ = _sampled_outputs(step, False, 1500)  # (the greedy rule, at temperature 1)
    assert chisquare(counts[1].numpy(), (p_rows[1] * counts[1].sum()).numpy()).pvalue < 1e-10


# --- the simulator counts as the live loop ---------------------------------------------------------------------


def test_the_replay_counts_as_the_live_loop():
    """Position stubs (each position's distributions fixed, so teacher-forced rows are the live ones even after a
    mismatch): a replayed generation counts exactly as the live one, trims included, for both policies."""
    target, draft = position_stub_pair()
    table = torch.zeros(POSITION_VOCAB, dtype=torch.long)
    model = ProbModel(lambda f: f["p_chosen"] * 0.95 ** f["window_pos"])
    trimmed = 0
    for i, prompt in enumerate([[i % POSITION_VOCAB] * (1 + i % 3) for i in range(5)]):
        max_new = 12 + 7 * i
        df = collected_trace(target, draft, prompt, max_new, table, f"p{i}", max_window=K)
        y = df["target_token"].tolist()
        lives = {
            "adaptive-verification": LoopAdaptiveVerification(COST, K),
            "learned-budget": LoopLearnedBudget(ClassifierPolicy(model, 0.5, table, "token"), COST, K),
        }
        for name, live in lives.items():
            sim = simulate(prompt_traces(df, max_new), replay_policy(name, k=K, model=model, cost=COST), K)
            real = speculative_generate(target, draft, prompt, live, DecodeConfig(max_new, K))
            assert real.tokens == y
            assert counts(sim.stats[0]) == counts(real.stats), (name, i)
            trimmed += real.stats.draft_forwards - real.stats.drafted
    assert trimmed > 0


# --- rows and refusals ---------------------------------------------------------------------------------------


def test_compare_runs_the_rows_in_disco_loop_given_a_classifier(noisy_torch_pair, tmp_path):
    """`disco compare --classifier` lines both up on disco's loop (priced by the artifact), lossless."""
    budget = lambda entries: [e for e in entries if e.spec is not None and e.spec.kind.batch_budget]  # noqa: E731
    assert budget(default_entries(pair=noisy_torch_pair)) == []  # (no cost model to price them with)
    clf = _artifact(tmp_path / "clf", noisy_torch_pair)
    entries = budget(default_entries(clf, pair=noisy_torch_pair))
    assert [e.label for e in entries] == [ADAPTIVE_LABEL, LEARNED_BUDGET_LABEL]
    assert [e.spec.classifier for e in entries] == [clf, clf]  # (adaptive verification: the artifact's costs)
    prompts = [Prompt(f"p{i}", "code", text) for i, text in enumerate(PROMPTS)]
    result = run_compare(
        noisy_torch_pair, prompts, entries, CONFIG, tmp_path / "c", chat=False, progress=False, plots=False
    )
    for e in entries:
        assert result["summary"][e.label]["lossless"], e.label


def test_generate_runs_them_given_a_classifier(folders, tmp_path, capsys):
    """`disco generate --policy adaptive-verification|learned-budget --classifier ARTIFACT` on the tiny folders."""
    t, d, _ = folders
    clf = _artifact(tmp_path / "clf", load_pair(PairOptions(str(t), str(d))))
    for name in ("adaptive-verification", "learned-budget"):
        args = ["--prompt", "def f(x):", "--max-new-tokens", 12, "--max-window", 4, "--k", 4, "--classifier", clf]
        code, _, err = cli(capsys, "generate", "--target", t, "--draft", d, "--policy", name, *args)
        assert code == 0, err
        assert f"[{name}] 12 tokens" in err


def test_refusals_in_one_line(folders, noisy_torch_pair, tmp_path, capsys):
    t, d, _ = folders
    base = ["generate", "--target", t, "--draft", d, "--prompt", "hi", "--max-new-tokens", 4, "--policy"]
    code, _, err = cli(capsys, *base, "adaptive-verification")
    assert code == 2
    assert one_error_line(err) == (
        "error: the adaptive-verification policy prices its verification widths with a cost model: give "
        "--classifier ARTIFACT (the profile it was trained with prices them)"
    )
    code, _, err = cli(capsys, *base, "learned-budget")
    assert code == 2
    assert one_error_line(err) == (
        "error: the learned-budget policy needs a trained artifact: pass --classifier models/NAME"
    )
    bare = _artifact(tmp_path / "bare", noisy_torch_pair, cost=None)
    with pytest.raises(DiscoError, match=r"records none: retrain it with disco train --profile$"):
        PolicySpec("adaptive-verification", k=K, classifier=bare).build(None, noisy_torch_pair, K)
    short = _artifact(tmp_path / "short", noisy_torch_pair, cost=CostModel(0.1, (1.0, 1.1, 1.2), "short"))
    with pytest.raises(DiscoError, match=r"covers target forwards of up to 3 tokens"):
        PolicySpec("learned-budget", k=K, classifier=short).build(None, noisy_torch_pair, K)
