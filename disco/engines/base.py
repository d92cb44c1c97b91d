"""The engine interface: one loaded model, and one decode's view of it (a session).

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
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch



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
class Engine(Protocol):
    name: str  # "torch" or "llama.cpp": recorded in traces, profiles and artifacts
    device: torch.device  # where its logits live

    def session(self, prompt: torch.Tensor, use_cache: bool = True, hidden: bool = False,
                capacity: int | None = None) -> Session: ...  # capacity: prompt + output positions it may reach

    @property
    def context_length(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...  # width of its logits

    @property
    def hidden_size(self) -> int: ...  # width of its last layer's states (hidden())

    def describe(self) -> dict: ...  # engine name, version, threads, quantization, verification mode

    def warm_up(self, capacity: int) -> float: ...  # compile what a decode of `capacity` positions runs; seconds


# describe() fields that change how fast an engine runs, not the numbers it computes: llama.cpp's
# thread count (each row is reduced by one thread) and its exact width (the model and the build fix it),
# torch's KV cache and captured steps (the same keys, values and real positions)
SPEED_ONLY = ("threads", "exact_width", "cache", "captured_steps")


def numeric_identity(engine_info: dict | None) -> dict:
    """An engine's describe() without SPEED_ONLY fields: what must agree for two traces to mix or a
    collection to resume. Manifests written before engines were recorded came from torch."""
    return {k: v for k, v in (engine_info or {"name": "torch"}).items() if k not in SPEED_ONLY}


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously): before and after anything timed."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def as_engine(model) -> Engine:
    """`model` itself when it is an engine; a torch.nn.Module is wrapped in the torch engine."""
    if isinstance(model, torch.nn.Module):
        from disco.engines.torch_engine import TorchEngine

        return TorchEngine.of(model)
    if isinstance(model, Engine):
        return model
    raise TypeError(f"{type(model).__name__} is neither a torch model nor a disco engine")


def check_compatible(target: Engine, draft: Engine) -> None:
    """Refuse a pair the loop cannot run: both on one engine, and (torch) of compatible kinds."""
    from disco.errors import DiscoError

    if target.name != draft.name:
        raise DiscoError(f"the target runs on {target.name} but the draft on {draft.name}: run both on one engine")
    if target.name == "torch":
        from disco.engines.torch_engine import check_compatible as torch_check

        torch_check(target.model, draft.model)


def teacher_forced(engine: Engine, ids: torch.Tensor, n_prompt: int,
                   hidden: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(len(ids) - n_prompt, vocab): the model's logits predicting each output token of ids = prompt +
    output, from one forward without a cache (what the loop sees where every earlier token was accepted),
    and with `hidden` the last layer's states at the same positions (else None)."""
    engine = as_engine(engine)
    session = engine.session(ids[:n_prompt], use_cache=False, hidden=hidden)
    logits = session.forward(session.unseen(ids)[:-1], len(ids) - n_prompt)
    return logits, session.hidden() if hidden else None
