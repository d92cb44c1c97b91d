"""The torch engine: transformers models (decoder-only and encoder-decoder), dynamic or static KV caches.

What differs between model families lives here, not in the loop. Rollback is a cache crop;
a cache type without a working crop is rebuilt and the kept tokens are re-run (`recomputed`).

Two caches (`TorchEngine.cache`, `--cache`): transformers' DynamicCache grows by concatenation and
crops by slicing; a StaticCache is preallocated for the whole decode (prompt + budget) and
position-indexed, so rolling back only moves its length (stale entries past it are overwritten by
the next forward and, until then, hidden by the causal mask). That length is the cache's own counter
(the engine passes no positions: the model reads them, and the mask its offset, from the cache), so
rolling back moves the counter, through StaticLayer.crop where transformers has it (5.24 on) and
in place here where it does not (5.16 to 5.23: `_rewind`). Static is what captured CUDA graphs
need (fixed addresses); `auto` picks it for decoder-only models on CUDA and keeps dynamic on the
CPU (no launch overhead to save, and no preallocation) and for encoder-decoders.

Captured steps (`--compile`, static caches only): each model's forward is compiled once per width
bucket (BUCKETS: a window's verify of k + 1 tokens is padded up to the next bucket, so a handful of
fixed shapes serve every width), with CUDA graphs on CUDA (torch.compile's "reduce-overhead"), over
one static cache per model reused by every decode (fixed addresses, fixed shapes). A padded forward
writes filler tokens past the real ones; their cache entries are rolled back like a rejected window
and their logits dropped, so the real positions see exactly what an unpadded forward sees. Wider
feeds (the prompt's prefill) run eagerly on the same cache.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import math
import time
import weakref
from dataclasses import dataclass

import torch

from disco import embedded
from disco.cpu import apply_cpu_backend, check_cpu_backend, cpu_backend_of
from disco.defaults import CACHES, DEFAULT_CACHE, DEFAULT_MAX_WINDOW
from disco.engines.base import EngineKind, PairParts, Variant, sync
from disco.errors import DiscoError
from disco.hub import (
    check_same_tokenizer,
    eos_ids,
    load_config,
    load_model,
    load_tokenizer,
    resolve_device,
    resolve_dtype,
)
from disco.options import PairOptions
from disco.stats import GenResult, GenStats

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
    # without it has no such layers to roll back.) Where recording breaks consecutive forwards
    # (`_past_recording_works`) the cache does without: past its window a layer then cannot be cropped,
    # and those rollbacks take the re-run path.
    if hasattr(cache, "activate_past_recording") and _past_recording_works():
        cache.activate_past_recording()
    return cache


@functools.cache
def _past_recording_works() -> bool:
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
_ROLLBACK_ERRORS = (AttributeError, NotImplementedError, RuntimeError, ValueError)


def _rewind(cache, n: int) -> None:
    """Roll `cache` back past its last `n` tokens (n >= 0); raises where that cannot be done (the session then
    starts a fresh cache and re-runs the kept tokens)."""
    if n:
        _crop(cache, n)
        return
    # crop(0) only trims what past recording kept (sliding-window and linear-attention layers); with nothing to roll
    # back, a cache that cannot do it loses nothing (e.g. a non-recording sliding-window layer past its window raises)
    with contextlib.suppress(*_ROLLBACK_ERRORS):
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


def _forward(
    model: torch.nn.Module, cache, ids: torch.Tensor, keep: int, hidden_out: list | None = None, call=None, **inputs
) -> torch.Tensor:
    """Feed `ids` (n,) after what `cache` holds; return logits of the last `keep` positions, (keep, vocab).

    hidden_out: a list to append the last layer's states of those positions to, (keep, hidden).
    call: what runs the forward (a compiled model.forward; default the model itself).
    inputs: encoder_outputs for an encoder-decoder (whose `ids` are then decoder tokens)."""
    kind = model_kind(model)
    if hidden_out is not None:
        inputs["output_hidden_states"] = True
    if kind.logits_to_keep:
        inputs["logits_to_keep"] = keep
    if kind.encoder_decoder:
        if "encoder_outputs" not in inputs:
            raise DiscoError(
                f"{type(model).__name__} is an encoder-decoder: drive it through TorchSession, "
                "which encodes the prompt once"
            )
        inputs["decoder_input_ids"] = ids.unsqueeze(0)
    else:
        inputs["input_ids"] = ids.unsqueeze(0)
    out = (call or model)(**inputs, **{kind.cache_arg: cache}, use_cache=cache is not None)
    if hidden_out is not None:
        states = out.decoder_hidden_states if kind.encoder_decoder else out.hidden_states
        hidden_out.append(states[-1][0, -keep:])
    return out.logits[0, -keep:]


class TorchSession:
    """One model's side of a decode: its KV cache and, for an encoder-decoder, the encoded prompt.

    The model's own token sequence is `prefix + output`: the prompt for a decoder-only model,
    [decoder start token] for an encoder-decoder. The loop speaks in prompt + output positions
    (`ids`); this class maps them onto the model's sequence. When a cache cannot be rolled back
    (crop fails), it is dropped and the kept tokens are re-run on the next forward (`recomputed`)."""

    def __init__(
        self,
        model: torch.nn.Module,
        prompt: torch.Tensor,
        use_cache: bool = True,
        hidden: bool = False,
        capacity: int | None = None,
        cache: str = "dynamic",
        static_cache=None,
        steps: CapturedSteps | None = None,
    ) -> None:
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
        # static_cache: one handed over by the engine (reused between decodes, emptied)
        self.cache = (
            static_cache if static_cache is not None else _new_cache(model, self._static_len) if use_cache else None
        )
        self.steps = steps  # captured steps (static caches only): feeds padded to their buckets
        self.length = (
            0  # tokens of the model's sequence in the cache (kept here: a static cache's own count is a tensor)
        )
        self.recomputed = 0  # tokens re-run because the cache could not be rolled back
        self.padded = 0  # filler tokens fed to pad a forward up to its bucket (captured steps)
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
        width = self.steps.bucket(len(tokens)) if self.steps is not None else None
        if width is None:
            logits = _forward(self.model, self.cache, tokens, keep, buf, **self.inputs)
            self.length += len(tokens) if self.cache is not None else 0
        else:
            # one captured shape per bucket: pad with the last token, keep every position (a constant
            # logits_to_keep), then drop the filler's logits and roll its cache entries back
            n, pad = len(tokens), width - len(tokens)
            fed = torch.cat([tokens, tokens[-1:].expand(pad)]) if pad else tokens
            rows = _forward(self.model, self.cache, fed, width, buf, self.steps.call, **self.inputs)
            logits = rows[n - keep : n].clone()  # a CUDA graph's outputs are overwritten by its next replay
            buf = [buf[0][n - keep : n].clone()] if buf else None
            self.length += width
            if pad:
                self.padded += pad
                self._roll_back(self.length - pad)
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
        if length <= self.length:
            self._roll_back(length)

    def _roll_back(self, length: int) -> None:
        """Keep the cache of the model's first `length` tokens (at most `self.length`)."""
        try:
            _rewind(self.cache, self.length - length)
            self.length = length
        except _ROLLBACK_ERRORS:
            # A cache type without a working crop (a custom or stateful cache): start a fresh one;
            # `unseen` then hands the next forward every kept token again.
            self.cache = _new_cache(self.model, self._static_len)
            self.steps = None  # captured steps belong to the engine's own cache
            self.recomputed += length
            self.length = 0


