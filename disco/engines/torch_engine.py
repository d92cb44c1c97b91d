"""The torch engine: transformers models (decoder-only and encoder-decoder), dynamic or static KV caches.

What differs between model families lives here, not in the loop. Rollback is a cache crop;
a cache type without a working crop is rebuilt and the kept tokens are re-run (`recomputed`).

Two caches (`TorchEngine.cache`, `--cache`): transformers' DynamicCache grows by concatenation and
crops by slicing; a StaticCache is preallocated for the whole decode (prompt + budget) and
position-indexed, so rolling back only moves its length (stale entries past it are overwritten by
the next forward and, until then, hidden by the causal mask). Static is what captured CUDA graphs
need (fixed addresses); `auto` picks it for decoder-only models on CUDA and keeps dynamic on the
CPU (no launch overhead to save, and no preallocation) and for encoder-decoders.
"""

from __future__ import annotations

import inspect
import weakref
from dataclasses import dataclass

import torch

from disco.errors import DiscoError

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


_KINDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def model_kind(model: torch.nn.Module) -> ModelKind:
    kind = _KINDS.get(model)
    if kind is None:
        cfg = model.config
        encoder_decoder = bool(getattr(cfg, "is_encoder_decoder", False))
        start = None
        if encoder_decoder:
            gen = getattr(model, "generation_config", None)
            for value in (getattr(gen, "decoder_start_token_id", None), getattr(cfg, "decoder_start_token_id", None),
                          getattr(cfg, "pad_token_id", None)):  # T5 starts its decoder with the pad token
                if isinstance(value, int):
                    start = value
                    break
            if start is None:
                raise DiscoError(f"{type(model).__name__} is an encoder-decoder without a decoder_start_token_id "
                                 "in its config: set one")
        kind = ModelKind(encoder_decoder, start, "logits_to_keep" in inspect.signature(model.forward).parameters)
        _KINDS[model] = kind
    return kind


def check_compatible(target: torch.nn.Module, draft: torch.nn.Module) -> None:
    """Refuse a pair the loop cannot run: both must be decoder-only, or both encoder-decoders
    starting their decoders with the same token (their token sequences must line up)."""
    t, d = model_kind(target), model_kind(draft)
    if t.encoder_decoder != d.encoder_decoder:
        which = lambda k: "an encoder-decoder" if k.encoder_decoder else "decoder-only"  # noqa: E731
        raise DiscoError(f"the target is {which(t)} ({type(target).__name__}) but the draft is {which(d)} "
                         f"({type(draft).__name__}): pick a draft of the target's family")
    if t.decoder_start != d.decoder_start:
        raise DiscoError(f"target and draft start their decoders with different tokens ({t.decoder_start} vs "
                         f"{d.decoder_start}): pick a draft of the target's family")


CACHES = ("auto", "static", "dynamic")
DEFAULT_CACHE = "auto"  # static for decoder-only models on CUDA, dynamic elsewhere (resolve_cache)


def resolve_cache(model: torch.nn.Module, cache: str) -> str:
    """"static" or "dynamic": the cache a decode of `model` uses under the `--cache` choice."""
    if cache not in CACHES:
        raise DiscoError(f"unknown --cache {cache!r}: choose one of {', '.join(CACHES)}")
    encoder_decoder = model_kind(model).encoder_decoder
    if cache == "static" and encoder_decoder:
        raise DiscoError(f"--cache static: {type(model).__name__} is an encoder-decoder, whose cache stays "
                         "dynamic; use --cache dynamic or auto")
    if cache == "auto":
        on_cuda = next(model.parameters()).device.type == "cuda"
        return "static" if on_cuda and not encoder_decoder else "dynamic"
    return cache


def _new_cache(model: torch.nn.Module, static_len: int | None = None):
    """A fresh KV cache: static for `static_len` positions, else dynamic."""
    from transformers import DynamicCache, EncoderDecoderCache, StaticCache

    if static_len is not None:  # decoder-only (resolve_cache): rollback is moving its length
        return StaticCache(config=model.config, max_cache_len=static_len)
    cache = DynamicCache(config=model.config)
    if model_kind(model).encoder_decoder:
        cache = EncoderDecoderCache(cache, DynamicCache(config=model.config))
    # Sliding-window and linear-attention layers then keep what a rollback needs (transformers' own
    # assisted generation does the same); full-attention layers are unaffected. (A transformers
    # without it has no such layers to roll back.)
    if hasattr(cache, "activate_past_recording"):
        cache.activate_past_recording()
    return cache


def _forward(model: torch.nn.Module, cache, ids: torch.Tensor, keep: int, hidden_out: list | None = None,
             **inputs) -> torch.Tensor:
    """Feed `ids` (n,) after what `cache` holds; return logits of the last `keep` positions, (keep, vocab).

    hidden_out: a list to append the last layer's states of those positions to, (keep, hidden).
    inputs: encoder_outputs for an encoder-decoder (whose `ids` are then decoder tokens)."""
    kind = model_kind(model)
    if hidden_out is not None:
        inputs["output_hidden_states"] = True
    if kind.logits_to_keep:
        inputs["logits_to_keep"] = keep
    if kind.encoder_decoder:
        if "encoder_outputs" not in inputs:
            raise DiscoError(f"{type(model).__name__} is an encoder-decoder: drive it through ModelState, "
                             "which encodes the prompt once")
        inputs["decoder_input_ids"] = ids.unsqueeze(0)
    else:
        inputs["input_ids"] = ids.unsqueeze(0)
    out = model(**inputs, cache=cache, use_cache=cache is not None)
    if hidden_out is not None:
        states = out.decoder_hidden_states if kind.encoder_decoder else out.hidden_states
        hidden_out.append(states[-1][0, -keep:])
    return out.logits[0, -keep:]


