"""The speculative decoding loop: draft -> verify -> accept -> roll back caches -> record.

One loop serves every policy and plain target-only decoding (max_window = 0), so baselines
and speculative runs share every line of code that is not about drafting.

Cache invariant: at the start of a round the target's KV cache holds every committed token
except the last one (the "pending" token); the draft's cache holds at most that many. Each
forward feeds exactly the committed tokens a cache is missing, so no token is computed twice.

The loop drives both models through the engine interface (disco/engines: torch or llama.cpp);
a torch model passed in directly runs on the torch engine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from disco.engines.base import Engine, as_engine, check_compatible
from disco.errors import DiscoError
from disco.features import target_signals
from disco.policy import DEFAULT_MAX_WINDOW, DraftStep, PolicySpec, StoppingPolicy

DEFAULT_MAX_NEW_TOKENS = 128


@dataclass
class DecodeConfig:
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS  # generated tokens at most (EOS stops earlier)
    max_window: int = DEFAULT_MAX_WINDOW  # draft tokens per round at most; 0 = target-only decoding
    temperature: float = 0.0  # 0 = greedy (output identical to the target's greedy decoding)
    top_p: float = 1.0  # nucleus sampling, applied to target and draft alike when sampling
    seed: int = 0  # sampling seed (unused when greedy)

    def validate(self) -> None:
        if self.max_new_tokens <= 0:
            raise DiscoError(f"--max-new-tokens must be positive (got {self.max_new_tokens})")
        if self.max_window < 0:
            raise DiscoError(f"--max-window must be 0 or more (got {self.max_window})")
        if self.temperature < 0:
            raise DiscoError(f"--temperature must be 0 (greedy) or positive (got {self.temperature})")
        if not 0.0 < self.top_p <= 1.0:
            raise DiscoError(f"--top-p must be within (0, 1] (got {self.top_p})")


@dataclass
class GenStats:
    new_tokens: int = 0  # tokens generated (including a final EOS)
    target_forwards: int = 0  # target calls after the prompt prefill (one per round)
    draft_forwards: int = 0  # draft calls after the prompt prefill (one per drafted token)
    drafted: int = 0  # draft tokens sent to verification
    accepted: int = 0  # draft tokens the target accepted
    windows: list[int] = field(default_factory=list)  # drafted tokens per round
    accepted_per_window: list[int] = field(default_factory=list)  # accepted tokens per round
    prefill_s: float = 0.0  # the target's prompt prefill (and encoding); the draft's runs at its first window
    # tokens re-run because a KV cache could not be rolled back (crop failed); 0 when rollback is a crop
    recomputed_tokens: int = 0
    # filler tokens that padded forwards up to a captured width (torch --compile): the cost of a
    # verify is its bucket's, not its width's
    padded_tokens: int = 0
    wall_s: float = 0.0  # the whole call, prefill included

    def record_window(self, drafted: int, accepted: int) -> None:
        """One verified window (the loop and the simulator count alike)."""
        self.windows.append(drafted)
        self.accepted_per_window.append(accepted)
        self.drafted += drafted
        self.accepted += accepted

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def summary(self) -> str:
        return (
            f"{self.new_tokens} tokens in {self.wall_s:.2f}s ({self.tokens_per_s:.2f} tok/s); "
            f"target forwards {self.target_forwards}, draft forwards {self.draft_forwards}, "
            f"accepted {self.accepted}/{self.drafted} drafted ({100 * self.acceptance_rate:.0f}%)"
            + (f"; {self.recomputed_tokens} tokens re-run (a cache could not be cropped)"
               if self.recomputed_tokens else "")
            + (f"; {self.padded_tokens} filler tokens padded forwards to captured widths" if self.padded_tokens else "")
        )

    def to_dict(self) -> dict:
        return {
            "new_tokens": self.new_tokens,
            "target_forwards": self.target_forwards,
            "draft_forwards": self.draft_forwards,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "windows": self.windows,
            "accepted_per_window": self.accepted_per_window,
            "prefill_s": self.prefill_s,
            "cache_rollback": "recompute" if self.recomputed_tokens else "crop",
            "recomputed_tokens": self.recomputed_tokens,
            "padded_tokens": self.padded_tokens,
            "wall_s": self.wall_s,
            "tokens_per_s": self.tokens_per_s,
        }


@dataclass
class GenResult:
    tokens: list[int]  # generated token ids (prompt excluded)
    stats: GenStats


def warp(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """The distribution a token is drawn from: softmax (greedy) or temperature + top-p (sampling)."""
    if temperature == 0.0:
        return torch.softmax(logits.float(), dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return _nucleus(probs, top_p) if top_p < 1.0 else probs


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest prefix of each row, by decreasing probability, whose mass reaches top_p (the
    top token always stays), renormalised. The prefix is found among the top k for a growing k: a
    sort of a 150k vocabulary costs ~11 ms a row on a CPU core, a top-256 ~0.3 ms."""
    vocab = probs.shape[-1]
    k = min(256, vocab)
    while True:
        top, order = probs.topk(k, dim=-1)  # sorted, descending
        if k == vocab or bool((top.sum(-1) >= top_p).all()):
            break
        k = min(vocab, 8 * k)
    top = top.masked_fill(top.cumsum(-1) - top >= top_p, 0.0)
    kept = torch.zeros_like(probs).scatter(-1, order, top)
    return kept / kept.sum(-1, keepdim=True)


