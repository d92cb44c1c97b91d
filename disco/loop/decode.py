"""The speculative decoding loop: draft -> verify -> accept -> commit -> record (rounds.py names the phases).

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
from collections.abc import Collection
from dataclasses import dataclass

import torch

from disco.base.defaults import (
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_MAX_WINDOW,
    DEFAULT_SEED,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_P,
)
from disco.base.errors import DiscoError
from disco.base.settings import check_setting
from disco.core.features import target_signals
from disco.core.stats import GenResult, GenStats
from disco.engines.base import Engine, Session, sync
from disco.loop.engine_registry import check_compatible, loop_engine
from disco.policies.closed_loop_policy import LoopStream
from disco.policies.policy import DraftStep, StoppingPolicy, decide_now
from disco.policies.policy_registry import PolicySpec
from disco.policies.rounds import commit, draft_window, end_round, leading_run, verified_count, window_limit

__all__ = ["DecodeConfig", "GenResult", "GenStats", "generate", "speculative_generate", "target_generate", "warp"]


@dataclass
class DecodeConfig:
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS  # generated tokens at most (EOS stops earlier)
    max_window: int = DEFAULT_MAX_WINDOW  # draft tokens per round at most; 0 = target-only decoding
    temperature: float = DEFAULT_TEMPERATURE  # 0 = greedy (output identical to the target's greedy decoding)
    top_p: float = DEFAULT_TOP_P  # nucleus sampling, applied to target and draft alike when sampling
    seed: int = DEFAULT_SEED  # sampling seed (unused when greedy)

    def validate(self) -> None:
        for name, value in vars(self).items():
            if name != "seed":
                check_setting(name, value)


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


class Drafter:
    """The draft model's side of the live loop: its session, opened (and prefilled) at the first window,
    since a policy may never draft, and the current window's tokens and distributions."""

    def __init__(
        self,
        engine: Engine | None,
        n_prompt: int,
        hidden: bool,
        capacity: int,
        config: DecodeConfig,
        gen: torch.Generator | None,
    ) -> None:
        self.engine, self.n_prompt, self.want_hidden, self.capacity = engine, n_prompt, hidden, capacity
        self.config, self.gen = config, gen
        self.session: Session | None = None
        self.begin(torch.empty(0, dtype=torch.long))

    def begin(self, ids: torch.Tensor) -> None:
        """A new round after the committed tokens `ids` (prompt + output)."""
        self.ids = ids
        self.tokens: list[torch.Tensor] = []  # this window's draft tokens (0-dim) ...
        self.q_rows: list[torch.Tensor] = []  # ... and the distributions they were drawn from

    def propose(self, pos: int) -> DraftStep:
        """Draft the pos-th token of the window: what the policy decides on."""
        if self.session is None:
            assert self.engine is not None, "a round drafts only with a draft"
            self.session = self.engine.session(
                self.ids[: self.n_prompt], hidden=self.want_hidden, capacity=self.capacity
            )
            self.session.prefill()
        feed = self.session.unseen(self.ids) if pos == 1 else self.tokens[-1].view(1)
        logits = self.session.forward(feed, 1)[0]
        states = self.session.hidden() if self.want_hidden else None
        return self.take(pos, logits, states[-1] if states is not None else None)

    def take(self, pos: int, logits: torch.Tensor, hidden: torch.Tensor | None) -> DraftStep:
        """The pos-th token of the window from the draft's (vocab,) logits there (and its last hidden state):
        propose's second half, also for logits a batched draft computed for many requests at once."""
        q = warp(logits, self.config.temperature, self.config.top_p)
        tok = _pick(q, self.gen is None, self.gen)
        gen_pos = len(self.ids) - self.n_prompt + pos - 1
        step = DraftStep(logits, q, tok, pos, gen_pos, self.ids, self.tokens[:], hidden)
        self.tokens.append(tok)
        self.q_rows.append(q)
        return step

    def window(self) -> torch.Tensor:
        return torch.stack(self.tokens) if self.tokens else self.ids.new_empty(0)


