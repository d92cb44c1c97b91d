"""The torch engine: transformers models (decoder-only and encoder-decoder), DynamicCache.

What differs between model families lives here, not in the loop. Rollback is a cache crop;
a cache type without a working crop is rebuilt and the kept tokens are re-run (`recomputed`).
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


def _new_cache(model: torch.nn.Module):
    from transformers import DynamicCache, EncoderDecoderCache

    cache = DynamicCache(config=model.config)
    if model_kind(model).encoder_decoder:
        cache = EncoderDecoderCache(cache, DynamicCache(config=model.config))
    # Sliding-window and linear-attention layers then keep what a rollback needs (transformers' own
    # assisted generation does the same); full-attention layers are unaffected. (A transformers
    # without it has no such layers to roll back.)
    if hasattr(cache, "activate_past_recording"):
        cache.activate_past_recording()
    return cache


def _truncate(cache, length: int) -> None:
    """Roll a KV cache back to its first `length` positions."""
    extra = cache.get_seq_length() - length
    if extra >= 0:  # crop(0) too: it trims sliding-window layers back to their window
        cache.crop(-extra)


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
                 hidden: bool = False) -> None:
        self.model, self.n_prompt = model, len(prompt)
        kind = model_kind(model)
        self.inputs: dict = {}
        if kind.encoder_decoder:
            self.inputs["encoder_outputs"] = model.get_encoder()(input_ids=prompt.unsqueeze(0))
            self.prefix = prompt.new_tensor([kind.decoder_start])
        else:
            self.prefix = prompt
        self.cache = _new_cache(model) if use_cache else None
        self.recomputed = 0  # tokens re-run because the cache could not be rolled back
        self.want_hidden = hidden  # keep the last layer's states of every forward (hidden())
        self._hidden: torch.Tensor | None = None

    @property
    def length(self) -> int:
        """Tokens of the model's sequence in the cache."""
        return self.cache.get_seq_length() if self.cache is not None else 0

    def unseen(self, ids: torch.Tensor) -> torch.Tensor:
        """The tokens of `ids` (prompt + output so far) not in the cache yet, as the model's sequence."""
        j, p = self.length, len(self.prefix)
        if j >= p:
            return ids[self.n_prompt + j - p :]
        return torch.cat([self.prefix[j:], ids[self.n_prompt :]])

    def forward(self, tokens: torch.Tensor, keep: int) -> torch.Tensor:
        buf: list | None = [] if self.want_hidden else None
        logits = _forward(self.model, self.cache, tokens, keep, buf, **self.inputs)
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
        try:
            _truncate(self.cache, length)
        except (AttributeError, NotImplementedError, RuntimeError, ValueError):
            # A cache type without a working crop (a custom or stateful cache): start a fresh one;
            # `unseen` then hands the next forward every kept token again.
            self.cache = _new_cache(self.model)
            self.recomputed += length


_ENGINES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class TorchEngine:
    """A transformers model as a disco engine (one per model: `TorchEngine.of(model)`)."""

    name = "torch"

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    @classmethod
    def of(cls, model: torch.nn.Module) -> TorchEngine:
        engine = _ENGINES.get(model)
        if engine is None:
            engine = _ENGINES[model] = cls(model)
        return engine

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def session(self, prompt: torch.Tensor, use_cache: bool = True, hidden: bool = False) -> ModelState:
        return ModelState(self.model, prompt, use_cache, hidden)

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
        return {"name": self.name, "version": torch.__version__}
