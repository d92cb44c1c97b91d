"""The cost model: what a decode costs in target and draft forwards (docs/architecture.md, "Cost model").

    time = sum over rounds of c_t(k_i) + draft forwards * c_d,   k_i = tokens the target processes in round i

c_d and c_t(k) come from `disco profile` (profile.py) on the user's hardware, or the defaults below.
Below the policies: the cost rules (classifier.py) decide with it, the simulator and compare count with it.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from disco.base.defaults import DEFAULT_DRAFT_COST, DEFAULT_MAX_WINDOW, DEFAULT_VERIFY_SLOPE
from disco.base.errors import DiscoError
from disco.core.stats import GenStats


@dataclass(frozen=True)
class CostModel:
    """time = sum over rounds of c_t(k_i) + draft forwards * c_d, where k_i = drafted + 1 is
    the number of tokens the target processes in round i. Units cancel in a speedup, so
    seconds (a profile) and ratios to c_t(1) (the default) are both fine."""

    c_d: float  # one draft forward (one token)
    c_t: tuple[float, ...]  # c_t[k - 1]: one target forward over k tokens, k = 1 .. len(c_t)
    source: str = "default"  # where the numbers come from: "default" or the profile's path
    # a serving engine's load profile (vLLM): c_step[t - 1] = one target step over t tokens in all, the
    # batch's requests together (t = requests x (window + 1)); empty for a batch-of-one engine
    c_step: tuple[float, ...] = ()
    # disco's policy on vLLM's own draft: c_draft[b - 1] = one batched draft position for b requests (the
    # proposer drafts all running requests at once); empty when each request drafts on its own (c_d)
    c_draft: tuple[float, ...] = ()
    # the closed loop's running table only (online_costs.OnlineCosts): c_first[b - 1] = a step's first draft
    # position for b requests as the serving process runs it, vLLM's catch-up forward over the tokens just verified
    # and the proposer's own work with it, which c_draft (the later positions) does not carry; empty: as c_draft.
    # The cost rules never read it (the first position runs before any of their decisions); the governor does
    c_first: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.c_d < 0 or not self.c_t or min(self.c_t) <= 0:
            raise DiscoError(f"invalid cost model ({self.source}): need c_d >= 0 and every c_t(k) > 0")

    @classmethod
    def default(cls, max_window: int = DEFAULT_MAX_WINDOW) -> CostModel:
        c_t = tuple(1.0 + DEFAULT_VERIFY_SLOPE * (k - 1) for k in range(1, max_window + 2))
        return cls(DEFAULT_DRAFT_COST, c_t, "default")

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        """Read the JSON written by `disco profile`."""
        return read_profile(path)[1]

    @classmethod
    def from_dict(cls, data: dict, source: str) -> CostModel:
        """From the {c_d, c_t} of a profile file or an artifact's manifest, named `source`."""
        return cls(
            float(data["c_d"]),
            tuple(float(x) for x in data["c_t"]),
            source,
            tuple(float(x) for x in data.get("c_step", ())),
            tuple(float(x) for x in data.get("c_draft", ())),
        )

    def to_dict(self) -> dict:
        out: dict = {"c_d": self.c_d, "c_t": list(self.c_t), "source": self.source}
        if self.c_step:
            out["c_step"] = list(self.c_step)
        if self.c_draft:
            out["c_draft"] = list(self.c_draft)
        return out

    @functools.lru_cache(maxsize=256)  # noqa: B019 -- a proposer asks for the same few views every step
    def at_load(self, batch: int, max_window: int = DEFAULT_MAX_WINDOW) -> CostModel:
        """The cost model of one request in a step of `batch` requests (docs/architecture.md, "vLLM"), for
        the cost rules, which weigh a window's expected tokens against its extra cost at the rate of a
        target-only step, rho = 1 / c_t(1). A request's share of a step in which each of the `batch`
        requests verifies k tokens is C(batch x k) / batch: so c_t(1) = C(batch) / batch (a target-only
        step yields `batch` tokens), a window of k - 1 drafts adds (C(batch x k) - C(batch)) / batch, the
        extra compute of its tokens and of the others' alike windows shared, and each draft token costs c_d
        (the side-engine proposer drafts request by request) or, on vLLM's own batched draft, its share of one
        batched draft position, c_draft(batch) / batch. Batch 1 is the profile itself. Windows of up to
        max_window drafts (the rules look no further)."""
        if not self.c_step:
            raise DiscoError(f"the cost model ({self.source}) has no load profile (c_step): profile with --engine vllm")
        room = min(len(self.c_step) // batch, max_window + 1)  # the widest window it covers at this load, plus one
        if room < 2:
            raise DiscoError(
                f"the load profile ({self.source}) covers steps of up to {len(self.c_step)} tokens, not {batch} "
                "requests with a draft each: profile with a larger --max-batch"
            )
        c_t = tuple(self.c_step[batch * k - 1] / batch for k in range(1, room + 1))
        position = self.draft_position(batch)
        c_d = position / batch if position is not None else self.c_d
        return CostModel(c_d, c_t, f"{self.source} at {batch} requests", self.c_step, self.c_draft)

    def draft_position(self, batch: int) -> float | None:
        """One batched draft position for `batch` requests (c_draft; its last entry beyond the sizes profiled),
        None when each request drafts on its own (c_d)."""
        return self.c_draft[min(batch, len(self.c_draft)) - 1] if self.c_draft else None

    def first_position(self, batch: int) -> float | None:
        """A step's first draft position for `batch` requests (c_first, else draft_position)."""
        return self.c_first[min(batch, len(self.c_first)) - 1] if self.c_first else self.draft_position(batch)

    def verify(self, k: int) -> float:
        if k > len(self.c_t):
            raise DiscoError(
                f"the cost model ({self.source}) covers target forwards of up to {len(self.c_t)} tokens, "
                f"but a window of {k - 1} drafts needs c_t({k}): rerun disco profile with --max-window {k - 1}"
            )
        return self.c_t[k - 1]

    def time(self, stats: GenStats) -> float:
        """Cost-model time of one generation (prefill excluded)."""
        target_only_rounds = stats.target_forwards - len(stats.windows)
        return (
            sum(self.verify(w + 1) for w in stats.windows)
            + target_only_rounds * self.c_t[0]
            + stats.draft_forwards * self.c_d
        )

    def baseline(self, stats: GenStats) -> float:
        """Target-only decoding of the same tokens: one c_t(1) per generated token."""
        return stats.new_tokens * self.c_t[0]


def read_profile(path: str | Path) -> tuple[dict, CostModel]:
    """A profile file written by `disco profile`: its JSON (the machine, the proposer it records) and its cost
    model, one line on a missing or malformed file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
        return data, CostModel.from_dict(data, str(path))
    except FileNotFoundError:
        raise DiscoError(f"profile not found: {path} (make one with: disco profile)") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise DiscoError(f"{path} is not a disco profile (need numbers c_d and a list c_t): {e}") from None


def load_view(load: CostModel | None, batch: int, max_window: int) -> CostModel | None:
    """The cost rules' cost model in a step of `batch` requests (CostModel.at_load), None without a load profile
    or a request."""
    return load.at_load(batch, max_window) if load is not None and batch >= 1 else None
