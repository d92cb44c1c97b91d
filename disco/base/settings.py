"""Every numeric setting's valid values, defined once (docs/architecture.md, "Settings").

A setting is named here as the object that carries it names it (`PolicySpec.k`, `DecodeConfig.top_p`,
`train`'s `val_fraction`); library code refuses a bad value with a `SettingError` that names the setting,
and the CLI, which checks its options against the same table first (checks.py), says the flag instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from disco.base.errors import DiscoError


@dataclass(frozen=True)
class Range:
    """The values one setting admits."""

    ok: Callable[[float], bool]  # NaN is refused before this is asked
    what: str  # the admitted values in words: "at least 1", "within [0, 1]"

    def admits(self, value: float) -> bool:
        return not (isinstance(value, float) and math.isnan(value)) and self.ok(value)


def at_least(n: float) -> Range:
    return Range(lambda v: v >= n, f"at least {n:g}")


UNIT = Range(lambda v: 0.0 <= v <= 1.0, "within [0, 1]")
POSITIVE = Range(lambda v: v >= 1, "positive")
WINDOW = at_least(1)  # max_window where windows are measured or simulated (train, profile): one draft at least

RANGES: dict[str, Range] = {
    # a policy's knobs (policy_registry.PolicySpec)
    "k": at_least(1),  # constant: window length; heuristic: first window length
    "threshold": UNIT,  # threshold: a draft probability
    "lam": UNIT,  # adaedl: a lower bound on acceptance
    "h": at_least(0),  # svip: a bound on sqrt(c * entropy)
    "classifier_setting": at_least(0),  # classifier: a probability (token, cumulative) or a rate (cost rules)
    # decoding (decode.DecodeConfig)
    "max_window": at_least(0),  # 0: target-only decoding
    "max_new_tokens": POSITIVE,
    "temperature": at_least(0),  # 0: greedy
    "top_p": Range(lambda v: 0.0 < v <= 1.0, "within (0, 1]"),
    # the stages' own
    "limit": at_least(1),
    "threads": at_least(1),
    "shard_prompts": at_least(1),
    "seeds": at_least(1),
    "server_p_min": UNIT,
    "server_n_max": at_least(1),
    "val_fraction": Range(lambda v: 0.0 < v < 1.0, "within (0, 1)"),
    "context": at_least(1),
    "repeats": at_least(1),
    "warmup": at_least(0),
    "per_task": at_least(1),
    "max_batch": at_least(1),
    "tensor_parallel_size": at_least(1),
}


class SettingError(DiscoError):
    """A setting outside its range; `setting` names it (the CLI says the flag instead)."""

    def __init__(self, setting: str, value: float, what: str) -> None:
        self.setting, self.value, self.what = setting, value, what
        super().__init__(self.worded(setting))

    def worded(self, name: str) -> str:
        return f"{name} must be {self.what} (got {self.value})"


def check_setting(name: str, value: float | None, within: Range | None = None) -> None:
    """Refuse `value` for the setting `name` unless its range (RANGES, or `within`) admits it; None passes."""
    rng = within or RANGES[name]
    if value is not None and not rng.admits(value):
        raise SettingError(name, value, rng.what)
