"""One runner for both worlds: how a pair's prompts are decoded (docs/architecture.md, "Runners").

generate, compare, profile and the first-turn answers ask `runner_for(pair)` and decode through what it
returns (engines.base.Runner): "decode these prompts under this policy at this concurrency, return each
result with its window counts and time". An engine that decodes by itself names its own runner in its
registry entry (EngineKind.runner: vLLM's vllm.stages.VllmRunner, groups of prompts submitted together);
every other engine is driven by disco's own loop, here: one prompt at a time (decode.generate), its engine's
own speculative decoding (Engine.anchors) and variants as compare rows, its cost model from profile.profile_pair.
With the closed loop (--closed-loop), a stream of prompts shares one closed_loop_policy.LoopStream: generate's prompt set,
each compare row "ROW (closed loop)" beside ROW.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from disco.base.errors import DiscoError
from disco.core.load_profiles import LoadProfiles
from disco.engines.base import Anchor, Runner, Variant
from disco.jobs.profile import profile_pair
from disco.loop.decode import DecodeConfig, GenResult, generate_ids, target_generate
from disco.loop.engine_registry import ENGINE_KINDS
from disco.loop.pair import Pair
from disco.policies.closed_loop_policy import LoopStream
from disco.policies.policy_registry import PolicySpec

TARGET_LABEL = "target"  # target-only decoding's row: every speedup's reference
CLOSED_SUFFIX = " (closed loop)"  # compare --closed-loop: a policy row's twin under the closed loop


def runner_for(pair: Pair, load: LoadProfiles | None = None, closed_loop: bool = False) -> Runner:
    """The runner of the pair's engine (EngineKind.runner), else disco's loop. load: vLLM load profiles
    (`disco profile --engine vllm`; each proposer takes its own) the cost rules decide with per batch; disco's
    loop has no batches. closed_loop: disco's loop runs its policies under the closed loop (check_closed_loop)."""
    own = ENGINE_KINDS[pair.engine_name].runner
    if closed_loop:
        check_closed_loop(pair)
    return own(pair, load) if own is not None else LoopRunner(pair, closed_loop)


def check_closed_loop(pair: Pair) -> None:
    """--closed-loop closes disco's own loop; an engine that decodes by itself (vLLM) closes its proposers' own."""
    if ENGINE_KINDS[pair.engine_name].runner is not None:
        raise DiscoError(
            f"--closed-loop runs in disco's own loop (torch, llama.cpp), not on the {pair.engine_name} engine: there "
            'set "closed_loop": true in DISCO_VLLM_POLICY and serve (vllm serve: vLLM\'s draft or the side engine)'
        )


class LoopRunner:
    """disco's own loop (decode.py): one prompt at a time, so concurrency is always 1."""

    group = 1  # the first-turn answers: the cache is written after every answer
    by_level = False  # compare: one result (compare.json, table.md, plots in --out)

    def __init__(self, pair: Pair, closed_loop: bool = False) -> None:
        self.pair = pair
        self.closed_loop = closed_loop  # decode: the prompt set is one stream under the closed loop

    def levels(self, asked: Sequence[int]) -> list[int]:
        """One prompt at a time: compare runs its rows once, at concurrency 1, whatever levels --concurrency names
        (a vLLM option: its default names two)."""
        return [1]

    def decode(
        self, prompts: Sequence[list[int]], spec: PolicySpec, config: DecodeConfig, concurrency: int | None = None
    ) -> Iterator[GenResult]:
        """Each prompt under `spec` through disco's loop, as it finishes."""
        if concurrency is not None and concurrency > 1:
            raise DiscoError(
                f"the {self.pair.engine_name} engine decodes one prompt at a time (disco's loop): concurrency "
                f"{concurrency} needs an engine that batches requests (--engine vllm)"
            )
        closed = LoopStream() if self.closed_loop else None
        return (generate_ids(self.pair, ids, spec, config, closed=closed) for ids in prompts)

    def rows(self, entries: Sequence[Any], config: DecodeConfig, settings: dict, max_concurrency: int) -> list:
        """Target-only (the reference), then compare's entries: a policy in disco's loop (in the engine's variant
        setting, if any) or the engine's own speculative decoding (an anchor); with settings["closed_loop"], each
        policy row's twin under the closed loop (the oracle's aside: it is a bound)."""
        if not entries:
            raise DiscoError("no policy row to run beside target-only: choose rows with --policies (or drop it)")
        rows = [LoopRow(self.pair, e.label, e.spec, e.own, e.variant) for e in entries]
        if settings.get("closed_loop"):
            twins = [e for e in entries if e.spec is not None and not e.spec.kind.needs_target_tokens]
            rows += [LoopRow(self.pair, e.label + CLOSED_SUFFIX, e.spec, None, e.variant, True) for e in twins]
        return [LoopTarget(self.pair), *rows]

    def profile(self, max_window: int, context: int, repeats: int, warmup: int, max_batch: int) -> dict:
        """c_d and c_t(k) of the pair's engines, timed on their sessions (max_batch is vLLM's)."""
        return profile_pair(self.pair, max_window, context, repeats, warmup)


class LoopTarget:
    """compare's target-only row on disco's loop: plain target decoding through the same loop."""

    label = TARGET_LABEL
    anchor = False
    forwards_known = True
    costs = None

    def __init__(self, pair: Pair) -> None:
        self.pair = pair

    def start(self, stack: contextlib.ExitStack, progress: bool) -> None:
        pass

    def decode(
        self, prompts: list[list[int]], config: DecodeConfig, refs: list[GenResult] | None, concurrency: int = 1
    ) -> list[GenResult]:
        return [target_generate(self.pair.target, ids, config, self.pair.eos_token_ids) for ids in prompts]


class LoopRow:
    """One of compare's rows on disco's loop: a policy (spec), or the engine's own speculative decoding (own)."""

    costs = None  # disco's loop times its decisions inside each run's stats

    def __init__(
        self,
        pair: Pair,
        label: str,
        spec: PolicySpec | None,
        own: Anchor | None,
        variant: Variant | None,
        closed_loop: bool = False,
    ) -> None:
        self.pair, self.label, self.spec, self.own, self.variant = pair, label, spec, own, variant
        self.closed = LoopStream() if closed_loop else None  # the row's prompts: one stream under the closed loop
        self.anchor = spec is None
        self.forwards_known = own is None or own.forwards_known

    def start(self, stack: contextlib.ExitStack, progress: bool) -> None:
        if self.own is not None:  # the engines' own decoding (servers) starts before any timing
            self.own.start(stack, progress)

    def decode(
        self, prompts: list[list[int]], config: DecodeConfig, refs: list[GenResult] | None, concurrency: int = 1
    ) -> list[GenResult]:
        out = []
        for n, ids in enumerate(prompts):
            if self.own is not None:
                out.append(self.own.generate(ids, config, self.pair.eos_token_ids))
                continue
            assert self.spec is not None
            target_tokens = refs[n].tokens if refs is not None else None  # the oracle's knowledge
            with self.variant.applied(self.pair) if self.variant else contextlib.nullcontext():
                out.append(generate_ids(self.pair, ids, self.spec, config, target_tokens, self.closed))
        return out