class ModelState:
    """One model's side of a decode: its KV cache and, for an encoder-decoder, the encoded prompt.

    The model's own token sequence is `prefix + output`: the prompt for a decoder-only model,
    [decoder start token] for an encoder-decoder. The loop speaks in prompt + output positions
    (`ids`); this class maps them onto the model's sequence. When a cache cannot be rolled back
    (crop fails), it is dropped and the kept tokens are re-run on the next forward (`recomputed`)."""

    def __init__(self, model: torch.nn.Module, prompt: torch.Tensor, use_cache: bool = True,
                 hidden: bool = False, capacity: int | None = None, cache: str = "dynamic") -> None:
        self.model, self.n_prompt = model, len(prompt)
        kind = model_kind(model)
        self.inputs: dict = {}
        if kind.encoder_decoder:
            self.inputs["encoder_outputs"] = model.get_encoder()(input_ids=prompt.unsqueeze(0))
            self.prefix = prompt.new_tensor([kind.decoder_start])
        else:
            self.prefix = prompt
        if cache == "static" and capacity is None:
            raise ValueError("a static cache needs the decode's capacity (prompt + output tokens)")
        # the model's sequence is prefix + output: a static cache holds the prompt's capacity less the prompt
        self._static_len = capacity - self.n_prompt + len(self.prefix) if cache == "static" else None
        self.cache = _new_cache(model, self._static_len) if use_cache else None
        self.length = 0  # tokens of the model's sequence in the cache (kept here: a static cache's own count is a tensor)
        self.recomputed = 0  # tokens re-run because the cache could not be rolled back
        self.want_hidden = hidden  # keep the last layer's states of every forward (hidden())
        self._hidden: torch.Tensor | None = None

    def unseen(self, ids: torch.Tensor) -> torch.Tensor:
        """The tokens of `ids` (prompt + output so far) not in the cache yet, as the model's sequence."""
        j, p = self.length, len(self.prefix)
        if j >= p:
            return ids[self.n_prompt + j - p :]
        return torch.cat([self.prefix[j:], ids[self.n_prompt :]])

    def forward(self, tokens: torch.Tensor, keep: int) -> torch.Tensor:
        buf: list | None = [] if self.want_hidden else None
        logits = _forward(self.model, self.cache, tokens, keep, buf, **self.inputs)
        if self.cache is not None:
            self.length += len(tokens)
        self._hidden = buf[0] if buf else None
        return logits

    def hidden(self) -> torch.Tensor | None:
        """(keep, hidden) last-layer states of the last forward's kept positions (sessions opened with hidden=True)."""
        return self._hidden

    def prefill(self) -> None:
        """Feed the prefix except its last token (the pending one)."""
        if len(self.prefix) > 1:
            self.forward(self.prefix[:-1], 1)

    def truncate(self, n_ids: int) -> None:
        """Keep the cache of the first `n_ids` tokens of prompt + output."""
        length = max(0, n_ids - self.n_prompt + len(self.prefix))
        extra = self.length - length
        if extra < 0:
            return
        try:
            self.cache.crop(-extra)  # crop(0) too: it trims sliding-window layers back to their window
            self.length = length
        except (AttributeError, NotImplementedError, RuntimeError, ValueError):
            # A cache type without a working crop (a custom or stateful cache): start a fresh one;
            # `unseen` then hands the next forward every kept token again.
            self.cache = _new_cache(self.model, self._static_len)
            self.recomputed += length
            self.length = 0


_ENGINES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class TorchEngine:
    """A transformers model as a disco engine (one per model: `TorchEngine.of(model)`)."""

    name = "torch"

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.cache = DEFAULT_CACHE  # the --cache choice (set_cache); resolved per decode, as the model may move

    @classmethod
    def of(cls, model: torch.nn.Module) -> TorchEngine:
        engine = _ENGINES.get(model)
        if engine is None:
            engine = _ENGINES[model] = cls(model)
        return engine

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def set_cache(self, cache: str) -> TorchEngine:
        """Choose the KV cache of this model's decodes (CACHES); refuses what the model cannot use."""
        resolve_cache(self.model, cache)
        self.cache = cache
        return self

    def session(self, prompt: torch.Tensor, use_cache: bool = True, hidden: bool = False,
                capacity: int | None = None) -> ModelState:
        """capacity: prompt + output positions the decode can reach (a static cache is allocated for
        them; without it the cache is dynamic)."""
        cache = resolve_cache(self.model, self.cache) if capacity is not None else "dynamic"
        return ModelState(self.model, prompt, use_cache, hidden, capacity, cache)

    @property
    def context_length(self) -> int:
        cfg = self.model.config
        for attr in ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length"):
            value = getattr(cfg, attr, None)
            if isinstance(value, int) and value > 0:
                return value
        return 1 << 30  # no stated limit (e.g. relative positions)

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    @property
    def hidden_size(self) -> int:
        cfg = self.model.config
        cfg = getattr(cfg, "get_text_config", lambda: cfg)()
        return int(getattr(cfg, "hidden_size", None) or getattr(cfg, "d_model"))

    def describe(self) -> dict:
        return {"name": self.name, "version": torch.__version__, "cache": resolve_cache(self.model, self.cache)}
