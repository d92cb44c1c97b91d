"""The closed loop as a serving proposer runs it (docs/architecture.md, "Closed loop"; ../shared/DESIGN.md, 5d):
the offline priors (an artifact's model, a `disco profile`) corrected by what the serving process itself sees.

One object per proposer, fed at three moments of its step:

    step(now, tokens, drafted, accepted)   a step begins: the target step that just ran (its tokens, the time since
                                           the last step's drafting ended) and the verified windows' outcomes
    position(batch, seconds)               one batched draft position ran
    ended(now)                             this step's drafting is over (the target step starts)

and asked, when it decides, for `cost_model()` (the running cost table: online_costs.OnlineCosts, seeded by the
profile if one is given) and `override()` (the governor: None, the policy decides; k, a fixed length this step).
The online calibration of the classifier's probabilities (online_calibration.OnlineCalibration) is held here and
applied where the probabilities are made (batch_policy.BatchClassifier), on the device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from disco.cost import CostModel
from disco.defaults import CLOSED_LOOP_PROBES
from disco.governor import Governor
from disco.online_calibration import OnlineCalibration
from disco.online_costs import OnlineCosts


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
    ) -> None:
        self.costs = OnlineCosts(max_batch, max_window, seed)
        self.calibration = OnlineCalibration(max_window, device) if calibrate else None
        # idle_position: a step that drafts nothing still runs one draft position (vLLM's catch-up pass)
        self.governor = Governor(max_window, max_batch, idle_position=idle_position, say=say)
        self.max_batch, self.max_window = max_batch, max_window
        # the first steps draft at fixed lengths across the window (CLOSED_LOOP_PROBES, as the window allows), so that
        # the table measures target steps of several widths and draft positions, whatever the seed makes the policy
        # do: a seed under which no window pays would otherwise never draft, and never learn it was wrong
        probes = [k for k in CLOSED_LOOP_PROBES if k <= max_window] or [max_window]
        self._probes = [probes[i % len(probes)] for i in range(3 * len(probes))]  # each width's bucket three times
        self._started: float | None = None  # when the last step's propose began
        self._ended: float | None = None  # when the last step's drafting ended (its target step began)

    def step(self, now: float, tokens: int, drafted: Sequence[int], accepted: Sequence[int]) -> None:
        """A step begins: the target step that just ran over `tokens` tokens (timed from the end of the last
        drafting: the target's forward, sampling and vLLM's scheduling, as `disco profile` times it) and the
        outcomes of the windows it verified (each decode request's drafted and accepted length; all of the last
        step's wall time, for the governor)."""
        if self._ended is not None and 0 < tokens <= self.max_batch * (self.max_window + 1):
            self.costs.observe_step(tokens, now - self._ended)
        if self._started is not None and len(drafted):
            self.governor.observe(drafted, accepted, now - self._started)
        self._started = now

    def position(self, batch: int, seconds: float) -> None:
        if 0 < batch <= self.max_batch:
            self.costs.observe_draft(batch, seconds)

    def ended(self, now: float) -> None:
        self._ended = now

    def cost_model(self) -> CostModel:
        return self.costs.cost_model()

    def override(self) -> int | None:
        """The fixed length this step runs (None: the policy decides): a warm-up probe, then the governor's choice,
        judged on this process's own costs once they are measured (before, the seed's absolute numbers may be
        another machine's)."""
        if self._probes:
            return self._probes.pop(0)
        return self.governor.choose(self.costs.cost_model() if self.costs.warm else None)
