"""The closed loop as a serving proposer runs it (docs/architecture.md, "Closed loop"; ../shared/DESIGN.md, 5d):
the offline priors (an artifact's model, a `disco profile`) corrected by what the serving process itself sees.

One object per proposer, fed at three moments of its step:

    step(now, tokens, drafted, accepted)   a step begins: the target step that just ran (its tokens, the time since
                                           the last step's drafting ended) and the verified windows' outcomes,
                                           judged under the decision that drafted them (`decision`, taken before
                                           this step's override when the outcomes are read after it: vllm/draft.py)
    position(batch, seconds)               one batched draft position ran (the second and later: the first
                                           carries vLLM's catch-up forward)
    ended(now, passed, deciding)           this step's drafting is over (the target step starts); passed: the
                                           batch size whose draft pass ran (its first position: the drafting
                                           time less the later positions' and the decisions', when the step
                                           verified decode only)

and asked, when it decides, for `cost_model()` (the running cost table: online_costs.OnlineCosts, seeded by the
profile if one is given) and `override(batch, stale)` (None, the policy decides; k, a fixed length this step: a
warm-up probe, the governor's choice, or 0 while stale requests finish). When the governor drafts nothing, `off` is
set and the proposer skips the draft's pass altogether (vLLM's catch-up: ~one draft position a step, up to 16 % of a
step at 8 requests on this CPU); the requests in the batch then have holes in the draft's KV cache and never draft
again (`stale`), so before the policy is tried again the loop runs k = 0 until every request in the batch is one
the draft has seen whole (a request's lifetime at most, once per hold of up to GOVERNOR_MAX_HOLD steps): with the
catch-up pass while a request the draft has seen whole is in the batch (it keeps that one whole), without it (`off`
still) while every request is stale (the pass would keep no one whole). An off step at a batch band below the one
k = 0 began at keeps the pass while a request is whole (new ones: the governor judges k = 0 again there); at that
band or above, k = 0 holds unjudged until the policy's trial (Governor.holds_off): no pass, no probes.
The online calibration of the classifier's probabilities (online_calibration.OnlineCalibration) is held here and
applied where the probabilities are made (batch_policy.BatchClassifier), on the device.

With DISCO_CLOSED_LOOP_LOG set to a file, every judged step appends a JSON line there (the step's requests, tokens,
seconds, what decided it, what was drafted and accepted, the governor's mode and estimates): what the loop did in a
serving process, after the fact.

disco's own loop (decode.py, one request at a time) runs the same loop at batch 1 through the policy interface
alone: ClosedLoopPolicy wraps the policy a generation runs and times the round from its calls, LoopStream holds
one ClosedLoop across a stream of requests (a `disco generate --closed-loop` run, a compare row).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import NamedTuple, TextIO

import torch

from disco.base.defaults import CLOSED_LOOP_BAND_WATCH, CLOSED_LOOP_LOG_ENV, CLOSED_LOOP_PROBES
from disco.core.cost import CostModel
from disco.online.governor import Governor, batch_band
from disco.online.online_calibration import OnlineCalibration
from disco.online.online_costs import OnlineCosts


class Decision(NamedTuple):
    """What decided a step: `spell` (it ran the governor's mode: its time judges the spell), a label for the log
    ("policy", "probe k", "fixed k", "off", "stale"), which of the governor's spells it ran in (Governor.spells:
    a step decided under the last mode, whose outcomes are read after the governor moved, judges no spell) and the
    length a warm-up probe ran (0: no probe; a drafting probe measures its length at the band: Governor.probed)."""

    spell: bool
    label: str
    spells: int = 0
    probe: int = 0


class ClosedLoop:
    """A proposer's running costs, online calibration and governor."""

    def __init__(
        self,
        seed: CostModel | None,
        max_batch: int,
        max_window: int,
        device: torch.device,
        calibrate: bool,
        idle_position: bool,
        say: Callable[[str], None],
        skip_idle: bool = False,
    ) -> None:
        self.costs = OnlineCosts(max_batch, max_window, seed, say=say)
        self.calibration = OnlineCalibration(max_window, device) if calibrate else None
        # idle_position: a step that drafts nothing still runs one draft position (vLLM's catch-up pass); with
        # skip_idle the governor's k = 0 skips it (`off`), so that k = 0 costs what target-only does
        self.skip_idle = skip_idle
        self.governor = Governor(max_window, max_batch, idle_position=idle_position and not skip_idle, say=say)
        self.max_batch, self.max_window = max_batch, max_window
        # the first steps of the first batch size band (1, 2, 4, 8, ...: the largest power of two <= the batch) draft
        # at fixed lengths across the window (CLOSED_LOOP_PROBES, as the window allows), three times each, so that
        # the table measures target steps of several widths and draft positions whatever the seed makes the policy
        # do: a seed under which no window pays would otherwise never draft, and never learn it was wrong (and a
        # seed whose shape these steps refute is dropped: online_costs.OnlineCosts). A later band is probed (the
        # short lengths: the long ones cost most where many requests share a step) only if its first
        # CLOSED_LOOP_BAND_WATCH steps drafted less than a token a request, and only at the lengths whose steps
        # the table has not timed three times: where the policy or the governor drafts, its own steps time the
        # band's widths and positions, and probing them again cost 11-23 % of a level's steps at ~87 % of its rate
        # (bench/results/closed-loop.md, "2026-12-03, fourth sweep")
        self._widths = [k for k in CLOSED_LOOP_PROBES if k <= max_window] or [max_window]
        self._probes: dict[int, list[int]] = {}  # each band's probe lengths still to run
        self._watch: dict[int, list[int]] = {}  # a later band's first steps: [steps, requests, drafted tokens]
        self.off = False  # this step the governor drafts nothing: the proposer skips the draft's pass
        self.decision = Decision(True, "policy")  # what decided the last step (override)
        self._started: float | None = None  # when the last step's propose began
        self._ended: float | None = None  # when the last step's drafting ended (its target step began)
        self._positions = 0.0  # this step's timed positions' seconds
        self._decode = False  # the target step this step's pass caught up on verified decode tokens only
        path = os.environ.get(CLOSED_LOOP_LOG_ENV)
        self._log: TextIO | None = open(path, "a", buffering=1) if path else None  # noqa: SIM115 (the process's)

    def _band_probes(self, batch: int) -> list[int]:
        band = batch_band(batch)
        if band not in self._probes:
            if self._probes:  # a later band: watched first (_watch_band)
                self._probes[band], self._watch[band] = [], [0, 0, 0]
            else:
                widths = [self._widths[i % len(self._widths)] for i in range(3 * len(self._widths))]
                self._probes[band] = self._reference(batch) + widths
        return self._probes[band]

    def _reference(self, batch: int) -> list[int]:
        """Three k = 0 probes where target-only's own step at this batch is not timed three times yet: every
        speedup's reference (online_costs, c_step(b)), which a band where every step drafts never times (at 4 chat
        requests on a Zen 4 the table priced it from other steps at 0.178-0.211 s against 0.157 s as run, and the
        policy at 0.8x target-only was judged 1.09-1.18x:
        bench/results/closed-loop.md, "2026-12-07, fourteenth sweep"). About free: with the draft's pass such a step
        makes `batch` tokens at ~the policy's rate."""
        return [0, 0, 0] if self.costs.plain.count[min(batch, self.max_batch) - 1] < 3 else []

    def _watch_band(self, drafted: Sequence[int]) -> None:
        """A later band's first steps' drafts, then the band's probes (none while k = 0 holds there:
        Governor.holds_off): k = 0 where target-only's step at this batch is untimed (_reference) and, if they drafted
        less than a token a request and the governor runs no drafting length, the short lengths whose steps at this
        batch size (its tokens) the table has not timed three times yet."""
        batch = len(drafted)
        watch = self._watch.get(batch_band(batch))
        if watch is None:
            return
        watch[0], watch[1], watch[2] = watch[0] + 1, watch[1] + batch, watch[2] + int(sum(drafted))
        if watch[0] >= CLOSED_LOOP_BAND_WATCH:
            del self._watch[batch_band(batch)]
            # (none where k = 0 holds: no drafting length is tried at this band before the policy's trial, and the
            # band's probes ran inside it, 16 % of the 8-request level's time at 0.7x the off steps' rate:
            # bench/results/closed-loop.md, "2026-12-07, twelfth sweep")
            if self.governor.holds_off(batch_band(batch)):
                return  # (k = 0 runs there: its off steps time the reference)
            probes = self._reference(batch)
            # (the short lengths not where the governor runs a drafting length now: its steps time the band's widths,
            # and it is judged there within a quarter window; at 4 chat requests on a Zen 4 the probes ran 9 steps
            # under k = 3, 21 % of the band's loss: bench/results/closed-loop.md, "2026-12-07, sixteenth sweep")
            if watch[2] < watch[1] and not self.governor.mode:
                timed = self.costs.steps.count
                short = [k for k in self._widths if k <= 4 and timed[min(batch * (k + 1), len(timed)) - 1] < 3]
                probes += [short[i % len(short)] for i in range(3 * len(short))]
            self._probes[batch_band(batch)] = probes

    def step(
        self,
        now: float,
        tokens: int,
        drafted: Sequence[int],
        accepted: Sequence[int],
        decision: Decision | None = None,
    ) -> None:
        """A step begins: the target step that just ran over `tokens` tokens (timed from the end of the last
        drafting: the target's forward, sampling and vLLM's scheduling, as `disco profile` times it) and the
        outcomes of the windows it verified (each decode request's drafted and accepted length; all of the last
        step's wall time, for the governor), judged under `decision` (None: the last override's; a caller that
        reads the outcomes only after this step's override passes the one it held before)."""
        decision = decision or self.decision
        target = now - self._ended if self._ended is not None else None
        if target is not None and 0 < tokens <= self.max_batch * (self.max_window + 1):
            self.costs.observe_step(tokens, target)
            if tokens == len(drafted) and not any(drafted):  # target-only's own step at this batch
                self.costs.observe_plain(tokens, target)
        if self._started is not None and len(drafted):
            # a step that also ran a prefill (more tokens than its decode requests' verification) teaches the
            # acceptance estimates but judges no spell: its seconds are the new request's (the fixed lengths'
            # estimates, from the cost table of decode steps, carry none)
            # nor does a step the last mode drafted, read after the governor moved (vLLM's draft reads a step's
            # outcomes after the next decision): it would open the new spell with the old mode's tokens and time
            # (a policy trial whose first step was k = 2's 16 tokens at 8 requests never counted as drafting nothing,
            # and ran 32 steps at 0.7x target-only instead of 8:
            # bench/results/closed-loop.md, "2026-12-04, sixth sweep")
            decode = int(sum(drafted)) + len(drafted)
            self._decode = tokens <= decode
            spell = decision.spell and self._decode and decision.spells == self.governor.spells
            probe = decision.probe if self._decode else 0
            self.governor.observe(
                drafted, accepted, now - self._started, spell=spell, target=target, verified=tokens, probe=probe
            )
            if self._decode:  # (a new request's first step drafted nothing for it: not the band's choice)
                self._watch_band(drafted)
            if self._log is not None:
                self._write(now - self._started, target, tokens, drafted, accepted, decision)
        self._started = now

    def _write(
        self,
        seconds: float,
        target: float | None,
        tokens: int,
        drafted: Sequence[int],
        accepted: Sequence[int],
        decision: Decision,
    ) -> None:
        g = self.governor
        line = {
            "step": g.steps, "batch": len(drafted), "tokens": tokens, "seconds": round(seconds, 5),
            "target_s": None if target is None else round(target, 5), "decided": decision.label,
            "drafted": [int(d) for d in drafted], "accepted": [int(a) for a in accepted],
            "governor": "policy" if g.mode is None else g.mode, "trial": g.trial,
            "policy_speedup": g.policy_speedup, "estimates": None if g.estimates is None else g.estimates.round(3).tolist(),
        }  # fmt: skip
        self._log.write(json.dumps(line) + "\n")  # type: ignore[union-attr]

    def position(self, batch: int, seconds: float) -> None:
        if 0 < batch <= self.max_batch:
            self.costs.observe_draft(batch, seconds)
            self._positions += seconds

    def ended(self, now: float, passed: int = 0, deciding: float = 0.0) -> None:
        """This step's drafting is over. passed: the batch size of the draft pass it ran (0: none, or disco's
        loop, which times its first position as a position where the draft's cache is current); deciding: the
        seconds its decisions took (the policy's features and model at every position: no fixed length's)."""
        if self._decode and self._started is not None and 0 < passed <= self.max_batch:
            self.costs.observe_first(passed, now - self._started - self._positions - deciding)
        self._ended, self._positions, self._decode = now, 0.0, False

    def begin(self, now: float) -> None:
        """A request starts with no step pending (disco's loop: one request at a time): the time since the last
        step (the prefill, the caller's work between requests) is no step's."""
        self._started, self._ended = now, None

    def cost_model(self) -> CostModel:
        return self.costs.cost_model()

    def override(self, batch: int = 1, stale: int = 0) -> int | None:
        """The fixed length this step of `batch` requests runs (None: the policy decides): a probe of the batch's
        band, else the governor's choice, judged on this process's own costs once they are measured (before, the
        seed's absolute numbers may be another machine's). stale: how many of the batch's requests missed the
        draft's pass in an off step (they cannot draft: the policy waits at k = 0 until none is left, with the
        pass while some request is whole, `off` while none is)."""
        self.off = False
        probes = self._band_probes(batch)
        if probes and not stale and self.governor.mode != 0:
            self.decision = Decision(False, f"probe {probes[0]}", probe=probes[0])
            return probes.pop(0)
        k = self.governor.choose(self.costs.cost_model() if self.costs.warm else None)
        spells = self.governor.spells
        if k == 0 and self.skip_idle:
            # at a batch band below the one k = 0 began at, the pass runs while a request the draft has seen whole
            # is in the batch (new ones, prefilled now): the governor judges k = 0 again at the new band
            # (Governor._fixed), and a drafting length it moves to finds them whole. At a band above, k = 0 holds
            # unjudged (Governor.holds_off) and the pass is skipped: there it ran 0.37 s a step at 8 chat requests
            # against off's 0.28 (bench/results/closed-loop.md, "2026-12-07, twelfth sweep")
            if stale < batch and not self.governor.holds_off(batch_band(batch)):
                self.decision = Decision(True, "off+pass", spells)
                return 0
            self.off, self.decision = True, Decision(True, "off", spells)
            return 0
        if stale:  # back from an off spell: the stale requests finish before the policy's trial counts
            # a batch of stale requests only: the pass keeps no one whole, so it stays skipped (at 8 requests on
            # chat, 8 requests stale from their prefills ran their whole lives at k = 0 with the pass, 24.2 tok/s
            # against off's 35.4: bench/results/closed-loop.md, "2026-12-04, seventh sweep")
            self.off = stale >= batch
            self.decision = Decision(False, "stale-off" if self.off else "stale", spells)
            return 0
        self.decision = Decision(True, "policy" if k is None else f"fixed {k}", spells)
        return k
