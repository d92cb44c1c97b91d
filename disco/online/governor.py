"""A governor that keeps a stopping policy honest against the engine's own fixed draft length (docs/architecture.md,
"Closed loop").

From what the serving process sees each step (each request's drafted and accepted length, the batch size, the
step's wall time) and its running costs (online_costs.OnlineCosts), it estimates
- alpha_j: per-position conditional acceptance (token j accepted given the j - 1 before it were), from counts of
  the judged tokens (the accepted ones and each window's first rejected one) that decay by 1 - 1/GOVERNOR_MEMORY
  each step that drafts; a position no window reached inherits the deepest estimate;
- what a plain fixed length k = 0 .. K would give on the same steps (the batch sizes of the window):
  tokens b * E_k, E_k = 1 + sum_{j<=k} prod_{i<=j} alpha_i, in c_step(b (k + 1)) + c_first(b) + (k - 1) c_draft(b)
  seconds (c_first: a step's first position, with vLLM's catch-up);
- the policy's own measured tokens per second over the last GOVERNOR_WINDOW steps;
all as speedups over target-only (b tokens per c_step(b)), which travel across batch sizes; a measured speedup
at the machine's pace over its steps (their target steps as timed, over the table's cost: Spell.pace), so a
slowdown every mode shares, which the table's running medians follow only later, is no mode's loss.

choose() -> None (the policy decides) or k (run fixed k; 0: draft nothing):
- a spell counts the steps decided in it (a step decided under the last mode is no one's: closed_loop.Decision);
  a spell of the policy is judged once it has GOVERNOR_WINDOW steps, then every GOVERNOR_WINDOW / 8 steps, on the
  last GOVERNOR_WINDOW: when the best fixed length beats the policy by GOVERNOR_MARGIN (k = 0 by nothing:
  Governor._beating), the governor takes over with it. So a policy losing from its start is replaced after
  GOVERNOR_WINDOW steps, one that starts losing later within 9/8 GOVERNOR_WINDOW steps of the change; a spell that
  drafted nothing at all (the policy is then k = 0 with the draft's catch-up pass, no noise in its tokens) is
  judged from GOVERNOR_WINDOW / 4 steps on, and so is one whose last GOVERNOR_WINDOW / 4 steps ran at another batch
  band than its first, on those steps alone (Governor._rebase: a new load, within a quarter window of its start);
- on a fixed length it moves to another only when that one's estimate beats it (as estimated, or as measured over
  its last GOVERNOR_WINDOW steps if lower; k = 0 over a full window only) by the margin (k = 0 by nothing),
  judged from GOVERNOR_WINDOW / 4 steps on
  (so a shift in acceptance that moves the best length twice moves it within two quarters, not two windows);
  k = 0 verifies no window, so its estimates of the others move only with the costs' noise: it is left for a drafting
  length only where the batch band fell below the one it began at and stayed there (kept there, it begins again at
  that band), else at the hold's end, through the policy's trial; a band above holds it unjudged (Governor.holds_off:
  a batch of more requests pays less for drafting, so where k = 0 won, drafting loses at more requests too);
  after a hold
  (GOVERNOR_HOLD steps, doubled after each failed trial up to GOVERNOR_MAX_HOLD) the policy gets a trial of
  GOVERNOR_WINDOW steps judged by the same rule (before its full window, from a quarter on, it ends only where it
  runs below k = 0 by the margin), and sooner where the fixed length, judged so, falls below what
  the policy measured before it lost (at the same batch band): it lost to an optimistic estimate. A policy that
  wins again is back within GOVERNOR_MAX_HOLD + GOVERNOR_WINDOW steps; one that keeps losing spends at most
  GOVERNOR_WINDOW / (GOVERNOR_WINDOW + GOVERNOR_MAX_HOLD) of the steps (3 % at the defaults) in trials once the hold
  has grown;
- the estimate of a fixed length is optimistic while the policy runs (alpha comes from the tokens the policy chose to
  draft, the likelier ones), so where this process ran that length at the same batch band in the last
  GOVERNOR_MAX_HOLD steps (a spell of it, else the band's warm-up probes of it: closed_loop.ClosedLoop, three steps
  each) the governor believes the lower of its estimate and its measured speedup, in judging the
  policy and in moving between fixed lengths (which thus move on measurements, not on the noise between two
  estimates); the drafting lengths not run there are believed at their estimates times the shortfall the run ones
  measured (if any), so one optimistic table does not send the governor through every length in turn;
- when neither the policy nor any fixed length reaches target-only's speed, it says so once (`say`).

Memory: a few arrays of GOVERNOR_WINDOW steps and K positions; per step O(batch x K) numpy, per judgement
O(max_batch x K).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from disco.base.defaults import GOVERNOR_HOLD, GOVERNOR_MARGIN, GOVERNOR_MAX_HOLD, GOVERNOR_MEMORY, GOVERNOR_WINDOW
from disco.core.cost import CostModel

_MIN_JUDGED = 1.0  # decayed judged tokens a position needs for its own acceptance estimate


def batch_band(batch: int) -> int:
    """A batch size's band: the largest power of two <= it (1, 2, 4, 8, ...)."""
    return 1 << (max(batch, 1).bit_length() - 1)


