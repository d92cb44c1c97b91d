"""What disco's policy on vLLM's draft needs of vLLM's configuration, decided and checked in one place
(../shared/vllm-gpu-runner.md; docs/architecture.md, "vLLM on a GPU").

- The runner: disco's draft proposer lives in vLLM's V1 model runner. vLLM 0.32 takes its V2 runner on GPUs
  whenever Triton is present (config/vllm.py, `use_v2_model_runner`), whose StandaloneARSpeculator disco does
  not reach: the plugin sets VLLM_USE_V2_MODEL_RUNNER=0 before vLLM reads it (`V1_RUNNER_ENV`), and a config
  that still takes V2 (an explicit VLLM_USE_V2_MODEL_RUNNER=1, or a feature that forces V2) is refused.
- Scheduling: each request gets its own number of drafts, which needs synchronous scheduling (async scheduling
  gives every request k placeholders). Unless asked for, disco turns it off itself (`engine_args_defaults`) and
  says so in one line; an explicit --async-scheduling is refused.
- What is refused, each in one line: `disable_padded_drafter_batch` (vLLM then hands the drafter no rejected
  counts and counts the step's tokens before it: every draft would count as accepted), data parallelism (the
  drafter synchronises the ranks' batches at every call: ranks that stop at different positions hang; vLLM turns
  its own Dynamic SD off under DP for this reason), pipeline parallelism (the drafter runs on the last stage only;
  untested), a draft whose full logits never exist (local argmax reduction) or whose vocabulary is mapped.
- Tensor parallelism is kept: every rank of the stage holds the same all-gathered draft logits and the same
  batch, and the decision is a deterministic function of them, so every rank stops at the same positions; only
  the first rank prints.
"""

from __future__ import annotations

import os
from typing import Any

from disco.base.errors import DiscoError

V1_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"  # vLLM's switch between its model runners ("0": V1)
ASYNC_OFF = (
    "disco: async scheduling off (each request gets its own number of draft tokens, which needs vLLM's "
    "synchronous scheduling; --no-async-scheduling says the same)"
)


def choose_v1_runner() -> None:
    """Make vLLM build its V1 model runner, where disco's draft proposer lives (called before vLLM reads its
    environment: the plugin's register(), or before the first in-process instance); an explicit request for V2
    is refused."""
    asked = os.environ.get(V1_RUNNER_ENV)
    if asked is not None and asked.strip().lower() not in ("0", "false"):
        raise DiscoError(
            f"{V1_RUNNER_ENV}={asked} asks for vLLM's V2 model runner, where disco's proposer does not run: "
            f"unset it (disco sets {V1_RUNNER_ENV}=0 itself)"
        )
    os.environ[V1_RUNNER_ENV] = "0"


def speculates_with_draft_model(speculative_config: Any) -> bool:
    """Does this (EngineArgs' dict, or vLLM's SpeculativeConfig) run vLLM's draft_model method?"""
    if speculative_config is None:
        return False
    method = (
        speculative_config.get("method")
        if isinstance(speculative_config, dict)
        else getattr(speculative_config, "method", None)
    )
    return method == "draft_model"


def engine_args_defaults(args: Any, on_cpu: bool) -> str | None:
    """Before vLLM builds its config from `args` (its EngineArgs) for disco's draft proposer: async scheduling
    off unless asked for. Returns the line to say, if any (async scheduling is the GPU default for draft_model;
    vLLM's CPU platform schedules synchronously anyway, so there is nothing to say on CPUs)."""
    if args.async_scheduling is None and speculates_with_draft_model(args.speculative_config):
        args.async_scheduling = False
        return None if on_cpu else ASYNC_OFF
    return None


def check_config(vllm_config: Any) -> None:
    """Refuse, in one line each, a vLLM configuration under which disco's draft proposer would not run or would
    decide wrongly (the module's docstring says why for each)."""
    if vllm_config.use_v2_model_runner:
        raise DiscoError(
            "this vLLM configuration runs vLLM's V2 model runner, where disco's policy does not reach the draft "
            f"(something here forces V2, or {V1_RUNNER_ENV} is set to 1): remove that, or serve without disco"
        )
    if vllm_config.scheduler_config.async_scheduling:
        raise DiscoError(
            "disco's policy on vLLM's draft gives each request its own number of draft tokens, which needs "
            "synchronous scheduling: drop --async-scheduling (disco then turns it off itself)"
        )
    spec = vllm_config.speculative_config
    if spec is not None and getattr(spec, "disable_padded_drafter_batch", False):
        raise DiscoError(
            "disco's policy reads how many drafts vLLM rejected, which disable_padded_drafter_batch hides: "
            "drop it from --speculative-config"
        )
    parallel = vllm_config.parallel_config
    if parallel.data_parallel_size > 1:
        raise DiscoError(
            f"disco's policy under data parallelism ({parallel.data_parallel_size} ranks) could stop drafting at "
            "different positions on different ranks, which vLLM's drafter cannot coordinate (it would hang): "
            "serve with --data-parallel-size 1 (one server per GPU group behind a router)"
        )
    if parallel.pipeline_parallel_size > 1:
        raise DiscoError(
            f"disco's policy is not supported under pipeline parallelism ({parallel.pipeline_parallel_size} "
            "stages): serve with --pipeline-parallel-size 1 (tensor parallelism is supported)"
        )


def check_drafter(proposer: Any) -> None:
    """Refuse a draft whose full logits never exist (local argmax reduction) or whose vocabulary is mapped to the
    target's: disco's features read the draft's logits over the target's vocabulary."""
    if getattr(proposer, "use_local_argmax_reduction", False) or getattr(proposer, "use_heterogeneous_vocab", False):
        raise DiscoError(
            "disco's policy reads the draft's full logits: drop use_local_argmax_reduction and use a draft "
            "with the target's vocabulary"
        )


def first_rank() -> bool:
    """Is this the first tensor-parallel rank (or the only process)? Only it prints disco's start-up line."""
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank, model_parallel_is_initialized

        return not model_parallel_is_initialized() or get_tensor_model_parallel_rank() == 0
    except (ImportError, AssertionError):
        return True


def in_effect(runner: Any, proposer: Any) -> str:
    """The runner and proposer classes in effect, for disco's start-up line."""
    return f"vLLM's V1 model runner ({type(runner).__name__}), proposer {type(proposer).__name__}"
