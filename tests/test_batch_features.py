"""The batched token features equal the per-token ones, row by row."""

from __future__ import annotations

import pytest
import torch

from disco.core.features import (
    NGRAM_MAX,
    TOKEN_CLASSES,
    TOKEN_FEATURES,
    assemble_token_features,
    batch_copy_flags,
    batch_distribution,
    batch_logit_distribution,
    batch_top_probs,
    copy_flags,
    token_features,
)

COPY = slice(TOKEN_FEATURES.index("copy_1"), TOKEN_FEATURES.index(f"copy_{NGRAM_MAX}") + 1)
KLASS = slice(TOKEN_FEATURES.index(f"class_{TOKEN_CLASSES[0]}"), len(TOKEN_FEATURES))
FLOATS = slice(0, COPY.start)  # top-k, entropy, margin, p_chosen, gen_pos
# Same float32 operations row by row, but a reduction over a (B, V) tensor (the entropy's sum) may be
# ordered differently from the one over a (V,) tensor: equal within 1e-6 (the top-k values, p_chosen
# and gen_pos are copied elements and come out exact anyway).
ATOL = 1e-6


def padded(contexts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad with -1 to (B, max length), and the lengths."""
    width = max(1, *(c.numel() for c in contexts))
    out = torch.full((len(contexts), width), -1, dtype=torch.long)
    for b, c in enumerate(contexts):
        out[b, : c.numel()] = c
    return out, torch.tensor([c.numel() for c in contexts])


def reference_copy_flags(context: list[int], token: int) -> list[float]:
    """Flag n: some i has context[i] == token preceded by the last n-1 tokens (plain Python, written
    apart from disco's, which copy_flags and batch_copy_flags share)."""
    L = len(context)
    return [
        float(any(context[i] == token and context[i - n + 1 : i] == context[L - n + 1 : L] for i in range(n - 1, L)))
        for n in range(1, NGRAM_MAX + 1)
    ]


def random_contexts(g: torch.Generator, lengths: list[int], vocab: int = 5) -> list[torch.Tensor]:
    return [torch.randint(0, vocab, (n,), generator=g) for n in lengths]


def random_probs(g: torch.Generator, batch: int, vocab: int) -> torch.Tensor:
    scale = torch.tensor([0.1, 3.0, 30.0])[torch.arange(batch) % 3, None]
    return torch.softmax(torch.randn(batch, vocab, generator=g) * scale, -1)


@pytest.mark.parametrize("vocab", [10, 97, 1000, 1280, 5000, 151936])
def test_batch_top_probs_equals_topk(vocab):
    g = torch.Generator().manual_seed(vocab)
    probs = random_probs(g, 5, vocab)
    assert torch.equal(batch_top_probs(probs), probs.topk(10).values)
    assert torch.equal(batch_top_probs(probs, 3), probs.topk(3).values)


def test_batch_top_probs_with_ties():
    ties = torch.zeros(2, 1000)
    ties[0, [3, 500, 999]] = 0.25
    ties[1, ::97] = 0.1  # equal maxima in many chunks
    assert torch.equal(batch_top_probs(ties), ties.topk(10).values)


def test_batch_copy_flags_equal_copy_flags():
    g = torch.Generator().manual_seed(0)
    lengths = [0, 1, 2, 3, 4, 7, 40, *torch.randint(0, 41, (40,), generator=g).tolist()]
    contexts = random_contexts(g, lengths)
    # drafted tokens: random, the last context token (a 1-gram copy at least), and the token that
    # followed the previous occurrence of the last token (a 2-gram copy)
    tokens = []
    for b, c in enumerate(contexts):
        if b % 3 == 1 and c.numel():
            tokens.append(int(c[-1]))
        elif b % 3 == 2 and c.numel() >= 2 and (c[:-1] == c[-1]).any():
            tokens.append(int(c[int((c[:-1] == c[-1]).nonzero()[-1]) + 1]))
        else:
            tokens.append(int(torch.randint(0, 5, (), generator=g)))
    context, lens = padded(contexts)
    tokens_t = torch.tensor(tokens)
    flags = batch_copy_flags(context, lens, tokens_t)
    assert flags.shape == (len(contexts), NGRAM_MAX) and flags.dtype == torch.float32
    for b, c in enumerate(contexts):
        assert torch.equal(flags[b], copy_flags(c, tokens_t[b])), (b, c, tokens[b])
        assert flags[b].tolist() == reference_copy_flags(c.tolist(), tokens[b]), (b, c, tokens[b])
    for n in range(NGRAM_MAX):  # the test can fail: every flag is 1 somewhere, and 0 somewhere
        assert flags[:, n].any() and not flags[:, n].all()
    # short rows: flags for n > length stay 0
    for b, n in enumerate(lengths[:3]):
        assert not flags[b, n:].any()


def test_batch_copy_flags_padding_never_matches():
    # a row padded with -1 and a drafted token of -1 would match the padding if it were not masked
    context = torch.tensor([[2, 2, -1, -1, -1], [-1, -1, -1, -1, -1]])
    flags = batch_copy_flags(context, torch.tensor([2, 0]), torch.tensor([-1, -1]))
    assert torch.equal(flags, torch.zeros(2, NGRAM_MAX))
    # the real tokens still count: [2, 2] then 2 completes the 1- and 2-gram; a 3-gram needs 3 tokens
    flags = batch_copy_flags(context, torch.tensor([2, 0]), torch.tensor([2, 2]))
    assert flags[0].tolist() == [1.0, 1.0, 0.0] and not flags[1].any()


def test_batch_copy_flags_short_width():
    # the padded width itself below NGRAM_MAX (and zero)
    for width in range(NGRAM_MAX + 1):
        context = torch.full((2, width), 1)
        lens = torch.tensor([width, max(0, width - 1)])
        flags = batch_copy_flags(context, lens, torch.tensor([1, 1]))
        for b in range(2):
            assert torch.equal(flags[b], copy_flags(context[b, : lens[b]], torch.tensor(1)))


@pytest.mark.parametrize(
    "batch, vocab, dtype",
    [(7, 1000, torch.float32), (3, 151936, torch.float32), (5, 1000, torch.float16)],  # 150k: a row per block
)
def test_batched_token_features_equal_token_features(batch, vocab, dtype):
    g = torch.Generator().manual_seed(vocab)
    probs = random_probs(g, batch, vocab).to(dtype)
    token_classes = torch.randint(0, len(TOKEN_CLASSES), (vocab,), generator=g)
    lengths = [0, 1, 2, 40, *torch.randint(0, 41, (batch,), generator=g).tolist()][:batch]
    contexts = random_contexts(g, lengths)
    # tokens in the contexts' small vocabulary (copies occur), one the last context token
    tokens = torch.randint(0, 5, (batch,), generator=g)
    tokens[-1] = contexts[-1][-1] if lengths[-1] else tokens[-1]
    gen_pos = torch.randint(0, 2000, (batch,), generator=g)
    context, lens = padded(contexts)

    feats = assemble_token_features(batch_distribution(probs, tokens), tokens, gen_pos, context, lens, token_classes)
    assert feats.shape == (batch, len(TOKEN_FEATURES)) and feats.dtype == torch.float32
    for b in range(batch):
        one = token_features(probs[b], tokens[b], int(gen_pos[b]), contexts[b], token_classes)
        assert torch.equal(feats[b, COPY], one[COPY])
        assert torch.equal(feats[b, KLASS], one[KLASS])
        torch.testing.assert_close(feats[b, FLOATS], one[FLOATS], atol=ATOL, rtol=0)
        # and both equal the features written out plainly (the per-token form reuses the batched one)
        p = probs[b].double()
        top = p.topk(10).values
        plain = [*top, -torch.special.xlogy(p, p).sum(), top[0] - top[1], p[tokens[b]], float(gen_pos[b])]
        # (in float64: the float32 entropy of a 150k vocabulary, ~12 nats, is a few ulps of 1e-6 off it)
        plain_t = torch.tensor(plain, dtype=torch.float32)
        torch.testing.assert_close(feats[b, FLOATS], plain_t, atol=ATOL, rtol=1e-6)
        assert feats[b, COPY].tolist() == reference_copy_flags(contexts[b].tolist(), int(tokens[b]))
        assert feats[b, KLASS].tolist() == [float(c == token_classes[tokens[b]]) for c in range(len(TOKEN_CLASSES))]
    assert feats[:, COPY].any()  # copies occur, so a wrong flag would show


# The logit form's entropy is within 1e-6 of float64's; the definition's (float32 p·log p over a 150k vocabulary,
# where most p are tiny) is itself up to 2.4e-4 off (measured, bf16 logits of a flat row): the two agree within that.
# The top-k and p_chosen: one division each, within 1e-7.
LOGIT_ATOL, ENTROPY_ATOL = 1e-6, 5e-4


@pytest.mark.parametrize(
    "batch, vocab, dtype",
    [(7, 1000, torch.float32), (3, 151936, torch.float32), (5, 151936, torch.bfloat16), (4, 97, torch.float16)],
)
def test_the_features_from_the_logits_equal_those_from_the_probabilities(batch, vocab, dtype):
    """vLLM's proposer computes the distribution's features from the draft's logits (no (B, V) probabilities):
    equal to the definition's on softmax(logits), the entropy closer to float64's, and the caller's logits are
    left as they were."""
    g = torch.Generator().manual_seed(vocab + batch)
    scale = torch.tensor([0.1, 3.0, 30.0])[torch.arange(batch) % 3, None]  # flat, code-like and one-hot rows
    logits = (torch.randn(batch, vocab, generator=g) * scale + 5.0).to(dtype)
    before = logits.clone()
    tokens = torch.randint(0, vocab, (batch,), generator=g)
    tokens[0] = logits[0].argmax()
    top, ent, chosen = batch_logit_distribution(logits, tokens)
    want = batch_distribution(logits.float().softmax(-1), tokens)
    exact = logits.double().softmax(-1)
    torch.testing.assert_close(ent.double(), -torch.special.xlogy(exact, exact).sum(-1), atol=LOGIT_ATOL, rtol=0)
    torch.testing.assert_close(ent, want[1], atol=ENTROPY_ATOL, rtol=0)
    torch.testing.assert_close(top, want[0], atol=LOGIT_ATOL, rtol=1e-5)
    torch.testing.assert_close(chosen, want[2], atol=LOGIT_ATOL, rtol=1e-5)
    assert top.dtype == ent.dtype == chosen.dtype == torch.float32
    assert torch.equal(logits, before)
    context, lens = padded(random_contexts(g, [3] * batch))
    gen_pos, classes = torch.arange(batch), torch.zeros(vocab, dtype=torch.long)
    feats = assemble_token_features((top, ent, chosen), tokens, gen_pos, context, lens, classes)
    want = batch_distribution(logits.float().softmax(-1), tokens)
    want_feats = assemble_token_features(want, tokens, gen_pos, context, lens, classes)
    torch.testing.assert_close(feats, want_feats, atol=ENTROPY_ATOL, rtol=1e-5)