_ENGINES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class TorchEngine:
    """A transformers model as a disco engine (one per model: `TorchEngine.of(model)`)."""

    name = "torch"

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.cache = DEFAULT_CACHE  # the --cache choice (set_cache); resolved per decode, as the model may move
        self.steps: CapturedSteps | None = None  # set_compile: captured steps over self._static
        self._static = None  # with captured steps: the one static cache every decode reuses ...
        self._static_len = 0  # ... its positions ...
        self._holder: weakref.ref | None = None  # ... and the session using it now

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

    def set_compile(self, compile: bool | None, buckets: tuple[int, ...] = BUCKETS) -> TorchEngine:
        """Captured steps on (True), off (False) or auto (None: on where the cache resolves static on
        CUDA); they need the static cache."""
        cache = resolve_cache(self.model, self.cache)
        if compile and cache != "static":
            raise DiscoError(
                f"--compile needs static caches, but {type(self.model).__name__} runs on a dynamic "
                "one here: add --cache static (decoder-only models), or --no-compile"
            )
        on = cache == "static" and next(self.model.parameters()).device.type == "cuda" if compile is None else compile
        self.steps = CapturedSteps(self.model, buckets) if on else None
        self._static, self._static_len = None, 0
        return self

    def session(
        self, prompt: torch.Tensor, use_cache: bool = True, hidden: bool = False, capacity: int | None = None
    ) -> TorchSession:
        """capacity: prompt + output positions the decode can reach (a static cache is allocated for
        them; without it the cache is dynamic)."""
        cache = resolve_cache(self.model, self.cache) if capacity is not None and use_cache else "dynamic"
        if cache != "static" or self.steps is None:
            return TorchSession(self.model, prompt, use_cache, hidden, capacity, cache)
        state = TorchSession(
            self.model, prompt, use_cache, hidden, capacity, cache, self._reused_cache(capacity), self.steps
        )
        self._holder = weakref.ref(state)
        return state

    def _reused_cache(self, capacity: int):
        """The engine's static cache, emptied, when no live session holds it and it is large enough
        (else a new one, STATIC_ROUND-rounded, which then becomes the engine's: new graphs get captured)."""
        busy = self._holder is not None and self._holder() is not None  # e.g. one model as target and draft
        if busy or self._static is None or self._static_len < capacity:
            length = STATIC_ROUND * math.ceil(capacity / STATIC_ROUND)
            cache = _new_cache(self.model, length)
            # Allocate its tensors with one eager forward: allocated inside the first compiled step, they go
            # unmarked as static addresses (transformers marks them outside dynamo only), and CUDA graphs are
            # skipped for steps that mutate unmarked inputs, which is every step into a KV cache.
            _forward(self.model, cache, torch.zeros(1, dtype=torch.long, device=self.device), 1)
            cache.reset()
            if busy:
                return cache
            self._static, self._static_len = cache, length
        else:
            self._static.reset()
        return self._static

    @torch.inference_mode()  # as the decodes run: a graph compiled with grad mode on is never reused there
    def warm_up(self, capacity: int) -> float:
        """Compile (and on CUDA capture) every bucket's step for decodes of up to `capacity` positions,
        so that no measured decode pays for it; the seconds it took (0 without captured steps)."""
        if self.steps is None:
            return 0.0
        device = next(self.model.parameters()).device
        t0 = time.perf_counter()
        state = self.session(torch.zeros(1, dtype=torch.long, device=device), capacity=capacity)
        tokens = torch.zeros(max(self.steps.buckets), dtype=torch.long, device=device)
        for width in self.steps.buckets:
            for _ in range(3):  # CUDA graph trees record on a later call than the first
                state.forward(tokens[:width], 1)
                state.truncate(1)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

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
        return int(getattr(cfg, "hidden_size", None) or cfg.d_model)

    def describe(self) -> dict:
        return {
            "name": self.name,
            "version": torch.__version__,
            "cache": resolve_cache(self.model, self.cache),
            "captured_steps": list(self.steps.buckets) if self.steps is not None else None,
        }

    def check_pairable(self, draft: TorchEngine) -> None:
        check_compatible(self.model, draft.model)

    def pair_description(self, draft: TorchEngine) -> dict:
        # how the CPU computes the Linear layers (disco/cpu.py); int8 changes the numbers
        cpu = cpu_backend_of(self.model) if self.device.type == "cpu" else None
        return {"cpu_backend": cpu, "engine": self.describe()}

    def hardware_key(self, device: torch.device) -> str:
        hw = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu-{cpu_backend_of(self.model)}"
        if resolve_cache(self.model, self.cache) == "static":  # (dynamic keeps the name profiles had before)
            hw += "-static"
        return hw

    def spare(self) -> TorchEngine:
        """This engine: its sessions without a captured static cache each own their KV cache."""
        return self

    def anchors(self, pair, settings: dict) -> list[AssistedGeneration]:
        return [AssistedGeneration(pair)]

    def variants(self) -> list[Variant]:
        return []