@torch.inference_mode()
def speculative_generate(
    target: Engine | torch.nn.Module,
    draft: Engine | torch.nn.Module | None,
    prompt_ids: list[int],
    policy: StoppingPolicy | None,
    config: DecodeConfig,
    eos_token_ids: Collection[int] = frozenset(),
    target_rows: list[torch.Tensor] | None = None,
) -> GenResult:
    """Generate from `target`, drafting with `draft` under `policy`.

    Greedy (temperature 0): the output equals the target's own greedy decoding token for token.
    Sampling: Leviathan et al.'s rejection sampling keeps the target's distribution.
    max_window = 0 (or no draft, or no policy) is plain target-only decoding through the same code.
    target_rows: a list to append the target's logits at every generated position to ((n, vocab)
    per round: what the collector needs, with no second target pass).
    """
    config.validate()
    if not prompt_ids:
        raise DiscoError("the prompt is empty: give at least one token of text")
    max_window = config.max_window if draft is not None and policy is not None else 0
    target = loop_engine(target)  # a torch model runs on the torch engine
    draft = loop_engine(draft) if max_window > 0 else None
    if draft is not None:
        check_compatible(target, draft)
    device = target.device
    greedy = config.temperature == 0.0
    gen = None if greedy else torch.Generator(device=device).manual_seed(config.seed)
    stats = GenStats()

    sync(device)
    t0 = time.perf_counter()
    ids = torch.tensor(prompt_ids, dtype=torch.long, device=device)  # prompt + output so far
    capacity = len(prompt_ids) + config.max_new_tokens  # the furthest position any forward reaches
    target_session = target.session(ids, capacity=capacity)
    target_session.prefill()  # everything but the pending (last) token
    want_hidden = policy is not None and max_window > 0 and policy.needs_hidden
    drafter = Drafter(draft, len(prompt_ids), want_hidden, capacity, config, gen)
    sync(device)
    stats.prefill_s = time.perf_counter() - t0
    out: list[int] = []

    while len(out) < config.max_new_tokens:
        # 1. Draft: up to k_max tokens, the policy deciding after each one; trim to the v it verifies.
        drafter.begin(ids)
        k_max = window_limit(max_window, config.max_new_tokens, len(out))
        k = decide_now(draft_window(policy, k_max, drafter.propose, stats), policy)
        v = verified_count(policy, k)  # the first v drafts go to verification (a budget policy trims)

        # 2. Verify: one target forward over the pending token(s) and the v draft tokens.
        draft_ids = drafter.window()[:v]
        t_logits = target_session.forward(torch.cat([target_session.unseen(ids), draft_ids]), v + 1)

        # 3. Accept: the longest agreeing prefix, then the target's own next token.
        if greedy:
            target_tokens = t_logits.argmax(-1)  # (v + 1,)
            n = leading_run(draft_ids == target_tokens[:v])
            next_tok = target_tokens[n]
        else:
            p = warp(t_logits, config.temperature, config.top_p)  # (v + 1, vocab)
            n, next_tok = _rejection_sample(p, drafter.q_rows[:v], draft_ids, gen)
        new = torch.cat([draft_ids[:n], next_tok.view(1)])

        # 4. Commit (stopping at EOS and the token budget), roll both caches back.
        new_list = commit(new.tolist(), eos_token_ids, config.max_new_tokens - len(out))
        out.extend(new_list)
        if target_rows is not None:
            target_rows.append(t_logits[: len(new_list)])
        ids = torch.cat([ids, new[: len(new_list)]])
        target_session.truncate(len(ids) - 1)
        if drafter.session is not None:
            drafter.session.truncate(len(ids) - 1)

        # 5. Record: what the target said at its own token (computed only if the policy reads it).
        q_next = drafter.q_rows[n] if n < v else None
        signals = lambda: target_signals(warp(t_logits[n], config.temperature, config.top_p), next_tok, q_next)  # noqa: E731
        end_round(policy, stats, k, n, signals, verified=v)
        if new_list and new_list[-1] in eos_token_ids:
            break

    sync(device)
    stats.wall_s = time.perf_counter() - t0
    stats.new_tokens = len(out)
    sessions = [s for s in (target_session, drafter.session) if s is not None]
    stats.recomputed_tokens = sum(s.recomputed for s in sessions)
    stats.padded_tokens = sum(s.padded for s in sessions)
    assert len(ids) == len(prompt_ids) + len(out)
    return GenResult(out, stats)


def _rejection_sample(
    p: torch.Tensor, q_rows: list[torch.Tensor], draft_ids: torch.Tensor, gen: torch.Generator | None
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
    target: Engine | torch.nn.Module,
    prompt_ids: list[int],
    config: DecodeConfig,
    eos_token_ids: Collection[int] = frozenset(),
    target_rows: list[torch.Tensor] | None = None,
) -> GenResult:
    """Plain target-only decoding, through the same loop (the baseline every speedup is measured against)."""
    cfg = DecodeConfig(**{**config.__dict__, "max_window": 0})
    return speculative_generate(target, None, prompt_ids, None, cfg, eos_token_ids, target_rows)


def generate(
    pair,
    prompt: str | list[dict],
    spec: PolicySpec,
    config: DecodeConfig,
    chat: bool | None = None,
    target_tokens: list[int] | None = None,
) -> GenResult:
    """Encode a prompt for `pair` and decode it under the policy `spec` (generate_ids)."""
    config.validate()
    return generate_ids(pair, pair.encode(prompt, chat), spec, config, target_tokens)


def generate_ids(
    pair,
    ids: list[int],
    spec: PolicySpec,
    config: DecodeConfig,
    target_tokens: list[int] | None = None,
    closed: LoopStream | None = None,
) -> GenResult:
    """Decode the prompt `ids` under the policy `spec` (runner.LoopRunner: the CLI's `generate`, compare's rows).

    target_tokens: the target's greedy continuation if already known (the oracle needs it).
    closed: the policy runs under this stream's closed loop (closed_loop_policy.ClosedLoopPolicy: costs timed here,
    calibration, governor), through the policy interface: the round is the same."""
    config.validate()
    if len(ids) + config.max_new_tokens > pair.context_length:
        raise DiscoError(
            f"the prompt ({len(ids)} tokens) plus --max-new-tokens {config.max_new_tokens} exceeds the "
            f"models' context of {pair.context_length} tokens: shorten the prompt or lower --max-new-tokens"
        )
    kind = spec.kind
    if kind.greedy_only and config.temperature > 0:
        raise DiscoError(f"the {spec.name} policy is defined for greedy decoding only: use --temperature 0")
    if kind.needs_target_tokens and target_tokens is None:
        target_tokens = target_generate(pair.target, ids, config, pair.eos_token_ids).tokens
    policy = spec.build(target_tokens, pair, config.max_window, (config.temperature, config.top_p))
    if closed is not None and policy is not None:
        policy = closed.wrap(policy, config.max_window)
    return speculative_generate(pair.target, pair.draft, ids, policy, config, pair.eos_token_ids)
