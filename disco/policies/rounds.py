"""One round of speculative decoding, defined once (docs/architecture.md, "Rounds").

    1. draft    up to k_max = window_limit(...) tokens, the policy deciding after each one
       trim     the first v = verified_count(...) of the k drafts go to verification (v = k but for a budget)
    2. verify   one target forward over the pending token and those v drafts   (the caller's)
    3. accept   the leading run of drafts the target agrees with, plus its own next token
    4. commit   those tokens, cut at EOS and at the token budget
    5. record   the policy learns what the target said; the stats count the window

The live loop (decode.speculative_generate) runs it on models, the simulator (simulate._replay) on
traces: both call the functions below, so a simulated round counts exactly as a live one. Phase 1 is a
generator so that a learned policy's question (its model's input) can be answered later: the simulator
batches those across prompts (simulate._drive), the live loop answers each at once (policy.decide_now).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Generator
from typing import Any

from disco.core.stats import GenStats
from disco.policies.policy import Decision, StoppingPolicy

# Phase 1 as a generator: yields a learned policy's model input, is sent P(accept) back, returns the
# number of tokens drafted.
Decisions = Generator[Any, float, int]


def window_limit(max_window: int, max_new_tokens: int, generated: int) -> int:
    """The most tokens a round may draft: the verification adds one token of the target's own, so a
    round leaves room for it within the budget (0 or less: a target-only round)."""
    return min(max_window, max_new_tokens - generated - 1)


def draft_window(
    policy: StoppingPolicy | None, k_max: int, propose: Callable[[int], Any | None], stats: GenStats
) -> Decisions:
    """Phase 1: draft up to k_max tokens. propose(pos) drafts the pos-th token of the window (1-based)
    and returns the step the policy decides on, or None where there is nothing to draft (a trace past
    its EOS); the policy's `drafts()` is asked first, `start()` before the first token."""
    if policy is None or not opens_window(policy, k_max):
        return 0
    k = 0
    for pos in range(1, k_max + 1):
        step = propose(pos)
        if step is None:
            break
        k = pos
        stop = yield from decide_token(policy, step, stats)
        if stop or pos == k_max:
            break
    return k


# draft_window's two halves, for a caller that drafts many requests' windows in lockstep (one batched draft
# forward per position: side.DiscoProposer): the same calls in the same order per policy, so each
# request's decisions and counts are exactly those of draft_window.


def opens_window(policy: StoppingPolicy | None, k_max: int) -> bool:
    """Whether a window is drafted at all (the policy's `drafts()`); if so the policy is `start()`ed."""
    if k_max <= 0 or policy is None or not policy.drafts():
        return False
    policy.start()
    return True


def decide_token(policy: StoppingPolicy, step: Any, stats: GenStats) -> Decision:
    """One drafted token counted and decided on: returns whether the window stops after it."""
    stats.draft_forwards += 1
    return (yield from policy.decide(step))


def verified_count(policy: StoppingPolicy | None, drafted: int) -> int:
    """Phase 1's trim: how many of the window's `drafted` tokens the target verifies (their first v): the policy's
    `trim(drafted)` hook (loop_budget.LoopBudget: a budget of the window's best prefix), by default all of them.
    The drafts past v are dropped unverified (their draft forwards stay counted)."""
    trim = getattr(policy, "trim", None)
    if drafted == 0 or trim is None:
        return drafted
    v = int(trim(drafted))
    assert 0 <= v <= drafted, f"a trim of {drafted} drafts to {v}"
    return v


def leading_run(agree: Any) -> int:
    """Phase 3: the number of leading True values of a 1-d bool tensor or array (accepted drafts)."""
    return int(agree.cumprod(0).sum())


def eos_cut(tokens: list[int], eos_token_ids: Collection[int]) -> list[int]:
    """The tokens up to and including the first end-of-sequence token."""
    for i, t in enumerate(tokens):
        if t in eos_token_ids:
            return tokens[: i + 1]
    return tokens


def commit(tokens: list[int], eos_token_ids: Collection[int], room: int) -> list[int]:
    """Phase 4: what a round adds to the output: cut at EOS, then at the `room` tokens the budget has left."""
    return eos_cut(tokens, eos_token_ids)[:room]


def end_round(
    policy: StoppingPolicy | None,
    stats: GenStats,
    drafted: int,
    accepted: int,
    signals: Callable[[], Any] | None,
    counted: float | None = None,
    verified: int | None = None,
) -> None:
    """Phase 5: one target forward counted; a window that drafted tells the policy how it went (the tokens
    verified, the accepted ones, signals(): what the target said at its own token, computed only if the policy
    reads it) and a verified window is recorded (its verified tokens: the verification's width).
    counted: the accepted tokens to count when they differ from `accepted` (the simulator's expectation).
    verified: the tokens verified when the policy trimmed the window (verified_count); default: all drafted."""
    stats.target_forwards += 1
    v = drafted if verified is None else verified
    if drafted > 0:
        assert policy is not None, "only a policy drafts"
        policy.update(v, accepted, signals)
    if v > 0:
        stats.record_window(v, accepted if counted is None else counted)