# --- loading a pair on this engine ------------------------------------------------------------------

# T5's feed-forward reads its Linear layers' .weight (a dtype check), which the packed CPU backends
# (oneDNN, int8) do not keep: encoder-decoders on the CPU use the transposed backend instead of
# oneDNN (the same float32 math on the original weights; Pair.describe() records it).
_PACKED_CPU_BACKENDS = ("onednn", "int8")
ENCODER_DECODER_CPU_BACKEND = "transposed"


def load_pair(options: PairOptions) -> PairParts:
    """transformers models (ids, folders, GGUF files dequantised), or the embedded pair converted to
    safetensors; on the CPU both models' Linear layers use `cpu_backend` (disco/cpu.py); `cache`: their
    KV caches (CACHES); `compile`: captured steps, on, off or None = auto (TorchEngine.set_compile)."""
    target, draft, cpu_backend, cache = options.target, options.draft, options.cpu_backend, options.cache
    check_cache(cache)
    check_cpu_backend(cpu_backend)
    if target is None:
        target_dir, draft_dir = embedded.prepare_pair()
        target, draft = str(target_dir), str(draft_dir)
        names = embedded.pair_names()
    else:
        names = (target, draft)
    dev = resolve_device(options.device)
    dt = resolve_dtype(options.dtype, dev)
    target_tok = load_tokenizer(target)
    check_same_tokenizer(target_tok, load_tokenizer(draft), *names)
    configs = load_config(target), load_config(draft)
    kinds = [bool(getattr(c, "is_encoder_decoder", False)) for c in configs]
    if kinds[0] != kinds[1]:  # refuse before loading any weights
        role = lambda enc: "an encoder-decoder" if enc else "decoder-only"  # noqa: E731
        raise DiscoError(
            f"target {names[0]} is {role(kinds[0])} but draft {names[1]} is {role(kinds[1])}: "
            "pick a draft of the target's family"
        )
    check_cache(cache, kinds[0], names[0])  # before any weights load
    if kinds[0] and dev.type == "cpu" and cpu_backend in _PACKED_CPU_BACKENDS:
        if cpu_backend == "int8":
            raise DiscoError("--cpu-backend int8 does not support encoder-decoder models (T5): use transposed or eager")
        cpu_backend = ENCODER_DECODER_CPU_BACKEND
    target_model = load_model(target, dev, dt, configs[0])
    draft_model = load_model(draft, dev, dt, configs[1])
    if dev.type == "cpu":
        apply_cpu_backend(target_model, cpu_backend)
        apply_cpu_backend(draft_model, cpu_backend)
    for model in (target_model, draft_model):
        TorchEngine.of(model).set_cache(cache).set_compile(options.compile)
    return PairParts(
        target_model, draft_model, target_tok, names[0], names[1], dev, dt, eos_ids(target_model, target_tok)
    )


