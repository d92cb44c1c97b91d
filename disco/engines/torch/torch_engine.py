"""The torch engine: transformers models (decoder-only and encoder-decoder), dynamic or static KV caches.

What differs between model families lives in the engine, not in the loop: its model kinds, caches and captured
steps in disco.engines.torch.torch_engine_cache, the sessions, the engine, its pair loader and its anchor here. Rollback
is a cache crop; a cache type without a working crop is rebuilt and the kept tokens are re-run (`recomputed`).

Two caches (`TorchEngine.cache`, `--cache`): transformers' DynamicCache grows by concatenation and
crops by slicing; a StaticCache is preallocated for the whole decode (prompt + budget) and
position-indexed, so rolling back only moves its length (stale entries past it are overwritten by
the next forward and, until then, hidden by the causal mask). That length is the cache's own counter
(the engine passes no positions: the model reads them, and the mask its offset, from the cache), so
rolling back moves the counter, through StaticLayer.crop where transformers has it (5.24 on) and
in place where it does not (5.16 to 5.23: `torch_engine_cache.rewind`). Static is what captured CUDA graphs
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
import math
import time
import weakref

import torch

from disco.base.defaults import DEFAULT_CACHE
from disco.base.errors import DiscoError
from disco.base.options import PairOptions
from disco.core.stats import GenResult, GenStats
from disco.engines.base import EngineKind, PairParts, Variant, sync
from disco.engines.torch.cpu_backends import apply_cpu_backend, check_cpu_backend, cpu_backend_of
from disco.engines.torch.torch_engine_cache import (
    BUCKETS,
    ROLLBACK_ERRORS,
    STATIC_ROUND,
    CapturedSteps,
    check_cache,
    check_compatible,
    model_kind,
    new_cache,
    resolve_cache,
    rewind,
)
from disco.sources import embedded
from disco.sources.hub import (
    check_same_tokenizer,
    eos_ids,
    load_config,
    load_model,
    load_tokenizer,
    resolve_device,
    resolve_dtype,
)


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
            static_cache if static_cache is not None else new_cache(model, self._static_len) if use_cache else None
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
            rewind(self.cache, self.length - length)
            self.length = length
        except ROLLBACK_ERRORS:
            # A cache type without a working crop (a custom or stateful cache): start a fresh one;
            # `unseen` then hands the next forward every kept token again.
            self.cache = new_cache(self.model, self._static_len)
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
            cache = new_cache(self.model, length)
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
        # how the CPU computes the Linear layers (disco/engines/torch/cpu_backends.py); int8 changes the numbers
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

    def batched_draft(self, seqs: int) -> None:
        """None: each request drafts on its own session (its own cache), one after another."""
        return None

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
    safetensors; on the CPU both models' Linear layers use `cpu_backend` (disco/engines/torch/cpu_backends.py); `cache`: their
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
