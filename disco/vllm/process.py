"""The one owner of what disco holds in a vLLM process (docs/architecture.md, "vLLM"): the two changes it makes
to vLLM's runner, the settings the next draft proposer takes, the proposers built, the runner asking for drafts
now, and the rule that matches vLLM's request ids. Everything else in disco.vllm reads these through `PROCESS`.

The changes to vLLM (all made by `install()`, idempotent; read from vLLM 0.32, settings.SUPPORTED_VLLM):
  1. the V1 runner builds `DraftModelProposer` by its module-global name (gpu_model_runner.py ~612; no option
     takes a subclass): the name is rebound to disco's class (plugin.take_effect hands over
     draft.proposer_class()), which behaves exactly as vLLM's own until given settings;
  2. `GPUModelRunner.propose_draft_token_ids` is wrapped to note the runner whose step asks for drafts: a
     custom_class proposer is handed rows, not request ids (the side proposer reads them here);
  3. `EngineArgs.create_engine_config` is wrapped so that, where disco's policy decides on vLLM's draft, vLLM's
     configuration is made and checked as disco needs it (config.engine_args_defaults before, check_config after:
     the same under `vllm serve`, whose API server builds it, and in-process).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from disco.base.errors import DiscoError
from disco.core.cost import CostModel
from disco.policies.policy_registry import PolicySpec
from disco.vllm.config import check_config, engine_args_defaults, speculates_with_draft_model
from disco.vllm.settings import ENV, Settings


@dataclass
class Shared:
    """What this process's side-engine proposer (side.DiscoProposer) drafts with: set by the vLLM runner
    (stages.VllmRunner) before vLLM builds the proposer in-process, or read from the settings under `vllm serve`."""

    pair: Any = None  # the pair.Pair: the draft engine, the tokenizer (token classes), the names the artifact checks
    policy: PolicySpec = field(default_factory=lambda: PolicySpec("threshold"))
    load: CostModel | None = None  # a vLLM load profile (c_step): the cost rules decide per batch
    closed_loop: bool = False  # costs measured in the process (`load` only seeds them), calibration, governor
    proposer: Any = None  # the live side.DiscoProposer (the runner reads its counts)
    # keep finished requests' counts until asked for (in-process compare, profile, generate); under `vllm serve`
    # nothing is kept per finished request (memory stays flat however many it serves)
    keep_stats: bool = False
    # draft every request in one batched forward per position where the draft engine has a batched draft
    # (Engine.batched_draft: llama.cpp); False: one request after another on sessions of their own (the tests
    # compare the two; read at each set_policy)
    batched: bool = True


@dataclass
class VllmProcess:
    """disco's state in this vLLM process (one instance: PROCESS)."""

    armed: Settings | None = None  # in-process: the settings the next draft proposer vLLM builds takes
    proposers: list[Any] = field(default_factory=list)  # the draft.DiscoDraftProposers built in this process
    side: Shared = field(default_factory=Shared)
    runner: Any = None  # the model runner whose step is asking for drafts now
    said: set[str] = field(default_factory=set)  # one-time lines already printed in this process

    def install(self, draft_class: type) -> None:
        """Make vLLM's runner build `draft_class` (disco's draft proposer) for `draft_model`, note which runner
        asks for drafts, and make vLLM's config as disco needs it (idempotent; plugin.take_effect checks vLLM's
        release first)."""
        import vllm.v1.worker.gpu_model_runner as runner

        runner.DraftModelProposer = draft_class  # type: ignore[misc]
        cls = runner.GPUModelRunner  # (CPUModelRunner subclasses it)
        if not getattr(cls.propose_draft_token_ids, "_disco", False):
            propose = cls.propose_draft_token_ids

            def propose_draft_token_ids(runner_self: Any, *args: Any, **kwargs: Any) -> Any:
                self.runner = runner_self
                return propose(runner_self, *args, **kwargs)

            propose_draft_token_ids._disco = True  # type: ignore[attr-defined]
            cls.propose_draft_token_ids = propose_draft_token_ids  # type: ignore[method-assign]
        self._wrap_engine_config()

    def decides(self) -> bool:
        """Does disco's policy decide in the vLLM instance being built now (settings armed in-process, or
        DISCO_VLLM_POLICY under `vllm serve`)?"""
        return self.armed is not None or bool(os.environ.get(ENV))

    def _wrap_engine_config(self) -> None:
        from vllm.engine.arg_utils import EngineArgs
        from vllm.platforms import current_platform

        build = EngineArgs.create_engine_config
        if getattr(build, "_disco", False):
            return

        def create_engine_config(args: Any, *a: Any, **kw: Any) -> Any:
            disco = self.decides() and speculates_with_draft_model(args.speculative_config)
            said = engine_args_defaults(args, current_platform.is_cpu()) if disco else None
            if said:
                self.say_once("async", said)
            config = build(args, *a, **kw)
            if disco:
                check_config(config)
            return config

        create_engine_config._disco = True  # type: ignore[attr-defined]
        EngineArgs.create_engine_config = create_engine_config  # type: ignore[method-assign]

    @contextmanager
    def arming(self, settings: Settings | None) -> Iterator[None]:
        """In-process: the draft proposer vLLM builds inside this block decides with `settings` (None: vLLM's own)."""
        self.armed = settings
        try:
            yield
        finally:
            self.armed = None

    def batch_requests(self, n: int) -> tuple[list[str], set[str]]:
        """The vLLM request ids of the first n rows of the batch drafting now, and the ids of every request the
        runner still holds (running or preempted; the others have finished or were aborted)."""
        if self.runner is None:
            raise DiscoError("disco's vLLM proposers need disco's vLLM plugin: set DISCO_VLLM_POLICY (README)")
        return list(self.runner.input_batch.req_ids[:n]), set(self.runner.requests)

    def say_once(self, key: str, line: str) -> bool:
        """Print `line` once per process for `key` (to stderr, where vLLM logs); True when printed now."""
        if key in self.said:
            return False
        self.said.add(key)
        print(line, file=sys.stderr)
        return True


PROCESS = VllmProcess()


def is_request(engine_id: str, request_id: str) -> bool:
    """Is vLLM's engine request `engine_id` the one its LLM returned (or its outputs carry) as `request_id`? The
    engine adds a suffix ("-" and more) to the id the caller sees: the one place that rule is written."""
    return engine_id == request_id or engine_id.startswith(f"{request_id}-")


def take_stats(request_id: str, finished: dict[str, Any], running: dict[str, Any]) -> Any:
    """The counts of the request vLLM's LLM returned as `request_id`, once: a finished request's counts, or a
    running request's state's `.stats`; None when neither holds it."""
    for table in (finished, running):
        for rid in list(table):
            if is_request(rid, request_id):
                got = table.pop(rid)
                return got if table is finished else got.stats
    return None
