"""The llama.cpp engine: GGUF files run natively through llama-cpp-python's C API.

One llama_model + one llama_context per model; a session is the context's KV cache for one
decode (a new session clears it). forward() is one llama_decode over the new tokens with
logits requested for the last `keep`; rollback is llama_memory_seq_rm past the kept length.

Losslessness (docs/architecture.md, "Engines"). llama.cpp's CPU kernels depend on the batch width (weight
repacking, micro-batches, llamafile's sgemm), so a target forward over k+1 tokens need not
round like k+1 one-token steps, and a greedy argmax can flip. Two verification modes:

    exact  every forward is split into llama_decode calls no wider than the model's exact width:
           the widest batch whose logits are bit-identical to one-token steps, found once per
           model by a probe (`exact_width`: batches of 4, 3, 2 against one-token decoding of the
           same tokens; 1 when none matches). The kernels are chosen by the shapes of a batch, not
           by its values, which is why one probe speaks for every input (the slow test and compare
           check it on real prompts). For the embedded Q4_K_M pair with weight
           repacking (llama.cpp's default) it is 3: the repacked matmul computes rows in groups
           of four with a gemm kernel and the rest with the gemv kernel one-token decoding uses
           (measured over 96 positions: widths 2 and 3 bit-identical, 4 differs by up to 0.56 and
           flips an argmax). Greedy output then equals target-only decoding bit for bit, at the
           price of the batching gain: each gemv row re-reads the weights, so on a 2-core CPU
           verify(k) costs nearly k one-token steps (bench/results/llamacpp.md, "llama.cpp engine").
    fast   one batched llama_decode per verification (what llama.cpp's own speculative
           decoding does): cheapest, but its output may differ from target-only decoding;
           compare reports the mismatch.

The mode is recorded in describe() (traces, profiles, artifacts, compare results). The library itself (import,
build, backend) and the GGUF files (magic check, re-quantized drafts) are disco.engines.llamacpp.llamacpp_lib's.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from disco.base.defaults import (
    DEFAULT_CACHE,
    DEFAULT_N_BATCH,
    DEFAULT_N_CTX,
    DEFAULT_REPACK,
    DEFAULT_VERIFY,
    DRAFT_QUANT_CHOICES,
    VERIFY_MODES,
)
from disco.base.errors import DiscoError
from disco.base.machine import usable_cores
from disco.base.options import PairOptions
from disco.engines.base import EngineKind, PairParts, Variant
from disco.engines.llamacpp.llamacpp_batch import LlamaCppBatchedDraft
from disco.engines.llamacpp.llamacpp_lib import (
    DRAFT_QUANTS,
    EMBEDDED_DRAFT_QUANT,
    build_features,
    build_id,
    init_backend,
    is_gguf,
    llama_cpp_module,
    requantized,
)
from disco.engines.llamacpp.llamacpp_repack import RepackChoice, choose
from disco.sources import embedded
from disco.sources.hub import check_same_tokenizer, gguf_tokenizer, load_tokenizer

EXACT_PROBE_WIDTHS = (4, 3, 2)  # batch widths the exact-width probe tries, widest first
_PROBE_PREFIX, _PROBE_TOKENS = 16, 12  # the probe: 12 tokens after 16 cached ones
# llama.cpp attends over the KV cells in use padded to 256 (llama-kv-cache.cpp, n_pad_cur), and picks its
# attention kernel by that count: from 512 cells a one-token step splits the cells across threads and merges
# the parts (ggml-cpu ops.cpp, use_split_kv_path), which a batch of 2+ tokens never does. So the probed
# exact width holds only for batches ending inside the first 256 cells, where the probe ran; past them
# exact verification feeds one token at a time, what target-only decoding does (module docstring).
EXACT_SPAN = 256


def probe_command(path: Path, threads: int) -> list[str]:
    """The child process that tries repacking on `path` (llamacpp_repack.probe; the entry at the end)."""
    import sys

    return [sys.executable, "-m", "disco.engines.llamacpp.llamacpp", "probe-repack", str(path), str(threads)]


class LlamaCppEngine:
    """A GGUF model loaded by llama.cpp, as a disco engine."""

    name = "llama.cpp"
    device = torch.device("cpu")

    def __init__(
        self,
        path: str | Path,
        threads: int | None = None,
        verify: str = DEFAULT_VERIFY,
        n_ctx: int = DEFAULT_N_CTX,
        n_batch: int = DEFAULT_N_BATCH,
        repack: str | RepackChoice = DEFAULT_REPACK,
        n_ubatch: int | None = None,
    ) -> None:
        """repack: llama.cpp's weight repacking into CPU-friendly layouts (its default, faster), as a
        mode (auto, on, off: llamacpp_repack.choose) or a choice already made;
        n_ubatch: llama.cpp's micro-batch (default n_batch): both change how batches round."""
        path = Path(path).expanduser()
        if not path.is_file():
            raise DiscoError(f"no such GGUF file: {path} (check the path)")
        if not is_gguf(path):
            raise DiscoError(
                f"{path} is not a GGUF file (no GGUF header): the llama.cpp engine runs GGUF models; "
                "use --engine torch for a transformers model folder"
            )
        if verify not in VERIFY_MODES:
            raise DiscoError(f"unknown verification mode {verify!r}: choose one of {', '.join(VERIFY_MODES)}")
        threads = usable_cores() if threads is None else threads  # llama.cpp scales with cores
        if threads < 1:
            raise DiscoError(f"--threads must be at least 1 (got {threads})")
        lc = llama_cpp_module()
        init_backend(lc)
        self._lc, self.path, self.threads, self.verify = lc, path, threads, verify
        if not isinstance(repack, RepackChoice):
            repack = choose(repack, path, build_id(lc), probe_command(path, threads))
        self.repack_choice, self.repack = repack, repack.repack

        mparams = lc.llama_model_default_params()
        mparams.use_extra_bufts = self.repack
        self._model = lc.llama_model_load_from_file(str(path).encode(), mparams)
        if not self._model:
            raise DiscoError(
                f"llama.cpp could not load {path}: the file is damaged or its architecture is not "
                "supported by this llama.cpp (set DISCO_LLAMA_LOG=1 to see its log)"
            )
        self._vocab = lc.llama_model_get_vocab(self._model)
        self._n_vocab = lc.llama_vocab_n_tokens(self._vocab)
        self.n_ctx = min(n_ctx, lc.llama_model_n_ctx_train(self._model) or n_ctx)
        self.n_batch = min(n_batch, self.n_ctx)
        self.n_ubatch = min(n_ubatch or self.n_batch, self.n_batch)
        try:
            self._ctx = self.new_context(1)
        except DiscoError:
            lc.llama_model_free(self._model)
            raise
        self._mem = lc.llama_get_memory(self._ctx)
        self._batch = lc.llama_batch_init(self.n_batch, 0, 1)
        self._session_id = 0  # a new session invalidates the older ones (they share the one KV cache)
        self._exact_width: int | None = None  # found by the probe on first use (exact_width)

    def new_context(self, n_seq: int) -> ctypes.c_void_p:
        """A llama.cpp context on this model holding `n_seq` sequences of up to n_ctx positions each (the
        caller frees it with llama_free). Their KV cells are one pool (kv_unified): with a stream per sequence
        llama.cpp splits a batch into micro-batches of consecutive seq_ids holding equally many tokens each
        (llama-batch.cpp, split_equal), so a position where some requests stopped, or a catch-up of unequal
        lengths, would run several forwards; a unified pool takes any batch in one (a sequence's attention masks
        the others' cells)."""
        cparams = self._lc.llama_context_default_params()
        cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = self.n_ctx * n_seq, self.n_batch, self.n_ubatch
        cparams.n_seq_max, cparams.kv_unified = n_seq, True
        cparams.n_threads = cparams.n_threads_batch = self.threads
        cparams.no_perf = True
        ctx = self._lc.llama_init_from_model(self._model, cparams)
        if not ctx:
            raise DiscoError(
                f"llama.cpp could not create a context for {self.path} ({n_seq} x {self.n_ctx} positions): "
                "out of memory? lower the context"
            )
        return ctx

    def close(self) -> None:
        if getattr(self, "_ctx", None):
            self._lc.llama_batch_free(self._batch)
            self._lc.llama_free(self._ctx)
            self._lc.llama_model_free(self._model)
            self._ctx = self._model = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may already be gone
            pass

    # --- facts ---------------------------------------------------------------------------------

    @property
    def context_length(self) -> int:
        return self.n_ctx

    @property
    def vocab_size(self) -> int:
        return self._n_vocab

    @property
    def hidden_size(self) -> int:
        return int(self._lc.llama_model_n_embd(self._model))

    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as text (None if absent)."""
        buf = ctypes.create_string_buffer(512)
        n = self._lc.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    @property
    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        self._lc.llama_model_desc(self._model, buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    def eog_ids(self) -> frozenset[int]:
        """Every token llama.cpp ends generation on (EOS, EOT, <|im_end|>, …): what llama-server stops at."""
        return frozenset(t for t in range(self._n_vocab) if self._lc.llama_vocab_is_eog(self._vocab, t))

    def warm_up(self, capacity: int) -> float:
        """Nothing to compile: llama.cpp's kernels are built ahead of time."""
        return 0.0

    def describe(self) -> dict:
        return {
            "name": self.name,
            "version": self._lc.__version__,
            "threads": self.threads,
            "quantization": self.description,
            "verify": self.verify,
            "repack": self.repack,
            "repack_reason": self.repack_choice.reason,
            "build": build_features(self._lc),
            "n_ubatch": self.n_ubatch,
            **({"exact_width": self.exact_width} if self.verify == "exact" else {}),
        }

    def check_pairable(self, draft: LlamaCppEngine) -> None:
        pass  # two GGUF files sharing a vocabulary (load_pair checks it): nothing else to line up

    def pair_description(self, draft: LlamaCppEngine) -> dict:
        # the draft's file may be re-quantized: its numbers are its own (describe() would probe its exact width)
        return {"cpu_backend": None, "engine": {**self.describe(), "draft_quantization": draft.description}}

    def hardware_key(self, device: torch.device) -> str:
        # threads, verification mode and repacking change the costs (repacked: the key it always had)
        return f"llama.cpp-{self.threads}t-{self.verify}" + ("" if self.repack else "-norepack")

    def anchors(self, pair, settings: dict) -> list:
        from disco.engines.llamacpp.llamacpp_server import server_anchors

        return server_anchors(self, pair.draft, settings.get("server_tuned"))

    def spare(self) -> LlamaCppEngine:
        """Another context on the same file: a llama.cpp context holds one KV cache, so concurrent
        sessions (one per request in vLLM's proposer) each need their own (the weights are mmapped)."""
        return LlamaCppEngine(
            self.path, self.threads, self.verify, self.n_ctx, self.n_batch, self.repack_choice, self.n_ubatch
        )

    def batched_draft(self, seqs: int) -> LlamaCppBatchedDraft:
        """Many requests' drafts on this model, one llama_decode per call for all of them (serving)."""
        return LlamaCppBatchedDraft(self, seqs)

    def variants(self) -> list[Variant]:
        """In exact verification, compare also runs the tuned rules and the bound verifying in batches."""
        return [Variant(FAST_SUFFIX, lambda pair: verify_mode(pair, "fast"))] if self.verify == "exact" else []

    @property
    def exact_width(self) -> int:
        """The widest llama_decode batch whose logits equal one-token steps bit for bit (module docstring)."""
        if self._exact_width is None:
            self._exact_width = self._probe_exact_width()
        return self._exact_width

    def _probe_exact_width(self) -> int:
        """Decode a fixed token sequence one token at a time, then in batches of each candidate width,
        after the same cached prefix; keep the widest whose logits match exactly. Uses (and clears)
        the KV cache: retires any open session."""
        g = torch.Generator().manual_seed(0)
        n = _PROBE_PREFIX + _PROBE_TOKENS
        toks = torch.randint(0, self._n_vocab, (n,), generator=g).tolist()
        if n > self.n_ctx:
            return 1
        self._session_id += 1  # the probe owns the cache now
        self._lc.llama_memory_clear(self._mem, True)
        self._decode(toks[:_PROBE_PREFIX], 0, 0)
        ref = torch.cat([self._decode([t], _PROBE_PREFIX + i, 1)[0] for i, t in enumerate(toks[_PROBE_PREFIX:])])
        best = 1
        for width in EXACT_PROBE_WIDTHS:
            self._remove_from(_PROBE_PREFIX)
            rows = [
                self._decode(toks[i : i + width], i, len(toks[i : i + width]))[0]
                for i in range(_PROBE_PREFIX, n, width)
            ]
            if torch.equal(torch.cat(rows), ref):
                best = width
                break
        self._lc.llama_memory_clear(self._mem, True)
        return best

    # --- running -------------------------------------------------------------------------------

    def session(
        self, prompt: torch.Tensor, use_cache: bool = True, hidden: bool = False, capacity: int | None = None
    ) -> LlamaCppSession:
        """A decode from an empty KV cache. use_cache and capacity are accepted for the interface: a
        llama.cpp context always has its cache, of n_ctx positions fixed at load, and a fresh session
        starts it empty. hidden: also output the last layer's states (llama.cpp's per-token
        embeddings, after the final norm)."""
        if self.verify == "exact":
            self.exact_width  # noqa: B018 -- probe once, before the session owns the cache
        self._session_id += 1
        self._lc.llama_memory_clear(self._mem, True)
        self._lc.llama_set_embeddings(self._ctx, hidden)
        return LlamaCppSession(self, self._session_id, [int(t) for t in prompt.tolist()], hidden)

    def _decode(
        self, tokens: list[int], start: int, keep: int, hidden: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed `tokens` at positions start.. in one llama_decode: (keep, vocab) logits of the last `keep`,
        and with `hidden` (a context with embeddings on) their (keep, n_embd) last-layer states."""
        b, n = self._batch, len(tokens)
        for i, t in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0] = t, start + i, 1, 0
            b.logits[i] = i >= n - keep
        b.n_tokens = n
        rc = self._lc.llama_decode(self._ctx, b)
        if rc != 0:
            raise DiscoError(
                f"llama.cpp could not decode {n} tokens at position {start} (code {rc}): the KV cache "
                f"of {self.n_ctx} positions is full? shorten the prompt or lower --max-new-tokens"
            )
        if keep == 0:
            return torch.empty(0, self._n_vocab), None
        states = None
        if hidden:  # the states of the same output rows
            emb = self._lc.llama_get_embeddings(self._ctx)
            n_embd = self._lc.llama_model_n_embd(self._model)
            states = torch.from_numpy(np.ctypeslib.as_array(emb, shape=(keep, n_embd)).copy())
        ptr = self._lc.llama_get_logits(self._ctx)
        return torch.from_numpy(np.ctypeslib.as_array(ptr, shape=(keep, self._n_vocab)).copy()), states

    def _remove_from(self, length: int) -> None:
        self._lc.llama_memory_seq_rm(self._mem, 0, length, -1)


class LlamaCppSession:
    """One decode on a LlamaCppEngine: its KV cache holds the first `length` tokens of prompt + output."""

    recomputed = 0  # rollback always works: llama.cpp removes KV cells by position
    padded = 0  # no captured steps: every forward is as wide as its tokens

    def __init__(self, engine: LlamaCppEngine, session_id: int, prompt: list[int], want_hidden: bool = False) -> None:
        self.engine, self._id, self.n_prompt = engine, session_id, len(prompt)
        self.prompt = prompt
        self.length = 0
        self.want_hidden = want_hidden  # keep the last layer's states of every forward (hidden())
        self._hidden_rows: list[torch.Tensor] = []  # hidden states of the last forward's kept rows

    def _check(self) -> None:
        if self._id != self.engine._session_id:
            raise DiscoError(
                "this llama.cpp session was replaced by a newer one on the same model "
                "(one decode at a time per loaded model)"
            )

    def unseen(self, ids: torch.Tensor) -> torch.Tensor:
        return ids[self.length :]

    def prefill(self) -> None:
        if self.n_prompt > 1:
            self.forward(torch.tensor(self.prompt[:-1]), 0)

    def forward(self, tokens: torch.Tensor, keep: int) -> torch.Tensor:
        self._check()
        toks = [int(t) for t in tokens.tolist()]
        if self.length + len(toks) > self.engine.n_ctx:
            raise DiscoError(
                f"the sequence ({self.length + len(toks)} tokens) exceeds the llama.cpp context of "
                f"{self.engine.n_ctx} tokens: shorten the prompt or lower --max-new-tokens"
            )
        # The prompt (but its pending last token) is always fed in batches, as prefill() does; after
        # it, exact mode feeds batches narrow enough to round like target-only decoding's one-token steps.
        self._hidden_rows = []
        n_prefix = max(0, min(len(toks), self.n_prompt - 1 - self.length))
        rows = self._feed(toks[:n_prefix], max(0, keep - (len(toks) - n_prefix)), False)
        rows += self._feed(toks[n_prefix:], min(keep, len(toks) - n_prefix), self.engine.verify == "exact")
        return torch.cat(rows) if rows else torch.empty(0, self.engine.vocab_size)

    def _width(self, exact: bool) -> int:
        """Tokens the next llama_decode may take: n_batch, or in exact verification the probed exact width
        while the batch ends inside the first EXACT_SPAN cache cells, where the probe ran, and one past them."""
        if not exact:
            return self.engine.n_batch
        return max(1, min(self.engine.exact_width, EXACT_SPAN - self.length))

    def _feed(self, toks: list[int], keep: int, exact: bool) -> list[torch.Tensor]:
        """Decode `toks` in chunks as wide as _width allows; the logits of the last `keep`, one tensor per chunk
        that has any (and their hidden states in self._hidden_rows when the session wants them)."""
        rows = []
        i = 0
        while i < len(toks):
            chunk = toks[i : i + self._width(exact)]
            want = min(len(chunk), max(0, keep - (len(toks) - i - len(chunk))))  # of the last `keep`
            out, states = self.engine._decode(chunk, self.length, want, self.want_hidden)
            self.length += len(chunk)
            i += len(chunk)
            if want:
                rows.append(out)
                if states is not None:
                    self._hidden_rows.append(states)
        return rows

    def hidden(self) -> torch.Tensor | None:
        """(keep, hidden) last-layer states of the last forward's kept positions (sessions opened with hidden=True)."""
        return torch.cat(self._hidden_rows) if self._hidden_rows else None

    def truncate(self, n_ids: int) -> None:
        self._check()
        if n_ids < self.length:
            self.engine._remove_from(n_ids)
            self.length = n_ids


# --- loading a pair on this engine ------------------------------------------------------------------

FAST_SUFFIX = " (fast verify)"  # compare's rows of a variant in fast verification


def load_pair(options: PairOptions) -> PairParts:
    """Two GGUF files on the llama.cpp engine; with neither given, the embedded pair's GGUFs.
    Token ids come from the transformers tokenizer read from the GGUF (cached), as on torch.
    draft_quant: run the draft re-quantized (DRAFT_QUANTS), "none" as it is, or "auto": the embedded
    draft in EMBEDDED_DRAFT_QUANT, any other draft as it is."""
    target, draft, draft_quant = options.target, options.draft, options.draft_quant
    if options.cache != DEFAULT_CACHE or options.compile:
        flag = f"--cache {options.cache}" if options.cache != DEFAULT_CACHE else "--compile"
        raise DiscoError(
            f"{flag} is for the torch engine: llama.cpp keeps its own KV cache and kernels (drop "
            f"{flag.split()[0]}, or add --engine torch)"
        )
    if draft_quant not in DRAFT_QUANT_CHOICES:
        raise DiscoError(f"unknown --draft-quant {draft_quant!r}: choose auto, none or {', '.join(DRAFT_QUANTS)}")
    llama_cpp_module()  # a missing install fails here, before any file work
    if target is None:
        target_path, draft_path, tok_dir = embedded.prepare_gguf_pair()
        names = embedded.pair_names()
        target_tok = draft_tok = load_tokenizer(str(tok_dir))
    else:
        names = (target, draft)
        target_path, draft_path = Path(target).expanduser(), Path(draft).expanduser()
        for role, path in (("target", target_path), ("draft", draft_path)):
            if not path.is_file():
                raise DiscoError(f"--engine llama.cpp needs GGUF files: the {role} {path} is not a file")
            if not is_gguf(path):
                raise DiscoError(
                    f"the {role} {path} is not a GGUF file (no GGUF header): the llama.cpp engine "
                    "runs GGUF models; use --engine torch for transformers models"
                )
        target_tok, draft_tok = gguf_tokenizer(target_path), gguf_tokenizer(draft_path)
    check_same_tokenizer(target_tok, draft_tok, *names)
    if draft_quant == "auto":
        draft_quant = EMBEDDED_DRAFT_QUANT if target is None else "none"
    if draft_quant != "none":
        draft_path = requantized(draft_path, draft_quant)
    t_engine = LlamaCppEngine(target_path, options.threads, options.verify, repack=options.repack)
    d_engine = LlamaCppEngine(draft_path, options.threads, options.verify, repack=options.repack)
    if t_engine.vocab_size != d_engine.vocab_size:
        raise DiscoError(
            f"target {names[0]} has {t_engine.vocab_size} tokens but draft {names[1]} has "
            f"{d_engine.vocab_size}: pick a draft from the target's model family"
        )
    # What llama.cpp ends generation on (EOS, EOT, <|im_end|>, ...) plus the tokenizer's EOS:
    # target-only decoding, every policy and llama-server then stop at the same tokens.
    eos = t_engine.eog_ids() | ({target_tok.eos_token_id} if target_tok.eos_token_id is not None else set())
    return PairParts(t_engine, d_engine, target_tok, names[0], names[1], t_engine.device, torch.float32, frozenset(eos))


@contextlib.contextmanager
def verify_mode(pair, verify: str) -> Iterator[None]:
    """Run both engines of `pair` in another verification mode for the duration."""
    engines = [pair.target, pair.draft]
    saved = [e.verify for e in engines]
    for e in engines:
        e.verify = verify
    try:
        yield
    finally:
        for e, v in zip(engines, saved):
            e.verify = v


def _prepare_embedded(install: bool) -> dict:
    target, draft, tokenizer = embedded.prepare_gguf_pair(install=install)
    return {"target": target, "draft": draft, "tokenizer": tokenizer}


def _claims_auto(target: str | None, draft: str | None, cuda: bool) -> bool:
    """GGUF files (the embedded pair included) on the CPU."""
    gguf = target is None or all(str(s).endswith(".gguf") for s in (target, draft) if s is not None)
    return gguf and not cuda


def _check_device(device: str) -> None:
    if device == "cuda":
        raise DiscoError(
            "--engine llama.cpp runs on the CPU (llama-cpp-python is built for it here): "
            "use --engine torch for --device cuda"
        )


KIND = EngineKind(
    load_pair,
    _prepare_embedded,
    _claims_auto,
    _check_device,
    anchor_names=("llama-server",),
    owned_options=(
        ("verify", "--verify"),
        ("draft_quant", "--draft-quant"),
        ("threads", "--threads"),
        ("repack", "--repack"),
    ),
    select_hint="--engine llama.cpp with GGUF files",
)


def _probe_repack_child(path: str, threads: int) -> None:
    """The child of llamacpp_repack.probe: load `path` with repacking on, decode a batch and a one-token step
    (the two kernel paths), print whether the logits are finite. A crash kills only this process."""
    engine = LlamaCppEngine(path, threads, verify="fast", repack=RepackChoice(True, "probe"))
    batch, _ = engine._decode(list(range(8)), 0, 8)
    step, _ = engine._decode([8], 8, 1)
    print("finite" if bool(torch.isfinite(batch).all() and torch.isfinite(step).all()) else "non-finite")


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 4 or sys.argv[1] != "probe-repack":
        sys.exit("usage: python -m disco.engines.llamacpp.llamacpp probe-repack FILE.gguf THREADS")
    _probe_repack_child(sys.argv[2], int(sys.argv[3]))
