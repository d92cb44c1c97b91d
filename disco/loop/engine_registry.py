"""The engine registry: a name -> its EngineKind (docs/architecture.md, "Engines").

A new engine is one module implementing engines.base.Engine (and its sessions, its pair loader, its
anchors) plus one line in ENGINE_KINDS; nothing above this module names an engine. The order of
ENGINE_KINDS is the order `--engine auto` asks them to claim a pair: the first that claims it runs it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import cast

import torch

from disco.base.defaults import ENGINES
from disco.base.errors import DiscoError
from disco.base.options import PairOptions
from disco.engines.base import Engine, EngineBase, EngineKind, PairParts, Sessions
from disco.engines.llamacpp import llamacpp
from disco.engines.torch import torch_engine
from disco.sources.embedded import pair_name
from disco.sources.pair_files import apply_pair_file
from disco.vllm import stages as vllm_stages  # (the vLLM wing: disco/vllm/)

ENGINE_KINDS: dict[str, EngineKind] = {
    "llama.cpp": llamacpp.KIND,
    "torch": torch_engine.KIND,  # claims every pair: the fallback of auto
    "vllm": vllm_stages.KIND,  # only when named (an optional install); claims nothing under auto
}
assert set(ENGINES) == {"auto", *ENGINE_KINDS}, "defaults.ENGINES lists the registry's names, for --help"
ANCHOR_NAMES = tuple(name for kind in ENGINE_KINDS.values() for name in kind.anchor_names)


def resolve_engine(engine: str, target: str | None, draft: str | None, device: str) -> str:
    """The engine a pair runs on: the one named, or (auto) the first in ENGINE_KINDS that claims it."""
    if engine not in ENGINES:
        raise DiscoError(f"unknown engine {engine!r}: choose one of {', '.join(ENGINES)}")
    if engine != "auto":
        ENGINE_KINDS[engine].check_device(device)
        return engine
    cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    return next(name for name, kind in ENGINE_KINDS.items() if kind.claims_auto(target, draft, cuda))


def load_parts(options: PairOptions = PairOptions()) -> PairParts:
    """Load the pair `options` describe on its engine; with neither model given, the embedded Qwen2.5-Coder
    pair. A pair file's target, draft and dtype apply where the options leave them unset."""
    options, _ = apply_pair_file(options, None)
    if (options.target is None) != (options.draft is None):
        raise DiscoError("give both --target and --draft, or neither (the embedded default pair)")
    engine = resolve_engine(options.engine, options.target, options.draft, options.device)
    parts = ENGINE_KINDS[engine].load_pair(options)
    # the embedded pair's files named by their paths are the embedded pair: artifacts trained on it apply
    return replace(parts, target_name=pair_name(parts.target_name), draft_name=pair_name(parts.draft_name))


def prepare_embedded(engine: str, install: bool = True) -> dict:
    """Prepare the embedded pair for `engine` once (later loads are fast): {role: path}."""
    if engine not in ENGINE_KINDS:
        raise DiscoError(f"unknown engine {engine!r}: choose {' or '.join(ENGINE_KINDS)}")
    return ENGINE_KINDS[engine].prepare_embedded(install)


def as_engine(model) -> EngineBase:
    """`model` itself when it is an engine; a torch.nn.Module is wrapped in the torch engine."""
    if isinstance(model, torch.nn.Module):
        return torch_engine.TorchEngine.of(model)
    if isinstance(model, EngineBase):
        return model
    raise TypeError(f"{type(model).__name__} is neither a torch model nor a disco engine")


def loop_engine(model) -> Engine:
    """`model` as an engine disco's loop drives (it opens sessions); an engine that decodes by itself (vLLM)
    has none and is refused in one line (its EngineKind.no_session: what to use instead)."""
    engine = as_engine(model)
    if not isinstance(engine, Sessions):
        raise DiscoError(ENGINE_KINDS[engine.name].no_session or f"the {engine.name} engine has no sessions")
    return cast(Engine, engine)


def check_compatible(target: EngineBase, draft: EngineBase) -> None:
    """Refuse a pair the loop cannot run: both on one engine, and compatible there (the engine's own check)."""
    if target.name != draft.name:
        raise DiscoError(f"the target runs on {target.name} but the draft on {draft.name}: run both on one engine")
    target.check_pairable(draft)


def teacher_forced(
    engine: Engine | torch.nn.Module, ids: torch.Tensor, n_prompt: int, hidden: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(len(ids) - n_prompt, vocab): the model's logits predicting each output token of ids = prompt +
    output, from one forward without a cache (what the loop sees where every earlier token was accepted),
    and with `hidden` the last layer's states at the same positions (else None)."""
    session = loop_engine(engine).session(ids[:n_prompt], use_cache=False, hidden=hidden)
    logits = session.forward(session.unseen(ids)[:-1], len(ids) - n_prompt)
    return logits, session.hidden() if hidden else None