def _pick(probs: torch.Tensor, greedy: bool, gen: torch.Generator | None) -> torch.Tensor:
    if greedy:
        return probs.argmax(-1)
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def speculative_generate(
    target: Engine | torch.nn.Module,
    draft: Engine | torch.nn.Module | None,
    prompt_ids: list[int],
    policy: StoppingPolicy | None,
    config: DecodeConfig,
    eos_token_ids: set[int] = frozenset(),
    target_rows: list[torch.Tensor] | None = None,
) -> GenResult:
    """Generate from `target`, drafting with `draft` under `policy`.

    Greedy (temperature 0): the output equals the target's own greedy decoding token for token.
    Sampling: Leviathan et al.'s rejection sampling keeps the target's distribution.
    max_window = 0 (or no draft) is plain target-only decoding through the same code.
    target_rows: a list to append the target's logits at every generated position to ((n, vocab)
    per round: what the collector needs, with no second target pass).
    """
    config.validate()
    if not prompt_ids:
        raise DiscoError("the prompt is empty: give at least one token of text")
    max_window = config.max_window if draft is not None and policy is not None else 0
    target = as_engine(target)  # a torch model runs on the torch engine
    draft = as_engine(draft) if max_window > 0 else None
    device = target.device
    greedy = config.temperature == 0.0
    gen = None if greedy else torch.Generator(device=device).manual_seed(config.seed)
    stats = GenStats()

    _sync(device)
    t0 = time.perf_counter()
    ids = torch.tensor(prompt_ids, dtype=torch.long, device=device)  # prompt + output so far
    if max_window > 0:
        check_compatible(target, draft)
    capacity = len(prompt_ids) + config.max_new_tokens  # the furthest position any forward reaches
    t_state = target.session(ids, capacity=capacity)
    t_state.prefill()  # everything but the pending (last) token
    want_hidden = max_window > 0 and policy.needs_hidden
    d_state = None  # the draft's session opens (and prefills) at its first window: a policy may never draft
    _sync(device)
    stats.prefill_s = time.perf_counter() - t0
    n_prompt = len(prompt_ids)
    out: list[int] = []

    while len(out) < config.max_new_tokens:
        # 1. Draft: up to k tokens, the policy deciding after each one.
        k_max = min(max_window, config.max_new_tokens - len(out) - 1)  # verification adds one token
        drafted: list[torch.Tensor] = []
        q_rows: list[torch.Tensor] = []
        if k_max > 0 and policy.drafts():
            if d_state is None:
                d_state = draft.session(ids[:n_prompt], hidden=want_hidden, capacity=capacity)
                d_state.prefill()
            policy.start()
            feed = d_state.unseen(ids)
            for pos in range(1, k_max + 1):
                logits = d_state.forward(feed, 1)[0]
                stats.draft_forwards += 1
                q = warp(logits, config.temperature, config.top_p)
                tok = _pick(q, greedy, gen)
                hidden = d_state.hidden()[-1] if want_hidden else None
                step = DraftStep(logits, q, tok, pos, len(out) + pos - 1, ids, drafted[:], hidden)
                drafted.append(tok)
                q_rows.append(q)
                if policy.should_stop(step) or pos == k_max:
                    break
                feed = tok.view(1)
        k = len(drafted)

        # 2. Verify: one target forward over the pending token(s) and every draft token.
        draft_ids = torch.stack(drafted) if drafted else ids.new_empty(0)
        t_logits = t_state.forward(torch.cat([t_state.unseen(ids), draft_ids]), k + 1)
        stats.target_forwards += 1

        # 3. Accept: the longest agreeing prefix, then the target's own next token.
        if greedy:
            target_tokens = t_logits.argmax(-1)  # (k + 1,)
            n = int((draft_ids == target_tokens[:k]).cumprod(0).sum())
            next_tok = target_tokens[n]
        else:
            p = warp(t_logits, config.temperature, config.top_p)  # (k + 1, vocab)
            n, next_tok = _rejection_sample(p, q_rows, draft_ids, gen)
        new = torch.cat([draft_ids[:n], next_tok.view(1)])

        # 4. Commit (stopping at EOS and the token budget), roll both caches back.
        new_list = new.tolist()
        for i, t in enumerate(new_list):
            if t in eos_token_ids:
                new_list = new_list[: i + 1]
                break
        new_list = new_list[: config.max_new_tokens - len(out)]
        out.extend(new_list)
        if target_rows is not None:
            target_rows.append(t_logits[: len(new_list)])
        ids = torch.cat([ids, new[: len(new_list)]])
        t_state.truncate(len(ids) - 1)
        if d_state is not None:
            d_state.truncate(len(ids) - 1)

        # 5. Record.
        if k > 0:
            # what the target said at its own token (the policy computes it only if it reads it)
            signals = lambda: target_signals(warp(t_logits[n], config.temperature, config.top_p), next_tok,  # noqa: E731
                                             q_rows[n] if n < k else None)
            policy.update(k, n, signals)
            stats.record_window(k, n)
        if new_list and new_list[-1] in eos_token_ids:
            break

    _sync(device)
    stats.wall_s = time.perf_counter() - t0
    stats.new_tokens = len(out)
    stats.recomputed_tokens = t_state.recomputed + (d_state.recomputed if d_state is not None else 0)
    stats.padded_tokens = t_state.padded + (d_state.padded if d_state is not None else 0)
    assert len(ids) == n_prompt + len(out)
    return GenResult(out, stats)


