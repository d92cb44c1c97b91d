"""The engine interface: one loaded model, one decode's view of it (a session), and how a pair's prompts
are decoded (a runner).

The loop speaks in token ids of prompt + output (`ids`); a session maps them onto its model's
own sequence and KV cache:

    session = engine.session(prompt, capacity=n)  # a fresh KV cache for this prompt, reaching n positions
    session.prefill()                       # every prompt token but the last (the pending one)
    logits = session.forward(tokens, keep)  # k new tokens -> (keep, vocab) logits of the last `keep`
    session.truncate(n_ids)                 # roll back: keep the first n_ids tokens of prompt + output
    session.unseen(ids)                     # the tokens of ids the cache has not seen yet
    session.hidden()                        # opened with hidden=True: the last layer's states of the
                                            # last forward's kept positions (the draft's, for a policy)

An engine whose batched forward rounds differently from one-token steps must make `forward`
agree with one-token decoding, or say in `describe()` that it does not (llama.cpp's fast mode).

An engine that decodes by itself (vLLM) has no sessions: it is an `EngineBase`, not an `Engine`, and its
registry entry's `runner` decodes prompts on it (`Runner`, docs/architecture.md, "Runners").
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from disco.core.stats import GenResult


@runtime_checkable
class Session(Protocol):
    n_prompt: int  # prompt tokens of the decode
    recomputed: int  # tokens re-run because the cache could not be rolled back (0 when rollback works)
    padded: int  # filler tokens fed to pad forwards up to a captured width (0 without captured steps)

    def unseen(self, ids: torch.Tensor) -> torch.Tensor: ...

    def prefill(self) -> None: ...

    def forward(self, tokens: torch.Tensor, keep: int) -> torch.Tensor: ...

    def truncate(self, n_ids: int) -> None: ...

    def hidden(self) -> torch.Tensor | None: ...  # (keep, hidden) last-layer states of the last forward


@runtime_checkable
class EngineBase(Protocol):
    """What every engine offers, whether disco's loop drives it (Engine) or it decodes by itself (vLLM)."""

    name: str  # "torch", "llama.cpp" or "vllm": recorded in traces, profiles and artifacts
    device: torch.device  # where its logits live

    @property
    def context_length(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...  # width of its logits

    @property
    def hidden_size(self) -> int: ...  # width of its last layer's states (hidden())

    def describe(self) -> dict: ...  # engine name, version, threads, quantization, verification mode

    def warm_up(self, capacity: int) -> float: ...  # compile what a decode of `capacity` positions runs; seconds

    # --- what differs between engines, owned by each (docs/architecture.md, "Engines") ---------------

    def check_pairable(self, draft: Engine) -> None: ...  # refuse a draft the loop cannot run against this target

    def pair_description(self, draft: Engine) -> dict: ...  # {"cpu_backend", "engine"} of Pair.describe()

    def hardware_key(self, device: torch.device) -> str: ...  # what the costs depend on (profile file names)

    def anchors(self, pair: Any, settings: dict) -> list[Anchor]: ...  # the engine's own speculative decoding

    def variants(self) -> list[Variant]: ...  # other settings compare runs the main rows in (llama.cpp: fast)

    def spare(self) -> EngineBase: ...  # an engine for one more concurrent session (serving: a draft per request)


@runtime_checkable
class Sessions(Protocol):
    """What registry.loop_engine checks at run time: the engine opens sessions, so disco's loop can drive it (a
    stub engine need not offer the rest of Engine, such as batched_draft)."""

    def session(
        self, prompt: torch.Tensor, use_cache: bool = True, hidden: bool = False, capacity: int | None = None
    ) -> Session: ...


class Engine(EngineBase, Protocol):
    """An engine disco's loop drives: a session per decode (registry.loop_engine asks for one)."""

    def session(
        self, prompt: torch.Tensor, use_cache: bool = True, hidden: bool = False, capacity: int | None = None
    ) -> Session: ...  # capacity: prompt + output positions it may reach

    def spare(self) -> Engine: ...

    # many requests' drafts in one forward per call (serving: BatchedDraft, sequences keyed by request); None:
    # the engine has none, and each request drafts on a session of its own (spare())
    def batched_draft(self, seqs: int) -> BatchedDraft | None: ...


class BatchedDraft(Protocol):
    """One draft model holding a sequence per request (vLLM's side-engine proposer): each feed() is one
    batched forward over every sequence given tokens (engines/llamacpp/llamacpp_batch.py)."""

    # append each key's tokens to its sequence (a new key starts one): {key: ((vocab,) logits after its last
    # token, its (hidden,) last-layer state if `hidden`, else None)}
    def feed(
        self, tokens: Mapping[Hashable, Sequence[int]], hidden: bool = False
    ) -> dict[Hashable, tuple[torch.Tensor, torch.Tensor | None]]: ...

    def length(self, key: Hashable) -> int: ...  # tokens key's sequence holds (0: none)

    def truncate(self, key: Hashable, n: int) -> None: ...  # keep its first n tokens (a rejected window)

    def remove(self, key: Hashable) -> None: ...  # the request left: free its sequence

    def __len__(self) -> int: ...  # sequences held


class Anchor(Protocol):
    """A row of `disco compare` decoded by the engine's own speculative decoding, not disco's loop
    (transformers' assisted generation, llama-server): its windows are not known."""

    label: str  # the row name; its first word is the --policies name (EngineKind.anchor_names)
    forwards_known: bool  # whether its GenStats count forward calls

    def start(self, stack: contextlib.ExitStack, progress: bool) -> None: ...  # before any timing (servers)

    def generate(self, prompt_ids: list[int], config: Any, eos_token_ids: frozenset[int]) -> GenResult: ...


@dataclass(frozen=True)
class Variant:
    """Another setting of an engine that compare also runs some rows in, as label + suffix."""

    suffix: str  # appended to the row's label, e.g. " (fast verify)"
    applied: Callable[[Any], contextlib.AbstractContextManager]  # pair -> a context running it in this setting


@dataclass
class PairParts:
    """What an engine's pair loader returns (pair.Pair adds the methods): two models on one engine
    sharing one tokenizer."""

    target: Any  # a torch.nn.Module (torch engine) or an Engine object (e.g. llama.cpp)
    draft: Any
    tokenizer: Any  # the shared tokenizer (the target's)
    target_name: str  # model id, folder or GGUF path as given ("embedded:…" for the default pair's files)
    draft_name: str
    device: torch.device
    dtype: torch.dtype
    eos_token_ids: frozenset[int]  # generation stops after any of these


@dataclass
class Continuation:
    """One prompt's target continuation, as `disco collect` traces it (docs/architecture.md, "Data flow")."""

    tokens: list[int]  # y: the target's output (greedy, or sampled with the prompt's seed), EOS included if it stopped
    # (len(y), vocab) the target's logits at every position of y, as its generation computed them; None: the
    # engine does not show them (vLLM): the collector asks ContinuationSource.scorer, or records no target side
    target_logits: torch.Tensor | None = None


class ContinuationSource(Protocol):
    """Where `disco collect` gets the target's continuations: disco's own loop, one prompt at a time
    (collect.LoopContinuations), or an engine that decodes by itself, all prompts in one batched run
    (EngineKind.continuations: vLLM's vllm.stages.VllmContinuations). The collector asks it for a list of
    prompts and traces each continuation as it comes."""

    # the pair as the collector traces it: its draft is the engine whose teacher-forced forward gives the
    # features (the draft as the engine's speculative decoding runs it), its describe() what the manifest records
    pair: Any
    # the engine whose teacher-forced forward gives the target's distribution over a continuation that came
    # without it (sampled traces need it for their labels); None: not available (greedy traces then have no
    # target side: no target-side columns, no target signals)
    scorer: Any

    # (index in prompts, its continuation) as each finishes; configs: each prompt's decode.DecodeConfig (its own
    # seed when sampling). Closing the generator early (an error, Ctrl-C) drops the requests still running.
    def continuations(
        self, prompts: Sequence[list[int]], configs: Sequence[Any]
    ) -> Generator[tuple[int, Continuation], None, None]: ...

    def record(self) -> dict: ...  # the trace manifest's "collection": how continuations and features were made


class Runner(Protocol):
    """How prompts are decoded on a pair's engine (docs/architecture.md, "Runners"): disco's own loop, one prompt
    at a time (runner.LoopRunner), or an engine that decodes by itself, groups of prompts submitted together
    (EngineKind.runner: vLLM's vllm.stages.VllmRunner). generate, compare, profile and the first-turn answers
    decode through it and never ask which it is."""

    # prompts the first-turn answers decode together (their cache is written after each group): 1 for disco's loop
    group: int
    # compare's results are one per concurrency level (c{c}/ folders beside a table of all levels); else one result
    by_level: bool

    def levels(self, asked: Sequence[int]) -> list[int]: ...  # compare's --concurrency levels it runs

    # Each prompt's result, in order, as each finishes: under the policy `spec` (policy_registry.PolicySpec), the
    # run's decode.DecodeConfig, `concurrency` prompts at once (None: as it decodes a prompt set: disco's loop one
    # at a time, vLLM all together). Stats hold the window counts and each prompt's wall time.
    def decode(
        self, prompts: Sequence[list[int]], spec: Any, config: Any, concurrency: int | None = None
    ) -> Iterator[GenResult]: ...

    # compare's rows for its entries (compare.Entry), target-only first (every speedup's reference);
    # settings: the engine's own rows' settings (vLLM: fixed_k, proposers); max_concurrency: the highest level
    def rows(self, entries: Sequence[Any], config: Any, settings: dict, max_concurrency: int) -> list[CompareRow]: ...

    # `disco profile`: the pair's cost model measured on this engine (profile.profile_pair, or vLLM's step costs)
    def profile(self, max_window: int, context: int, repeats: int, warmup: int, max_batch: int) -> dict: ...


class CompareRow(Protocol):
    """One row of `disco compare` as a runner decodes it: a group of prompts (one on disco's loop) at a time."""

    label: str  # its name in the table (target-only's is recorded as compare.TARGET_LABEL)
    anchor: bool  # the engine's own decoding, not disco's policy (compare.json's "anchors")
    forwards_known: bool  # whether its GenStats count forward calls (not llama-server's, not vLLM's own)
    # after decode(): the seconds disco's proposer spent deciding and drafting in it (vLLM's rows), else None
    costs: tuple[float, float] | None

    def start(self, stack: contextlib.ExitStack, progress: bool) -> None: ...  # before any timing (servers)

    # each prompt's result, the prompts submitted together at compare's `concurrency` level (one on disco's loop);
    # refs: target-only's results of the same prompts (the oracle's knowledge), None for target-only's own row
    def decode(
        self, prompts: list[list[int]], config: Any, refs: list[GenResult] | None, concurrency: int
    ) -> list[GenResult]: ...


@dataclass(frozen=True)
class EngineKind:
    """One registry entry (loop/engine_registry.py): how to load a pair on this engine and what it claims."""

    load_pair: Callable[[Any], PairParts]  # options.PairOptions (pair file applied) -> the loaded pair
    prepare_embedded: Callable[[bool], dict[str, Any]]  # install? -> {role: path} of the embedded pair's files
    claims_auto: Callable[[str | None, str | None, bool], bool]  # --engine auto: (target, draft, cuda) -> run here?
    check_device: Callable[[str], None]  # refuse a --device it cannot run on
    anchor_names: tuple[str, ...] = ()  # --policies names of its anchors' rows
    # the PairOptions fields only this engine reads, with their flags: refused on another engine (checks.py)
    owned_options: tuple[tuple[str, str], ...] = ()
    select_hint: str = ""  # how a user runs a pair on this engine, e.g. "--engine torch"
    # other engines' PairOptions fields this one reads too (vLLM: the dtype it loads, its llama.cpp draft's
    # threads and quantization): not refused on it
    shares_options: tuple[str, ...] = ()
    # decodes by itself (vLLM): not driven by disco's loop (its `runner` decodes groups of prompts submitted
    # together); checks.py refuses its batching options on the other engines
    serving: bool = False
    # `disco collect`'s continuations on this engine: (pair, the run's decode.DecodeConfig, max_batch) -> a
    # ContinuationSource; None: disco's own loop (collect.LoopContinuations)
    continuations: Callable[[Any, Any, int], ContinuationSource] | None = None
    # how prompts are decoded on this engine: (pair, cost.CostModel load profile or None) -> a Runner; None:
    # disco's own loop (runner.LoopRunner)
    runner: Callable[[Any, Any], Runner] | None = None
    # an engine with no sessions (it decodes by itself): what to use instead, one line (registry.loop_engine)
    no_session: str = ""


# describe() fields that change how fast an engine runs, not the numbers it computes: llama.cpp's
# thread count (each row is reduced by one thread) and its exact width (the model and the build fix it),
# torch's KV cache and captured steps (the same keys, values and real positions)
SPEED_ONLY = ("threads", "exact_width", "cache", "captured_steps")
# describe() fields that say why it ran so (llama.cpp's repack probe) or how its build was compiled: for the
# reader; the numbers are fixed by the other fields (repack on/off among them)
RECORD_ONLY = ("repack_reason", "build")


def numeric_identity(engine_info: dict | None) -> dict:
    """An engine's describe() without SPEED_ONLY fields: what must agree for two traces to mix or a
    collection to resume. Manifests written before engines were recorded came from torch."""
    return {k: v for k, v in (engine_info or {"name": "torch"}).items() if k not in SPEED_ONLY + RECORD_ONLY}


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously): before and after anything timed."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
