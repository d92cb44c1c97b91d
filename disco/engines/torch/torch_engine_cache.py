"""The torch engine's models and KV caches: what differs between model families, and how a cache rolls back.

Model families (`model_kind`): a decoder-only model takes input_ids and a cache; an encoder-decoder (T5) encodes
the prompt once and its decoder is the language model. Caches (`new_cache`, `rewind`): transformers' DynamicCache
grows by concatenation and crops by slicing; a StaticCache is preallocated for the whole decode and
position-indexed, so rolling back only moves its length counters (through StaticLayer.crop where transformers has
it, 5.24 on, and in place here where it does not, 5.16 to 5.23). Captured steps (`CapturedSteps`, `BUCKETS`): a
model's forward compiled once per width bucket over a static cache (CUDA graphs on CUDA). disco.engines.torch.torch_engine
drives them (docs/architecture.md, "Engines"); this module's name keeps the torch_engine prefix by which a native
crash is named (disco.base.crash.ENGINE_MODULES: its folder).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import weakref
from dataclasses import dataclass

import torch

from disco.base.defaults import CACHES, DEFAULT_MAX_WINDOW
from disco.base.errors import DiscoError

# --- model families: what differs between them lives here, not in the loop ------------------------
#
# Decoder-only families (Llama, Qwen2, OPT, CodeGen, GPT-NeoX, GPTBigCode, ...) take input_ids and a
# cache, and compute positions from the cache length. An encoder-decoder (T5) encodes the prompt once;
# its decoder is then a causal LM over [decoder start token] + output, with an EncoderDecoderCache
# whose self-attention part is rolled back like any other cache (the cross-attention part stays).


@dataclass(frozen=True)
class ModelKind:
    """How the loop drives one model; found once per model (`model_kind`)."""

    encoder_decoder: bool  # the prompt goes through the encoder once; the decoder is the language model
    decoder_start: int | None  # first decoder token (encoder-decoders only)
    logits_to_keep: bool  # forward() takes logits_to_keep; without it the loop slices the logits itself
    # the KV cache keyword: "cache" since transformers 5.24, "past_key_values" before (vLLM's CPU build pins < 5.20,
    # the lent GPU image carries 5.17)
    cache_arg: str = "cache"


_KINDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def model_kind(model: torch.nn.Module) -> ModelKind:
    kind = _KINDS.get(model)
    if kind is None:
        cfg = model.config
        encoder_decoder = bool(getattr(cfg, "is_encoder_decoder", False))
        start = None
        if encoder_decoder:
            gen = getattr(model, "generation_config", None)
            for value in (
                getattr(gen, "decoder_start_token_id", None),
                getattr(cfg, "decoder_start_token_id", None),
                getattr(cfg, "pad_token_id", None),
            ):  # T5 starts its decoder with the pad token
                if isinstance(value, int):
                    start = value
                    break
            if start is None:
                raise DiscoError(
                    f"{type(model).__name__} is an encoder-decoder without a decoder_start_token_id "
                    "in its config: set one"
                )
        params = inspect.signature(model.forward).parameters
        cache_arg = "cache" if "cache" in params or "past_key_values" not in params else "past_key_values"
        kind = ModelKind(encoder_decoder, start, "logits_to_keep" in params, cache_arg)
        _KINDS[model] = kind
    return kind


def check_compatible(target: torch.nn.Module, draft: torch.nn.Module) -> None:
    """Refuse a pair the loop cannot run: both must be decoder-only, or both encoder-decoders
    starting their decoders with the same token (their token sequences must line up)."""
    t, d = model_kind(target), model_kind(draft)
    if t.encoder_decoder != d.encoder_decoder:
        which = lambda k: "an encoder-decoder" if k.encoder_decoder else "decoder-only"  # noqa: E731
        raise DiscoError(
            f"the target is {which(t)} ({type(target).__name__}) but the draft is {which(d)} "
            f"({type(draft).__name__}): pick a draft of the target's family"
        )
    if t.decoder_start != d.decoder_start:
        raise DiscoError(
            f"target and draft start their decoders with different tokens ({t.decoder_start} vs "
            f"{d.decoder_start}): pick a draft of the target's family"
        )


def check_cache(cache: str, encoder_decoder: bool = False, name: str = "") -> None:
    """Refuse an unknown `--cache` choice, and a static cache for an encoder-decoder (`name`)."""
    if cache not in CACHES:
        raise DiscoError(f"unknown --cache {cache!r}: choose one of {', '.join(CACHES)}")
    if cache == "static" and encoder_decoder:
        raise DiscoError(
            f"--cache static: {name} is an encoder-decoder, whose cache stays dynamic; use --cache dynamic or auto"
        )


def resolve_cache(model: torch.nn.Module, cache: str) -> str:
    """ "static" or "dynamic": the cache a decode of `model` uses under the `--cache` choice."""
    encoder_decoder = model_kind(model).encoder_decoder
    check_cache(cache, encoder_decoder, type(model).__name__)
    if cache == "auto":
        on_cuda = next(model.parameters()).device.type == "cuda"
        return "static" if on_cuda and not encoder_decoder else "dynamic"
    return cache


# verify widths (k + 1 tokens) are padded up to these for captured steps: one graph per bucket; the
# last is the default window's verify; wider feeds run eagerly
BUCKETS = (1, 2, 4, 8, 16, DEFAULT_MAX_WINDOW + 1)
STATIC_ROUND = 256  # a reused static cache grows in steps of this many positions (each size: new graphs)


def _raise_recompile_limit(n: int) -> None:
    """Make room for `n` more compiled shapes. Every captured model's forward is one code object to dynamo
    (models of a class share theirs, and transformers' deprecation wrapper is one function for all), so
    target and draft share its recompile limit (8 by default) and, past it, further buckets would run
    eagerly, with only a logged warning: the limit grows by each captured model's buckets."""
    import torch._dynamo

    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"  # (torch < 2.6)
    setattr(cfg, name, getattr(cfg, name) + n)


class CapturedSteps:
    """One model's forward over fixed widths (`buckets`): compiled (on CUDA with CUDA graphs) when
    `compiled`, else eager with the same padding (what the tests compare against)."""

    def __init__(self, model: torch.nn.Module, buckets: tuple[int, ...] = BUCKETS, compiled: bool = True) -> None:
        self.buckets = tuple(sorted(buckets))
        on_cuda = next(model.parameters()).device.type == "cuda"
        mode = "reduce-overhead" if on_cuda else "default"  # reduce-overhead = inductor + CUDA graphs
        if compiled:
            _raise_recompile_limit(len(self.buckets))
        self.call = torch.compile(model.forward, mode=mode, dynamic=False) if compiled else model

    def bucket(self, width: int) -> int | None:
        """The captured width a feed of `width` tokens is padded to (None: too wide, run eagerly)."""
        return next((b for b in self.buckets if b >= width), None)


def new_cache(model: torch.nn.Module, static_len: int | None = None):
    """A fresh KV cache: static for `static_len` positions, else dynamic."""
    from transformers import DynamicCache, EncoderDecoderCache, StaticCache

    if static_len is not None:  # decoder-only (resolve_cache): rollback is moving its length
        return StaticCache(config=model.config, max_cache_len=static_len)
    cache = DynamicCache(config=model.config)
    if model_kind(model).encoder_decoder:
        cache = EncoderDecoderCache(cache, DynamicCache(config=model.config))
    # Sliding-window and linear-attention layers then keep what a rollback needs (transformers' own
    # assisted generation does the same); full-attention layers are unaffected. (A transformers
    # without it has no such layers to roll back.) Where recording breaks consecutive forwards
    # (`past_recording_works`) the cache does without: past its window a layer then cannot be cropped,
    # and those rollbacks take the re-run path.
    if hasattr(cache, "activate_past_recording") and past_recording_works():
        cache.activate_past_recording()
    return cache


@functools.cache
def past_recording_works() -> bool:
    """Whether a recording sliding-window layer hands attention no more entries than its mask is sized for when
    forwards follow one another with no crop between them, as a draft's do (transformers 5.16 and 5.17 hand it
    every recorded entry: the first such forward past the window fails on a size mismatch). Probed once, on a
    2-token window."""
    try:
        from transformers.cache_utils import DynamicSlidingWindowLayer
    except ImportError:  # no such layer: nothing for recording to break
        return True
    layer = DynamicSlidingWindowLayer(sliding_window=2)
    layer.activate_past_recording()
    kv = torch.zeros(1, 1, 2, 1)
    layer.update(kv, kv)  # the window is full
    sized, _ = layer.get_mask_sizes(1)
    keys, _ = layer.update(kv[:, :, :1], kv[:, :, :1])  # the next forward, no crop between
    return keys.shape[-2] <= sized


# what a cache that cannot roll back raises (transformers' own errors, and a crop it does not have)
ROLLBACK_ERRORS = (AttributeError, NotImplementedError, RuntimeError, ValueError)


def rewind(cache, n: int) -> None:
    """Roll `cache` back past its last `n` tokens (n >= 0); raises where that cannot be done (the session then
    starts a fresh cache and re-runs the kept tokens)."""
    if n:
        _crop(cache, n)
        return
    # crop(0) only trims what past recording kept (sliding-window and linear-attention layers); with nothing to roll
    # back, a cache that cannot do it loses nothing (e.g. a non-recording sliding-window layer past its window raises)
    with contextlib.suppress(*ROLLBACK_ERRORS):
        _crop(cache, 0)


def _crop(cache, n: int) -> None:
    """Remove the last `n` tokens of `cache`, static layers included.

    A static layer keeps its length as counters, not in its tensors' shapes: the next forward writes its entries at
    the counter, takes its positions from it (via get_seq_length: the engine passes none) and its attention mask's
    offset too, so the entries past it are dead (masked, then overwritten) and rolling back is moving the counters.
    transformers' StaticLayer.crop does exactly that where it exists (5.24 on); before it, its layers have no crop
    at all and the counters are moved here, as that crop would."""
    from transformers.cache_utils import StaticLayer

    layers = getattr(cache, "layers", ())  # (an encoder-decoder's cache is dynamic: no static layers)
    static = [layer for layer in layers if isinstance(layer, StaticLayer)]
    if n:
        for layer in static:
            # a sliding-window static layer past its window has rolled its entries over (the oldest are gone): no
            # counter brings them back (transformers' own crop, where it exists, does not check this)
            if getattr(layer, "cumulative_length_int", 0) > layer.max_cache_len:
                raise RuntimeError("a sliding-window static cache layer past its window cannot be rolled back")
    if not static or hasattr(StaticLayer, "crop"):
        cache.crop(-n)  # crop(0) too: it trims sliding-window layers back to their window
        return
    for layer in layers:
        if hasattr(layer, "crop"):  # a dynamic layer, or a static layer's linear-attention part (hybrid layers)
            layer.crop(-n)
        if isinstance(layer, StaticLayer):
            _rewind_static_layer(layer, n)


def _rewind_static_layer(layer, n: int) -> None:
    """Move a static layer's length counters back by `n` (what StaticLayer.crop does in transformers 5.24)."""
    if not n:
        return
    if not layer.is_initialized:  # nothing written: its counter is 0 and has nothing to go back over
        raise ValueError(f"cannot roll an empty static cache layer back by {n} tokens")
    # in place: captured steps read the counter at a fixed address (a CUDA graph replays with it)
    layer.cumulative_length.sub_(n)
    if hasattr(layer, "cumulative_length_int"):  # sliding-window layers: the int that their masks are sized by
        layer.cumulative_length_int -= n
    if getattr(layer, "is_indexer_initialized", False):  # DSA layers: the indexer keys' own counter
        layer.indexer_cumulative_length.sub_(n)