def _say(line: str) -> None:
    print(f"disco: {line}", file=sys.stderr, flush=True)


@dataclass
class Spell:
    """The last `window` steps of one mode (the policy, or one fixed length): what was produced in what time."""

    window: int
    max_batch: int

    def __post_init__(self) -> None:
        self.tokens = np.zeros(self.window)
        self.seconds = np.zeros(self.window)
        self.batch = np.zeros(self.window, dtype=np.int64)
        self.target = np.zeros(self.window)  # the step's target step as timed here (0: not timed) ...
        self.verified = np.zeros(self.window, dtype=np.int64)  # ... over this many tokens
        self.drafts = np.zeros(self.window, dtype=np.int64)  # the draft tokens it verified
        self.steps = 0  # steps in this spell so far
        self.started = 0  # the governor's step count when it started
        self.drafted = 0  # draft tokens its steps verified, all of them
        self.first_band = 0  # the batch band of its first step
        self.rebased = False  # the tail of a policy spell that moved to another band (Governor._rebase)

    @property
    def full(self) -> bool:
        return self.steps >= self.window

    def add(
        self, tokens: float, seconds: float, batch: int, drafted: int = 0, target: float = 0.0, verified: int = 0
    ) -> None:
        i = self.steps % self.window
        self.tokens[i], self.seconds[i], self.batch[i] = tokens, seconds, batch
        self.target[i], self.verified[i], self.drafts[i] = target, verified, drafted
        self.first_band = self.first_band or batch_band(batch)
        self.steps += 1
        self.drafted += drafted

    def sizes(self) -> np.ndarray:
        """(max_batch + 1,) how many of the window's steps ran each batch size."""
        n = min(self.steps, self.window)
        return np.bincount(self.batch[:n], minlength=self.max_batch + 1)

    def settled(self, n: int) -> bool:
        """Its last n steps (or all, if fewer; at least one) all ran at its band."""
        return self.last_band(min(n, self.steps, self.window)) == self.band()

    def last_band(self, n: int) -> int | None:
        """The band all its last n steps ran at (None: fewer steps, or more than one band)."""
        if not 0 < n <= self.steps:
            return None
        bands = {batch_band(int(self.batch[(self.steps - 1 - i) % self.window])) for i in range(n)}
        return bands.pop() if len(bands) == 1 else None

    def tail(self, n: int) -> Spell:
        """A spell of its last n steps alone (n <= window)."""
        tail = Spell(self.window, self.max_batch)
        for i in (self.steps - n + np.arange(n)) % self.window:
            tail.add(self.tokens[i], self.seconds[i], int(self.batch[i]), int(self.drafts[i]), self.target[i],
                     int(self.verified[i]))  # fmt: skip
        tail.started = self.started + self.steps - n
        return tail

    def band(self) -> int:
        """The batch band (the largest power of two <= the batch) of its median step."""
        n = min(self.steps, self.window)
        return batch_band(int(np.median(self.batch[:n])) if n else 1)

    def speedup(self, costs: CostModel) -> float:
        """Measured tokens/s over target-only's on the same steps (c_step(b) for b tokens), at the machine's pace of
        those steps: their target steps as timed over what the table says they cost. The table is a running median
        (online_costs), so it lags a change of the machine's speed by half its window; a slowdown every mode shares
        would otherwise read as the drafting length running losing to k = 0, whose speed is target-only's by
        definition (at 4 requests on chat, k = 1 at 1.8x target-only was left for k = 0 when the target step went
        from ~0.35 to ~0.56 s within ten steps: bench/results/closed-loop.md, "2026-12-05, ninth sweep")."""
        n = min(self.steps, self.window)
        rate = self.tokens[:n].sum() / max(self.seconds[:n].sum(), 1e-12)
        return rate * self.pace(costs) / _target_rate(self.sizes(), costs)

    def pace(self, costs: CostModel) -> float:
        """The timed target steps' seconds over the table's for the same tokens (1: none timed)."""
        n = min(self.steps, self.window)
        timed = (self.target[:n] > 0) & (self.verified[:n] >= 1) & (self.verified[:n] <= len(costs.c_step))
        if not timed.any():
            return 1.0
        table = np.asarray(costs.c_step)[self.verified[:n][timed] - 1].sum()
        return float(self.target[:n][timed].sum() / max(table, 1e-12))


