"""Features of a draft step, defined once for collection, training, simulation and the live loop.

Two groups, concatenated in the order of FEATURES:

* token features: a function of the draft's distribution at one position, the drafted token
  and the text before it. They do not depend on how drafting was split into windows, so a
  trace computes them once per position (teacher-forced) and any policy can reuse them.
* window features: position in the window, running product of the chosen tokens'
  probabilities in the window, the previous window's accepted length, and what the target said
  at the end of the previous window (the target-side signals: was the window cut by a
  rejection, the target's probability and entropy at the token it chose there, and how far the
  draft's probability of that token fell short of the target's). They depend on the window
  structure, so the collector computes them for the oracle's windows and the simulator
  recomputes them for each policy's windows with `WindowState`.

Only what the loop knows at decision time is a feature: the draft's distribution now, and the
target's distributions at positions it has already verified (never the target's verdict on a
token still in the window).

Besides FEATURES, a model may read the draft's last hidden state at the drafted position
(`hidden_projection` keeps wide ones small); traces store it, the live loop asks the draft
engine for it only when the policy needs it.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import torch

TOP_K = 10
NGRAM_MAX = 3  # copy signal: does the token complete a 1-, 2-, 3-gram already in the text?
TOKEN_CLASSES = ("newline", "space", "punct", "word", "other")

TOKEN_FEATURES: tuple[str, ...] = (
    *(f"p_top{i}" for i in range(1, TOP_K + 1)),  # DISCO: the draft's top-10 probabilities
    "entropy",  # DISCO: entropy of the draft distribution (nats)
    "margin",  # top-1 minus top-2 probability
    "p_chosen",  # probability of the drafted token (differs from p_top1 when sampling)
    "gen_pos",  # index of the token in the generated continuation
    *(f"copy_{n}" for n in range(1, NGRAM_MAX + 1)),  # the token completes an n-gram seen earlier
    *(f"class_{c}" for c in TOKEN_CLASSES),  # one-hot class of the drafted token's text
)
# What the target said at the end of the previous window (known before the next one starts).
TARGET_SIGNALS: tuple[str, ...] = (
    "last_rejected",  # 1: the previous window ended at a rejected token (0: by the policy or its cap)
    "last_target_p",  # the target's probability of the token it chose at the end of the previous window
    "last_target_entropy",  # the target's entropy there (nats)
    "last_gap",  # target_p - draft_p of that token where the draft proposed another; 0 otherwise
)
WINDOW_FEATURES: tuple[str, ...] = (
    "window_pos",  # DISCO: 1-based position of the token in the current window
    "window_prob_prod",  # product of p_chosen over the window so far (this token included)
    "prev_accepted",  # accepted length of the previous window (0 before the first)
    *TARGET_SIGNALS,
)
FEATURES: tuple[str, ...] = TOKEN_FEATURES + WINDOW_FEATURES
# DISCO's original inputs, for the ablation baseline.
DISCO_FEATURES: tuple[str, ...] = (*(f"p_top{i}" for i in range(1, TOP_K + 1)), "entropy", "window_pos")

_P_CHOSEN = TOKEN_FEATURES.index("p_chosen")


def token_class_table(tokenizer, vocab_size: int) -> torch.Tensor:
    """(vocab_size,) int64: index into TOKEN_CLASSES of each token's decoded text (computed once per pair)."""
    table = torch.full((vocab_size,), TOKEN_CLASSES.index("other"), dtype=torch.long)
    punct = set(string.punctuation)
    for tid in range(min(vocab_size, len(tokenizer))):
        text = tokenizer.decode([tid])
        if "\n" in text:
            cls = "newline"
        elif text and not text.strip():
            cls = "space"
        elif text.strip() and all(ch in punct for ch in text.strip()):
            cls = "punct"
        elif text.strip() and (text.strip().replace("_", "a").isalnum()):
            cls = "word"
        else:
            cls = "other"
        table[tid] = TOKEN_CLASSES.index(cls)
    return table


