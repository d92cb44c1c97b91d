"""Load profiles (`disco profile --engine vllm`) for the cost rules: which machine and which proposer a profile
was measured with, and the choice, per proposer, of this machine's profile among several."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from disco.base.errors import DiscoError
from disco.base.machine import MACHINE_KEYS, machine_text, this_machine
from disco.core.cost import CostModel, read_profile


def profile_machine_warning(profile: dict, source: str) -> str | None:
    """Why a load profile's costs may not hold on this machine (its MACHINE_KEYS differ, or the profile
    predates the record), or None when it was measured here."""
    fix = "re-run `disco profile --engine vllm` here"
    recorded = profile.get("machine")
    if not isinstance(recorded, dict):
        return f"the load profile {source} does not say which machine it was measured on: if not this one, {fix}"
    here = this_machine()
    if all(recorded[k] == here.get(k) for k in MACHINE_KEYS if k in recorded):
        return None
    return (
        f"the load profile {source} was measured on {machine_text(recorded)}; this machine is "
        f"{machine_text(here)}: its costs may not hold here — {fix}"
    )


VLLM_DRAFT, SIDE_ENGINE = "vllm draft", "side engine"  # the proposers a vLLM load profile is measured with


class LoadProfiles:
    """Load profiles (`disco profile --engine vllm`) for the cost rules, from which each of disco's vLLM proposers
    takes its own (docs/architecture.md, "Load"): the one measured with that proposer (VLLM_DRAFT, SIDE_ENGINE)
    on this machine, so one settings file holds on every kind of machine, and for both proposers, it was profiled
    for. Every file is read and checked once, here (one line on a missing or malformed one). Where none was
    measured on this machine, the first measured with the proposer, with one line on stderr: its step costs are
    another machine's. Where none was measured with the proposer, the other's, with one line too: its step costs
    (vLLM's target step, whoever drafts) hold, its draft cost does not (taken as c_d per draft token, no batched
    position: a side engine drafts on llama.cpp, not in vLLM's batched forward)."""

    def __init__(self, paths: str | Path | Sequence[str | Path]) -> None:
        paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
        if not paths:
            raise DiscoError("no load profile given: name one made by `disco profile --engine vllm`")
        self.files = [(str(p), *read_profile(p)) for p in paths]  # (source, its JSON, its cost model)
        self._chosen: dict[str, CostModel] = {}

    def choose(self, proposer: str) -> CostModel:
        """`proposer`'s load profile (said once per proposer, however often asked)."""
        if proposer not in self._chosen:
            self._chosen[proposer] = self._choose(proposer)
        return self._chosen[proposer]

    def _choose(self, proposer: str) -> CostModel:
        own = [f for f in self.files if f[1].get("proposer", proposer) == proposer]  # (older files: any)
        pool = own or self.files
        said = [profile_machine_warning(data, source) for source, data, _ in pool]
        source, data, cost = next((f for f, why in zip(pool, said) if why is None), pool[0])
        lines = []
        if all(why is not None for why in said):
            many = f"none of the {len(pool)} load profiles was measured on this machine; using the first: "
            lines.append((many if len(pool) > 1 else "") + said[0])
        if not own:
            lines.append(
                f"the load profile {source} was measured with the {data['proposer']} proposer, not the {proposer} "
                "one: its step costs hold, its draft cost is the other proposer's (c_d a draft token, no batched "
                "position) — profile this proposer too (`disco profile --engine vllm`) and name both"
            )
            cost = CostModel(cost.c_d, cost.c_t, cost.source, cost.c_step)
        for line in lines:
            print(f"disco: {line}", file=sys.stderr, flush=True)
        return cost
