"""The closed loop (online.closed_loop.ClosedLoop) through the StoppingPolicy calls (docs/architecture.md, "Closed
loop"): each request's policy under the loop's decisions (LoopDecisions: the side-engine proposer's requests, timed by
the proposer's batched steps), and in disco's own loop (loop/decode.py: one request at a time, batch 1) the same timed
from the calls alone (ClosedLoopPolicy, LoopStream). Policy wrappers, so they sit with the policies, above the closed
loop's parts."""

from __future__ import annotations

import sys
import time
from typing import Any

import torch

from disco.core.cost import CostModel
from disco.online.closed_loop import ClosedLoop
from disco.policies.policy import Decision, PolicyBase, Signals, StoppingPolicy


def _say(line: str) -> None:
    print(f"disco: {line}", file=sys.stderr, flush=True)


class LoopStream:
    """One closed loop across a stream of requests in disco's loop (runner.LoopRunner: a generate run, a compare
    row): made at the first request, seeded with `seed` if given (a profile), else with the cost model the first
    policy decides by (a classifier's: its artifact's), else with none (a warm-up sets the scale)."""

    def __init__(self, seed: CostModel | None = None) -> None:
        self.seed = seed
        self.loop: ClosedLoop | None = None

    def wrap(self, policy: StoppingPolicy, max_window: int) -> ClosedLoopPolicy:
        """`policy` (a fresh one for this request) under the stream's closed loop."""
        if self.loop is None:
            seed = self.seed if self.seed is not None else getattr(policy, "cost", None)
            # calibration on the host: disco's loop reads each P(accept) there anyway (one sync per draft token)
            self.loop = ClosedLoop(seed, 1, max_window, torch.device("cpu"), True, idle_position=False, say=_say)
            start = f"{seed.source}'s costs" if seed is not None else "a warm-up"
            _say(
                f"the {policy.name} policy runs under the closed loop: costs timed in this run (from {start}), "
                "P(accept) recalibrated from verified windows, a governor against fixed draft lengths"
            )
        return ClosedLoopPolicy(policy, self.loop)


class LoopDecisions(PolicyBase):
    """A policy under a closed loop's decisions, timed by its caller (online.closed_loop.ClosedLoop): before each
    window the caller hands it the loop's fixed length for the window, if any, and the running costs (`choose`).

    - the fixed length (a warm-up probe, the governor's) replaces the inner policy's decisions for that window; the
      inner policy still learns every outcome (update);
    - else the inner policy decides, by the running costs if it reads a cost model (`cost`: the classifier's cost
      rules), its P(accept) passed through the online calibration at the token's window position; each window it
      decided teaches the calibration its verified outcome.

    ClosedLoopPolicy (disco's loop, one request) times the round from these calls itself; the side-engine proposer
    (vllm/side.py) times its batched steps and hands each request's policy the step's choice."""

    def __init__(self, inner: StoppingPolicy, loop: ClosedLoop) -> None:
        self.inner, self.loop = inner, loop
        self.name, self.needs_hidden = inner.name, inner.needs_hidden
        self._fixed: int | None = None  # this window's fixed length (None: the inner policy decides)
        self._p: list[float] = []  # the model's own P(accept) of this window's tokens (the calibration's input)
        self._pos = 0  # the window position of the token being decided

    def choose(self, fixed: int | None, cost: CostModel | None) -> None:
        """The next window: drafted at the fixed length `fixed` (0: none), or (None) by the inner policy, with
        `cost` as its cost model if it reads one."""
        self._fixed = fixed
        if fixed is None and cost is not None and hasattr(self.inner, "cost"):
            self.inner.cost = cost

    def drafts(self) -> bool:
        return self._fixed > 0 if self._fixed is not None else self.inner.drafts()

    def start(self) -> None:
        self.inner.start()
        self._p = []

    def decide(self, step: Any) -> Decision:
        self._pos = step.window_pos
        if self._fixed is not None:
            return step.window_pos >= self._fixed
        return (yield from self.inner.decide(step))

    def p_accept(self, question: Any) -> float:
        p = self.inner.p_accept(question)
        self._p.append(p)
        calibration = self.loop.calibration
        row = min(self._pos, self.loop.max_window)
        if calibration is None or int(calibration.seen[row]) < calibration.min_count:
            return p  # (exactly the model's until the position is calibrated)
        return float(calibration.calibrate(self._pos, torch.tensor([p], dtype=torch.float64))[0])

    def trim(self, drafted: int) -> int:
        """The tokens of the window the target verifies (rounds.verified_count): a budget policy's trim when it
        decided the window; a fixed length's window (a probe, the governor's) is verified whole."""
        trim = getattr(self.inner, "trim", None)
        return drafted if trim is None or self._fixed is not None else int(trim(drafted))

    def update(self, n_drafted: int, n_accepted: int, signals: Signals | None = None) -> None:
        # n_drafted: the tokens verified (a trimmed window's first ones: the P(accept) of those met an outcome)
        self.inner.update(n_drafted, n_accepted, signals)
        calibration = self.loop.calibration
        if calibration is not None and self._fixed is None and 0 < n_drafted <= len(self._p):
            calibration.observe_windows(
                torch.tensor([self._p[:n_drafted]], dtype=torch.float64),
                torch.tensor([n_drafted]),
                torch.tensor([n_accepted]),
            )


