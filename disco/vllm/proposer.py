"""The interface both of disco's vLLM proposers offer the runner (stages.VllmRunner, compare, profile): the one
on vLLM's own batched draft (draft.DiscoDraftProposer) and the side-engine one (side.DiscoProposer)."""

from __future__ import annotations

from typing import Any, Protocol

from disco.core.cost import CostModel
from disco.policies.policy_registry import PolicySpec


class Proposer(Protocol):
    """A proposer inside vLLM whose policy the runner sets and whose per-request counts it reads."""

    decide_s: float  # seconds in the policy (features, model, rule) since set_policy
    forward_s: float  # seconds in draft forwards (and vLLM's draft loop besides the policy) since set_policy

    def set_policy(self, spec: PolicySpec, load: CostModel | None = None) -> None:
        """Decide with `spec` from now on (and `load`, a vLLM load profile, for the cost rules)."""

    def stats_for(self, prompt: list[int], request_id: str) -> Any:
        """The counts (a GenStats) of the request vLLM's LLM returned as `request_id`, once; None if unknown."""