def _target_rate(sizes: np.ndarray, costs: CostModel) -> float:
    """Target-only's tokens per second on steps of these batch sizes (sizes[b]: steps of b requests)."""
    b = np.arange(1, len(sizes))
    c_step = np.asarray(costs.c_step)
    return float((sizes[1:] * b).sum() / max((sizes[1:] * c_step[np.minimum(b, len(c_step)) - 1]).sum(), 1e-12))


class Governor:
    """Chooses per step between the policy (None) and a fixed draft length k = 0 .. max_window."""

    def __init__(
        self,
        max_window: int,
        max_batch: int,
        window: int = GOVERNOR_WINDOW,
        margin: float = GOVERNOR_MARGIN,
        hold: int = GOVERNOR_HOLD,
        max_hold: int = GOVERNOR_MAX_HOLD,
        memory: int = GOVERNOR_MEMORY,
        idle_position: bool = False,
        say: Callable[[str], None] = _say,
    ) -> None:
        self.max_window, self.max_batch = max_window, max_batch
        self.window, self.margin, self.hold0, self.max_hold = window, margin, hold, max_hold
        self.decay = 1.0 - 1.0 / memory
        # a step that drafts nothing still runs one draft position (vLLM's catch-up pass, which keeps the draft's
        # KV cache current so the policy can be tried again): what k = 0 costs in this process
        self.idle_position = idle_position
        self.say = say
        self.judged = np.zeros(max_window)  # decayed counts of position j's judged tokens ...
        self.accepted = np.zeros(max_window)  # ... and of its accepted ones
        self.mode: int | None = None  # None: the policy decides; k: fixed length k
        self.trial = False  # the policy's spell is a trial (after a hold on a fixed length)
        self.hold = hold  # the next hold on a fixed length, in steps
        self.until = 0  # the step at which the fixed spell ends in a trial
        self.steps = 0
        self.spells = 0  # spells begun (a step's outcomes judge the spell they were decided in: closed_loop.Decision)
        self.spell = Spell(window, max_batch)
        # the last spell of each fixed length at each batch band ((band, k) -> its last steps), measured enough to
        # judge by (a quarter window; k = 0 a full one)
        self.ran: dict[tuple[int, int], Spell] = {}
        self.policy_ran: dict[int, Spell] = {}  # the policy's last judged spell at each batch band
        self.probed: dict[tuple[int, int], Spell] = {}  # the warm-up probes' steps of each drafting length, by band
        self.said = False
        self.estimates: np.ndarray | None = None  # the last judgement's speedups of k = 0 .. K (for reports)
        self.policy_speedup: float | None = None
        self._costs: CostModel | None = None
        self._times: np.ndarray | None = None  # (max_batch + 1, K + 1) seconds of a fixed-k step at batch b

    # --- what happened ---------------------------------------------------------------------------------------

    def observe(
        self,
        drafted: Sequence[int] | np.ndarray,
        accepted: Sequence[int] | np.ndarray,
        seconds: float,
        spell: bool = True,
        target: float | None = None,
        verified: int = 0,
        probe: int = 0,
    ) -> None:
        """One verified step: each request's drafted and accepted length (the step's decode requests), the step's
        wall time (its target step, its drafting, its decisions: one propose() start to the next). spell: the step
        ran the mode the governor chose (False: a warm-up probe, or a step waiting for stale requests: its outcomes
        teach the acceptance estimates, its time judges no spell). target: its target step's seconds, over
        `verified` tokens, as the cost table is fed them (None: not timed): the machine's pace (Spell.pace). probe: the
        drafting length of a warm-up probe this decode step ran (0: none), measured as that length's at the band."""
        d, a = np.asarray(drafted, dtype=np.int64), np.asarray(accepted, dtype=np.int64)
        self.steps += 1
        if not 0 < len(d) <= self.max_batch:
            return
        if d.any():  # (a step that drafted nothing keeps the estimates as they were: what k = 0 learns nothing of)
            j = np.arange(1, self.max_window + 1)[None, :]
            self.judged = self.judged * self.decay + ((j <= d[:, None]) & (j <= a[:, None] + 1)).sum(0)
            self.accepted = self.accepted * self.decay + (j <= np.minimum(a, d)[:, None]).sum(0)
        step = (float((a + 1).sum()), seconds, len(d), int(d.sum()), target or 0.0, verified)
        if spell:
            self.spell.add(*step)
        if probe > 0:
            probed = self.probed.setdefault((batch_band(len(d)), probe), Spell(self.window, self.max_batch))
            probed.started = probed.started or self.steps
            probed.add(*step)

    def alphas(self) -> np.ndarray | None:
        """(K,) per-position conditional acceptance; None before any window was judged."""
        enough = self.judged >= _MIN_JUDGED
        if not enough[0]:
            return None
        alpha = (self.accepted + 0.5) / (self.judged + 1.0)  # (a half-token prior: never exactly 0 or 1)
        deepest = int(np.flatnonzero(enough)[-1])  # judged counts never grow with j: the reached ones lead
        alpha[deepest + 1 :] = alpha[deepest]
        return alpha

    # --- the estimates ---------------------------------------------------------------------------------------

    def _step_times(self, costs: CostModel) -> np.ndarray:
        """(max_batch + 1, K + 1): seconds of a step of b requests at fixed k (inf beyond the table)."""
        if costs is not self._costs:
            c_step = np.asarray(costs.c_step)
            k = np.arange(self.max_window + 1)[None, :]
            b = np.arange(self.max_batch + 1)[:, None]
            t = b * (k + 1)
            verify = np.where((t >= 1) & (t <= len(c_step)), c_step[np.clip(t, 1, len(c_step)) - 1], np.inf)
            sizes = [max(int(x), 1) for x in b[:, 0]]
            shared = [costs.draft_position(x) for x in sizes]  # None: c_d per request drafting
            position = np.array([costs.c_d * x if s is None else s for s, x in zip(shared, sizes)])[:, None]
            firsts = [costs.first_position(x) for x in sizes]
            first = np.array([p if f is None else f for f, p in zip(firsts, position[:, 0])])[:, None]
            # the first position carries vLLM's catch-up forward and the proposer's own work, timed as its own
            # (online_costs.OnlineCosts.firsts): where k = 1 ran, no later position was ever timed
            drafting = np.where(k >= 1, first + (k - 1) * position, first if self.idle_position else 0.0)
            self._times = verify + drafting
            self._costs = costs
        assert self._times is not None
        return self._times

    def fixed_speedups(self, costs: CostModel) -> np.ndarray | None:
        """(K + 1,) the estimated speedup over target-only of fixed k = 0 .. K on the spell's steps (before any
        window was judged, k = 0's alone: NaN for the others; None with no step in the spell)."""
        alpha = self.alphas()
        sizes = self.spell.sizes()
        if alpha is None and not sizes.any():
            return None
        if alpha is None:  # (a policy that never drafted: k = 0 needs no acceptance to be priced)
            expected = np.concatenate([[1.0], np.full(self.max_window, np.nan)])
        else:
            expected = 1.0 + np.concatenate([[0.0], np.cumsum(np.cumprod(alpha))])  # E_k, k = 0 .. K
        ran = np.flatnonzero(sizes)  # the batch sizes the steps ran (the others' times may be inf: unused)
        tokens = (sizes[ran] * ran).sum() * expected
        seconds = (sizes[ran, None] * self._step_times(costs)[ran]).sum(0)
        return tokens / seconds / _target_rate(sizes, costs)

    def _references(self, costs: CostModel, running: bool = False) -> np.ndarray | None:
        """The fixed lengths' speedups as the judgement believes them: for a length this process ran at this batch
        band within max_hold steps (running: the fixed length now running too, its spell measured enough), the lower
        of its estimate and its measured speedup; for a drafting length not run there, its estimate scaled by the
        measured ones' shortfall (the median of measured / estimated, if below 1). The estimates at a band err
        together (one cost table, one set of acceptance counts): at 4 requests on code k = 2 measured 1.01x
        target-only against its estimate of 1.26x, and the governor then ran k = 1, 3, 4, 5, 6 in turn, each the
        best estimate not yet measured and each measured below it, for the band's whole 65 steps
        (bench/results/closed-loop.md, "2026-12-04, sixth sweep")."""
        est = self.fixed_speedups(costs)
        if est is None:
            return None
        self.estimates = est.copy()
        band = self.spell.band()
        measured = {
            k: spell.speedup(costs)
            for (b, k), spell in {**self.probed, **self.ran}.items()  # (a spell's record over the band's probes)
            if b == band and self.steps - spell.started - spell.steps <= self.max_hold
        }
        if running and self.mode is not None and (self.mode > 0 or self.spell.full):  # (k = 0: a full window)
            measured[self.mode] = min(measured.get(self.mode, np.inf), self.spell.speedup(costs))
        shortfalls = [m / est[k] for k, m in measured.items() if k > 0 and np.isfinite(est[k]) and est[k] > 0]
        scale = min(1.0, float(np.median(shortfalls))) if shortfalls else 1.0
        for k in range(1, self.max_window + 1):
            est[k] = min(est[k], measured[k]) if k in measured else est[k] * scale
        if 0 in measured:
            est[0] = min(est[0], measured[0])
        return est

    # --- the decision ----------------------------------------------------------------------------------------

    def choose(self, costs: CostModel | None) -> int | None:
        """None: the policy decides this step; k: draft exactly k tokens per request (0: none). costs: the running
        cost table in this process's seconds (OnlineCosts.cost_model() once warm; None: not yet, the policy runs)."""
        if costs is None or not costs.c_step:
            return self.mode
        if self.mode is not None:
            return self._fixed(costs)
        # a policy that drafted nothing in its spell is k = 0 with vLLM's catch-up pass: its tokens carry no noise,
        # so it is judged from a quarter window on (at 8 requests on a Zen 4 such a spell ran 0.7x target-only,
        # which the governor's k = 0, the pass skipped, is by definition: bench/results/closed-loop.md,
        # "2026-12-04, fifth sweep")
        self._rebase()
        quick = self.spell.drafted == 0 or self.spell.rebased
        if not self._judging(self.window // 4 if quick or self.trial else None):
            return None
        ref = self._references(costs)
        if ref is None:
            return None
        policy = self.spell.speedup(costs)
        self.policy_speedup = policy
        best = self._beating(ref, policy)
        self._maybe_say(ref, policy)
        if self.trial and self.spell.drafted and not self.spell.full:
            # a trial's first quarter windows end it only where it runs clearly below k = 0 (by the margin: a few
            # steps' noise), for the best length as judged; a win, or a loss to a drafting length's estimate alone,
            # waits for its full window (a trial won on 8 steps kept the estimates of the fixed length it left). At 4
            # chat requests on a Zen 4 a trial ran its 33 steps at 0.81x target-only, 22 % of the level's loss
            # (bench/results/closed-loop.md, "2026-12-07, fifteenth sweep")
            if best is None or policy * (1.0 + self.margin) >= ref[0]:
                return None
        if best is not None:  # the policy lost: the best fixed length takes over
            if self.trial:
                self.hold = min(2 * self.hold, self.max_hold)
            self.policy_ran[self.spell.band()] = self.spell
            self._enter(best)
            self.until = self.steps + self.hold
        elif self.trial:  # the policy won its trial back
            self.trial, self.hold = False, self.hold0
        return self.mode

    def _rebase(self) -> None:
        """A policy spell whose last quarter window ran at another batch band than its first: from here on it is
        judged on its steps at that band alone, from a quarter window on. The steps at the band it left are another
        load's (at 4 chat requests on a Zen 4 the policy's spell, 13 steps at one request and 19 at four, measured
        1.02x target-only where its steps at four ran 0.5-0.9x, and it drafted on there:
        bench/results/closed-loop.md, "2026-12-07, fifteenth sweep")."""
        n = self.window // 4
        band = self.spell.last_band(n)
        if band is not None and band != self.spell.first_band:
            self.spell = self.spell.tail(n)
            self.spell.rebased = True

    def _fixed(self, costs: CostModel) -> int | None:
        assert self.mode is not None
        if self.steps >= self.until and self.spell.full:  # the hold is over: a trial of the policy
            self._enter(None)
            self.trial = True
            return None
        if self._judging(self.window // 4):  # another fixed length, only when it beats this one by the margin
            # this length as measured over its last `window` steps, if lower (_references, running): a shift in
            # acceptance shows there within window / 2 steps, while the estimates' decayed counts take
            # ~GOVERNOR_MEMORY steps. k = 0 is measured only over a full window: its speed is target-only's by
            # definition, and a few steps' wall time (with the proposer's own time in it, which no estimate carries)
            # would move it for nothing. The lengths run before at this band are believed as measured too: two
            # lengths whose estimates are within the noise would otherwise trade places every quarter window, each
            # measured against the other's optimistic estimate (chat's k = 1 <-> 2 every 8 steps:
            # bench/results/closed-loop.md, "2026-12-03, fourth sweep")
            est = self._references(costs, running=True)
            if est is not None:
                # k = 0 verifies no window, so while it runs the drafting lengths' estimates move with the costs'
                # noise alone: it is left for one only at the hold's end (the policy's trial) or where the batch band
                # fell below the one it began at (at 4 requests a 5 % rise in c_step(4) over a few steps took k = 0,
                # off, to k = 2, whose first 47 steps then waited at 13.4 tok/s for the requests that had missed the
                # draft's pass: bench/results/closed-loop.md, "2026-12-04, sixth sweep"), and its last quarter window
                # ran at that band: the tail of a level (4, 3, 2, 1 requests) before 8 arrive is no band (it took k =
                # 0 from 4 requests to a trial at 8 on the policy's old record at 2: "2026-12-07, twelfth sweep")
                if self.mode == 0 and (self.holds_off(self.spell.band()) or not self.spell.settled(self.window // 4)):
                    return self.mode
                # the policy as it measured before it lost (at this band, within max_hold steps): it lost to an
                # estimate, which is optimistic (the module docstring), so a length that measures below it hands
                # back at once (a trial) rather than after its hold (at one request k = 5, estimated 1.83x
                # target-only against the policy's measured 1.66x, ran its hold at 5.9 tok/s where the policy had
                # run 7.4: bench/results/closed-loop.md, "2026-12-04, fifth sweep")
                policy = self.policy_ran.get(self.spell.band())
                if policy is not None and self.steps - policy.started - policy.steps <= self.max_hold:
                    if policy.speedup(costs) > est[self.mode] * (1.0 + self.margin):
                        self._enter(None)
                        self.trial = True
                        return None
                if self.mode == 0:
                    best = int(np.nanargmax(est))
                    move = best if est[best] > est[0] * (1.0 + self.margin) else None
                else:
                    move = self._beating(est, est[self.mode])
                if move is not None:
                    self._enter(move)
                elif self.mode == 0:  # k = 0 again at the band it moved to: from here on that band's k = 0
                    self._enter(0)
        return self.mode

    def holds_off(self, band: int) -> bool:
        """k = 0 runs and holds at this batch band: the band k = 0 began at or any above, where no drafting length
        is tried before the policy's trial (no estimate judged, no probe, no draft pass for new requests). More
        requests a step make verification dearer per token while acceptance stays, so where k = 0 won, drafting
        loses at more requests too: the engines that switch speculation off do so above a batch size (TensorRT-LLM's
        draft_len_schedule, vLLM's speculative_disable_by_batch_size: ../shared/serving-anchors.md). At 8 chat
        requests on a Zen 4, the band's probes and a trial there ran 42 % of its time at 0.7x the off steps' rate
        (bench/results/closed-loop.md, "2026-12-07, twelfth sweep")."""
        return self.mode == 0 and band >= self.spell.first_band

    def _beating(self, ref: np.ndarray, current: float) -> int | None:
        """The fixed length that replaces a drafting mode (the policy, a fixed k >= 1) whose speedup is `current`:
        the best one that beats it by the margin, where k = 0 needs no margin (None: none does). k = 0's speed is
        target-only's, no estimate, and drafting costs a served level more than its judged decode steps show (the
        draft's prefill, the requests it puts out of step: prefills one at a time, a tail of fewer requests): at 4
        chat requests on a Zen 4, k = 1 ran 0.96x target-only step by step and 0.85x served, and the policy, measured
        at 0.97x after its trial, handed over to k = 1 (estimated 1.02x), not to k = 0 (bench/results/closed-loop.md,
        "2026-12-06, tenth sweep" and "2026-12-06, eleventh sweep")."""
        hurdle = np.full(len(ref), 1.0 + self.margin)
        hurdle[0] = 1.0
        gain = ref / hurdle
        best = int(np.nanargmax(gain))
        return best if gain[best] > current else None

    def _judging(self, steps: int | None = None) -> bool:
        """Judge a spell once it has `steps` steps (default: `window`), then every window / 8 steps (its cost stays
        off most steps)."""
        return self.spell.steps >= (steps or self.window) and self.spell.steps % max(self.window // 8, 1) == 0

    def _enter(self, mode: int | None) -> None:
        if self.mode is not None and self.spell.steps >= (self.window if self.mode == 0 else self.window // 4):
            self.ran[(self.spell.band(), self.mode)] = self.spell
        self.mode = mode
        self.spell = Spell(self.window, self.max_batch)
        self.spell.started = self.steps
        self.spells += 1

    def _maybe_say(self, ref: np.ndarray, policy: float) -> None:
        drafting = ref[1:]
        if self.said or policy >= 1.0 or not np.all(drafting < 1.0):
            return
        self.said = True
        sizes = self.spell.sizes()
        load = (sizes * np.arange(len(sizes))).sum() / max(sizes.sum(), 1)
        k = int(np.nanargmax(drafting)) + 1
        self.say(
            f"drafting does not pay in this process: at {load:.1f} requests a step, the best fixed draft length "
            f"(k={k}) reaches {drafting[k - 1]:.2f}x target-only's tokens/s and disco's policy {policy:.2f}x; "
            "the governor drafts nothing and tries the policy again now and then"
        )