class ClosedLoopPolicy(LoopDecisions):
    """A policy under the closed loop in disco's loop (decode.speculative_generate), through the StoppingPolicy
    calls alone, so the round is the same with the loop on or off: LoopDecisions' decisions, and the timing of the
    round from those calls:

    - a draft position from one token's decision to the next (the position's forward and the last decision; on a
      GPU read once the token is on the host), the target's verification from the window's last decision to
      update() (the forward, the acceptance, the commit, the policy's update) by the window's tokens (drafted + 1),
      the round from one update to the next for the governor; a round that drafted nothing is closed at the next
      drafts(); position 1 is timed only after a round that drafted (else it also fills the draft's cache: its
      prefill in a request's first window, the tokens of rounds that drafted nothing);
    - before each window the loop's choice (ClosedLoop.override at batch 1) and its running cost table."""

    def __init__(self, inner: StoppingPolicy, loop: ClosedLoop) -> None:
        super().__init__(inner, loop)
        self._mark = 0.0  # when the span being timed began (the last decision, or the window's start)
        self._begun = False  # this request's first drafts() was asked
        self._pending = False  # a round that drafted nothing waits to be closed at the next drafts()
        self._drafted = False  # the last round drafted (the draft's cache is current but for 1-2 tokens)

    def drafts(self) -> bool:
        now = time.perf_counter()
        if not self._begun:
            self.loop.begin(now)
            self._begun = True
        elif self._pending:
            self._close(now, 0, 0)
        fixed = self.loop.override(1)
        self.choose(fixed, self.loop.cost_model() if fixed is None else None)
        drafts = super().drafts()
        self._mark = time.perf_counter()
        if not drafts:  # a target-only round: drafting is over at once
            self.loop.ended(self._mark)
            self._pending = True
        return drafts

    def decide(self, step: Any) -> Decision:
        int(step.token)  # (the host waits for the position's forward: its time is its own on a GPU too)
        now = time.perf_counter()
        if step.window_pos > 1 or self._drafted:
            self.loop.position(1, now - self._mark)
        self._mark = now
        return (yield from super().decide(step))

    def update(self, n_drafted: int, n_accepted: int, signals: Signals | None = None) -> None:
        super().update(n_drafted, n_accepted, signals)
        self.loop.ended(self._mark)  # drafting ended with the window's last decision
        self._close(time.perf_counter(), n_drafted, n_accepted)

    def _close(self, now: float, drafted: int, accepted: int) -> None:
        """The round ends: its target step over drafted + 1 tokens, its outcome, its time (ClosedLoop.step)."""
        self.loop.step(now, drafted + 1, [drafted], [accepted])
        self._pending, self._drafted = False, drafted > 0