def _rejection_sample(
    p: torch.Tensor, q_rows: list[torch.Tensor], draft_ids: torch.Tensor, gen: torch.Generator
) -> tuple[int, torch.Tensor]:
    """Leviathan et al.: accept draft token i with prob min(1, p_i/q_i); on the first rejection
    sample from the residual max(0, p - q); if all are accepted, sample a bonus token from p."""
    k = len(draft_ids)
    if k:
        q = torch.stack(q_rows)
        rows = torch.arange(k, device=p.device)
        ratio = p[rows, draft_ids] / q[rows, draft_ids]
        u = torch.rand(k, generator=gen, device=p.device)
        n = int((u < ratio).cumprod(0).sum())
    else:
        n = 0
    if n < k:
        residual = (p[n] - q[n]).clamp_min(0.0)
        # The residual is all zero only when p == q, where rejection has probability 0; guard anyway.
        dist = residual if float(residual.sum()) > 0 else p[n]
    else:
        dist = p[k]
    return n, torch.multinomial(dist / dist.sum(), 1, generator=gen).squeeze(-1)


def target_generate(
    target: Engine | torch.nn.Module, prompt_ids: list[int], config: DecodeConfig, eos_token_ids: set[int] = frozenset(),
    target_rows: list[torch.Tensor] | None = None,
) -> GenResult:
    """Plain target-only decoding, through the same loop (the baseline every speedup is measured against)."""
    cfg = DecodeConfig(**{**config.__dict__, "max_window": 0})
    return speculative_generate(target, None, prompt_ids, None, cfg, eos_token_ids, target_rows)


def generate(pair, prompt: str | list[dict], spec: PolicySpec, config: DecodeConfig, chat: bool | None = None,
             target_tokens: list[int] | None = None) -> GenResult:
    """Encode a prompt for `pair` and decode it under the policy `spec` (the CLI's `generate`).

    target_tokens: the target's greedy continuation if already known (the oracle needs it)."""
    config.validate()
    ids = pair.encode(prompt, chat)
    if len(ids) + config.max_new_tokens > pair.context_length:
        raise DiscoError(
            f"the prompt ({len(ids)} tokens) plus --max-new-tokens {config.max_new_tokens} exceeds the "
            f"models' context of {pair.context_length} tokens: shorten the prompt or lower --max-new-tokens"
        )
    if spec.name == "target":
        return target_generate(pair.target, ids, config, pair.eos_token_ids)
    if spec.name == "oracle":
        if config.temperature > 0:
            raise DiscoError("the oracle policy is defined for greedy decoding only: use --temperature 0")
        if target_tokens is None:
            target_tokens = target_generate(pair.target, ids, config, pair.eos_token_ids).tokens
    policy = spec.build(target_tokens, pair, config.max_window, (config.temperature, config.top_p))
    return speculative_generate(pair.target, pair.draft, ids, policy, config, pair.eos_token_ids)