def copy_flags(context: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """(NGRAM_MAX,) float: flag n is 1 when (last n-1 context tokens, token) occurs earlier in `context`.

    The copy signal behind prompt-lookup decoding: code and summaries often repeat text.
    One row of batch_copy_flags (the one definition)."""
    lengths = torch.full((1,), context.numel(), dtype=torch.long, device=context.device)
    return batch_copy_flags(context.reshape(1, -1), lengths, torch.as_tensor(token, device=context.device).view(1))[0]


def batch_copy_flags(context: torch.Tensor, lengths: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """(B, NGRAM_MAX) float32: row b is copy_flags(context[b, :lengths[b]], tokens[b]).

    context: (B, L) int64, each row's tokens left-aligned, padded on the right (any value: positions
    at or past a row's length are masked out); lengths: (B,) valid lengths (<= L); tokens: (B,) the
    drafted tokens. Flag n of row b is 1 when some i in [n-1, lengths[b]) has context[b, i] == tokens[b]
    and context[b, i-j] == context[b, lengths[b]-j] for j = 1..n-1 (the last n-1 tokens recur just
    before i); a row shorter than n has no such i, so its flag n stays 0."""
    B, L = context.shape
    device = context.device
    if L == 0:
        return torch.zeros(B, NGRAM_MAX, dtype=torch.float32, device=device)
    lengths = lengths.to(device=device, dtype=torch.long)
    # hits[b, i]: context[b, i] is the drafted token, inside the row
    hits = (context == tokens.to(device).view(B, 1)) & (torch.arange(L, device=device) < lengths[:, None])
    # last[:, j-1] = context[b, lengths[b]-j] (clamped where a row is that short: it has no candidate i then)
    last = context.gather(1, (lengths[:, None] - torch.arange(1, NGRAM_MAX, device=device)).clamp(0, L - 1))
    found = [hits.any(1)]
    for n in range(2, NGRAM_MAX + 1):
        # from here on hits[b, k] is about the end i = k + n - 1, now also preceded by the last n-1 tokens
        hits = hits[:, 1:] & (context[:, : max(0, L - n + 1)] == last[:, n - 2 : n - 1])
        found.append(hits.any(1))
    return torch.stack(found, 1).float()


_TOPK_CHUNK = 128


def top_probs(probs: torch.Tensor, k: int = TOP_K) -> torch.Tensor:
    """The k largest values of a 1-D tensor, descending: equal to probs.topk(k).values.

    ~10x faster than topk over a 150k vocabulary on a CPU (topk alone was a third of a
    decision's cost): see batch_top_probs, whose one row it is."""
    return batch_top_probs(probs.reshape(1, -1), k)[0]


def batch_top_probs(probs: torch.Tensor, k: int = TOP_K) -> torch.Tensor:
    """(B, V) -> (B, k): the k largest values of each row, descending (= probs.topk(k).values).

    Every top-k value of a row lies in one of the k chunks of _TOPK_CHUNK values with the largest
    maxima (ties included: any such choice of chunks holds the same top-k values), so one
    max-reduction pass picks k chunks per row and topk runs over k * _TOPK_CHUNK values only."""
    B, V = probs.shape
    pad = (-V) % _TOPK_CHUNK
    if (V + pad) // _TOPK_CHUNK <= k:
        return probs.topk(k, dim=1).values
    padded = torch.nn.functional.pad(probs, (0, pad), value=float("-inf")) if pad else probs  # (no copy if whole)
    chunks = padded.reshape(B, -1, _TOPK_CHUNK)
    picked = chunks.amax(2).topk(k, dim=1).indices  # (B, k)
    values = chunks.gather(1, picked[:, :, None].expand(B, k, _TOPK_CHUNK))  # (B, k, _TOPK_CHUNK)
    return values.flatten(1).topk(k, dim=1).values


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) over the last dimension: the one definition the live loop, the policies and the
    collector share."""
    probs = probs.float()
    terms = probs.clamp_min(1e-30).log_().mul_(probs)  # one temporary (B x V floats), not three
    return -terms.sum(-1)


def token_features(
    probs: torch.Tensor, token: torch.Tensor, gen_pos: int, context: torch.Tensor, token_classes: torch.Tensor
) -> torch.Tensor:
    """(len(TOKEN_FEATURES),) float32 on the draft's device, for one drafted token.

    probs: the draft distribution the token was chosen from; context: the tokens before it.
    One row of assemble_token_features(batch_distribution(...)) (the one definition)."""
    device = probs.device
    tokens = torch.as_tensor(token, device=device).view(1)
    return assemble_token_features(
        batch_distribution(probs.reshape(1, -1), tokens),
        tokens,
        torch.tensor([float(gen_pos)], device=device),
        context.reshape(1, -1),
        torch.full((1,), context.numel(), dtype=torch.long, device=context.device),
        token_classes,
    )[0]


_CPU_BLOCK = 1 << 18  # values per block of rows on a CPU (1 MB of float32)

# The draft distribution's features of each row: its top-TOP_K probabilities (B, TOP_K), entropy (B,) and the
# probability of the drafted token (B,), float32
Distribution = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _row_blocks(x: torch.Tensor, tokens: torch.Tensor) -> zip:
    """(block of x's rows, their tokens (rows, 1)) pairs: on a CPU, (B, V) temporaries spill the caches (the
    entropy of 32 rows of a 150k vocabulary at once took 10x as long as row by row), so blocks of rows there;
    all at once elsewhere."""
    rows = max(1, _CPU_BLOCK // max(1, x.shape[1])) if x.device.type == "cpu" else max(1, x.shape[0])
    return zip(x.split(rows), tokens.to(device=x.device, dtype=torch.long).view(-1, 1).split(rows))


def _joined(parts: list[Distribution]) -> Distribution:
    if len(parts) == 1:
        return parts[0]
    top, ent, chosen = zip(*parts)
    return torch.cat(top), torch.cat(ent), torch.cat(chosen)


def batch_distribution(probs: torch.Tensor, tokens: torch.Tensor) -> Distribution:
    """The features of each row's distribution, from its probabilities (B, V): the definition."""
    parts = []
    for block, toks in _row_blocks(probs, tokens):
        block = block.float()
        parts.append((batch_top_probs(block), entropy(block), block.gather(1, toks)[:, 0]))
    return _joined(parts)


def batch_logit_distribution(logits: torch.Tensor, tokens: torch.Tensor) -> Distribution:
    """batch_distribution of softmax(logits), computed from the logits without the (B, V) probabilities:
    with x = l − max and e = exp(x), Z = Σe, p = e / Z and the entropy −Σ p·log p = log Z − Σ e·x / Z. That
    spares the log of every probability, the dividing and a (B, V) temporary, which vLLM's proposer would
    compute after every draft position (bench/results/vllm-avx2-cpu.md, "A CPU where no window pays":
    2.6-3x faster alone at 8 rows, 18 % off the whole decision at one request in situ). Equal to batch_distribution within its float32
    rounding, and nearer float64 (tests/test_batch_features.py)."""
    parts = []
    for block, toks in _row_blocks(logits, tokens):
        x = block.to(torch.float32, copy=True)  # (shifted in place: the caller's logits stay as they are)
        x.sub_(x.amax(1, keepdim=True))
        e = x.exp()
        z = e.sum(1)
        ent = z.log() - torch.linalg.vecdot(e, x) / z
        parts.append((batch_top_probs(e) / z[:, None], ent, e.gather(1, toks)[:, 0] / z))
    return _joined(parts)


def assemble_token_features(
    dist: Distribution,
    tokens: torch.Tensor,
    gen_pos: torch.Tensor,
    context: torch.Tensor,
    lengths: torch.Tensor,
    token_classes: torch.Tensor,
) -> torch.Tensor:
    """(B, len(TOKEN_FEATURES)) float32 on the distribution's device: row b is the features of drafted token
    tokens[b], chosen from the distribution whose features are dist's row b (batch_distribution: the
    definition, from probabilities; batch_logit_distribution where the caller has the logits) at generated
    position gen_pos[b] (B,), after the text context[b, :lengths[b]] (context (B, L) right-padded, as
    batch_copy_flags takes it)."""
    top, ent, chosen = dist
    device = top.device
    tokens = tokens.to(device=device, dtype=torch.long)
    klass = torch.nn.functional.one_hot(token_classes[tokens.to(token_classes.device)], len(TOKEN_CLASSES))
    klass = klass.float().to(device)
    scalars = torch.stack([ent, top[:, 0] - top[:, 1], chosen, gen_pos.to(device=device, dtype=torch.float32)], 1)
    return torch.cat([top, scalars, batch_copy_flags(context, lengths, tokens).to(device), klass], 1)


@dataclass(frozen=True)
class TargetSignals:
    """What the target said at the token it chose at the end of a verified window (TARGET_SIGNALS)."""

    rejected: bool = False  # that token replaced a rejected draft token
    target_p: float = 1.0  # the target's probability of it (its top-1 under greedy decoding)
    target_entropy: float = 0.0  # the target's entropy at that position (nats)
    gap: float = 0.0  # target_p minus the draft's probability of it, where the draft proposed another

    def values(self) -> tuple[float, float, float, float]:
        return float(self.rejected), self.target_p, self.target_entropy, self.gap


NO_SIGNALS = TargetSignals()  # before the first window: nothing verified yet


def target_signals(
    target_probs: torch.Tensor, token: torch.Tensor | int, draft_probs: torch.Tensor | None
) -> TargetSignals:
    """TargetSignals from the target's distribution at the position of its token, and the draft's
    distribution there when the draft had proposed another token (a rejection); None: a bonus token."""
    tp, h = float(target_probs[token]), float(entropy(target_probs))
    if draft_probs is None:
        return TargetSignals(False, tp, h, 0.0)
    return TargetSignals(True, tp, h, tp - float(draft_probs[token]))


def window_features(
    window_pos: int, window_prob_prod: torch.Tensor | float, prev_accepted: int, signals: TargetSignals = NO_SIGNALS
) -> torch.Tensor:
    device = window_prob_prod.device if isinstance(window_prob_prod, torch.Tensor) else None
    prod = torch.as_tensor(window_prob_prod, dtype=torch.float32, device=device).reshape(1)
    rest = torch.tensor([float(prev_accepted), *signals.values()], dtype=torch.float32, device=prod.device)
    return torch.cat([torch.tensor([float(window_pos)], device=prod.device), prod, rest])


@dataclass
class WindowState:
    """The window bookkeeping behind WINDOW_FEATURES, kept identically by the live policy,
    the collector (oracle windows) and the simulator (any policy's windows)."""

    prev_accepted: int = 0
    window_prod: torch.Tensor | float = 1.0
    signals: TargetSignals = NO_SIGNALS

    def start(self) -> None:
        self.window_prod = 1.0

    def step(self, tok_feats: torch.Tensor, window_pos: int) -> torch.Tensor:
        """Full FEATURES vector for the next token of the window; advances the running product."""
        self.window_prod = tok_feats[_P_CHOSEN] * self.window_prod
        return torch.cat([tok_feats, window_features(window_pos, self.window_prod, self.prev_accepted, self.signals)])

    def end(self, n_drafted: int, n_accepted: int, signals: TargetSignals | None = None) -> None:
        if n_drafted > 0:
            self.prev_accepted = n_accepted
            if signals is not None:
                self.signals = signals


# --- the draft's hidden state -------------------------------------------------------------------

HIDDEN_MAX_DIM = 1024  # wider drafts store a fixed random projection of their hidden state ...
HIDDEN_PROJECTED_DIM = 256  # ... to this many dimensions (traces stay ~0.5 KB per position)
HIDDEN_SEED = 0


def hidden_projection(dim: int, seed: int = HIDDEN_SEED) -> torch.Tensor | None:
    """(dim, HIDDEN_PROJECTED_DIM) seeded Gaussian projection for drafts wider than HIDDEN_MAX_DIM,
    None (stored as is) for narrower ones. The same seed gives the same matrix in the collector
    and the live policy, so the trace manifest and the artifact record only (dim, seed)."""
    if dim <= HIDDEN_MAX_DIM:
        return None
    g = torch.Generator().manual_seed(seed)
    return torch.randn(dim, HIDDEN_PROJECTED_DIM, generator=g) / HIDDEN_PROJECTED_DIM**0.5


def hidden_info(dim: int, seed: int = HIDDEN_SEED) -> dict:
    """What a trace manifest and an artifact record of the hidden state they hold."""
    proj = dim > HIDDEN_MAX_DIM
    return {
        "dim": dim,
        "stored_dim": HIDDEN_PROJECTED_DIM if proj else dim,
        "projection_seed": seed if proj else None,
        "dtype": "float16",
    }