def _prepare_embedded(install: bool) -> dict:
    target_dir, draft_dir = embedded.prepare_pair(install=install)
    return {"target": target_dir, "draft": draft_dir}


def _check_device(device: str) -> None:
    pass  # CPUs and CUDA GPUs alike (pair loading resolves and checks the device)


HF_LABEL = "transformers"  # transformers' own generate(assistant_model=draft) with its defaults
KIND = EngineKind(
    load_pair,
    _prepare_embedded,
    claims_auto=lambda target, draft, cuda: True,
    check_device=_check_device,
    anchor_names=(HF_LABEL,),
    owned_options=(
        ("cache", "--cache"),
        ("cpu_backend", "--cpu-backend"),
        ("dtype", "--dtype"),
        ("compile", "--compile"),
    ),
    select_hint="--engine torch",
)


# --- the anchor: transformers' own assisted generation ------------------------------------------------


class _CallCounter:
    """Counts a module's forward calls (transformers' loop hides them from us)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.calls = 0
        self._handle = module.register_forward_hook(self._hook)

    def _hook(self, *_) -> None:
        self.calls += 1

    def close(self) -> None:
        self._handle.remove()


class AssistedGeneration:
    """transformers' target.generate(assistant_model=draft) with transformers' defaults (confidence
    threshold 0.4, adaptive when scikit-learn is installed, up to 20 draft tokens): greedy, or sampling
    from the distribution disco's loop samples (temperature, top-p, no top-k) seeded by config.seed."""

    label = HF_LABEL
    forwards_known = True  # counted by forward hooks

    def __init__(self, pair) -> None:
        self.pair = pair

    def start(self, stack: contextlib.ExitStack, progress: bool) -> None:
        pass  # nothing to start: it runs in this process

    def generate(self, prompt_ids: list[int], config, eos_token_ids: frozenset[int]) -> GenResult:
        pair = self.pair
        # transformers writes the adapted threshold back into the draft's generation config;
        # restore it so every prompt starts from the defaults, as a fresh user would.
        saved = copy.deepcopy(pair.draft.generation_config)
        counters = (_CallCounter(pair.target), _CallCounter(pair.draft))
        ids = torch.tensor([prompt_ids], device=pair.device)
        sampling = (
            {"do_sample": True, "temperature": config.temperature, "top_p": config.top_p, "top_k": 0}
            if config.temperature > 0
            else {"do_sample": False}
        )
        try:
            torch.manual_seed(config.seed)
            sync(pair.device)
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = pair.target.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    assistant_model=pair.draft,
                    **sampling,
                    max_new_tokens=config.max_new_tokens,
                    eos_token_id=sorted(eos_token_ids),
                    pad_token_id=pair.tokenizer.pad_token_id,
                )
            sync(pair.device)
            wall = time.perf_counter() - t0
        finally:
            for c in counters:
                c.close()
            pair.draft.generation_config = saved
        # a decoder-only output repeats the prompt; an encoder-decoder's starts with the decoder start token
        tokens = out[0, 1 if pair.target.config.is_encoder_decoder else len(prompt_ids) :].tolist()
        stats = GenStats(
            new_tokens=len(tokens),
            wall_s=wall,
            target_forwards=counters[0].calls - 1,
            draft_forwards=counters[1].calls - 1,
        )  # minus prefill
        return GenResult(tokens, stats)
