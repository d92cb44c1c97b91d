"""Many requests' drafts on one llama.cpp model: one sequence per request, one llama_decode per call for all.

vLLM's side-engine proposer (side.DiscoProposer) drafts for every running request each step. With one
context per request it ran one draft forward per request per position, so a step's drafting grew linearly
with the requests. Here each request is a sequence (seq_id) of a shared context and each call is one
llama_decode over every sequence that has tokens to feed:

    draft = engine.batched_draft(seqs)     # contexts of `seqs` sequences each, made as requests come
    rows = draft.feed({key: tokens, ...})   # append to each key's sequence; {key: (vocab,) logits of its last}
    draft.length(key)                        # tokens its sequence holds
    draft.truncate(key, n)                   # keep its first n (a window vLLM rejected)
    draft.remove(key)                        # the request left: its sequence's cells and id are free again

A catch-up feed (a new request's prompt, the tokens vLLM accepted since the last window) is chunked by
n_batch tokens in all, so a prompt is prefilled in batches, as a session's prefill is. The sequences of a
context share one pool of KV cells (kv_unified: LlamaCppEngine.new_context says why), n_ctx cells per sequence.

The logits of a sequence equal a one-sequence session's on the same tokens up to the batch width's rounding
(llama.cpp's kernels depend on the batch's shape, engines/llamacpp/llamacpp.py): the draft never changes vLLM's
output, only what it proposes (tests/test_vllm.py states the tolerance).
"""

from __future__ import annotations

import ctypes
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from disco.base.errors import DiscoError


class _Model(Protocol):
    """What the batched draft reads of the llama.cpp engine it runs on (engines.llamacpp.llamacpp.LlamaCppEngine, which
    imports this module: a protocol here, not that class, keeps the import one-way)."""

    _lc: Any  # the llama_cpp module (its low-level API)
    n_batch: int
    n_ctx: int

    @property
    def vocab_size(self) -> int: ...

    @property
    def hidden_size(self) -> int: ...

    def new_context(self, n_seq: int) -> ctypes.c_void_p: ...


@dataclass
class _Context:
    """One llama.cpp context of the batched draft and the sequence ids it has free."""

    ctx: ctypes.c_void_p
    mem: ctypes.c_void_p
    batch: object  # llama_batch of n_batch tokens
    free: list[int] = field(default_factory=list)
    hidden: bool = False  # embeddings (last-layer states) output on


class LlamaCppBatchedDraft:
    """Sequences keyed by the caller (vLLM's request ids) on contexts of `seqs` sequences each."""

    def __init__(self, engine: _Model, seqs: int) -> None:
        self.engine, self.seqs = engine, seqs
        self._lc = engine._lc
        self._contexts: list[_Context] = []  # made when all sequences are taken, kept (bounded by the peak)
        self._seq: dict[Hashable, tuple[_Context, int]] = {}  # key -> its context and seq_id
        self._length: dict[Hashable, int] = {}  # key -> tokens its sequence holds

    def close(self) -> None:
        for c in self._contexts:
            self._lc.llama_batch_free(c.batch)
            self._lc.llama_free(c.ctx)
        self._contexts, self._seq, self._length = [], {}, {}

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may already be gone
            pass

    def __len__(self) -> int:
        return len(self._seq)

    def length(self, key: Hashable) -> int:
        return self._length.get(key, 0)

    def truncate(self, key: Hashable, n: int) -> None:
        """Keep the first n tokens of key's sequence (nothing to do for a key without one)."""
        if key in self._seq and n < self._length[key]:
            c, seq = self._seq[key]
            self._lc.llama_memory_seq_rm(c.mem, seq, n, -1)
            self._length[key] = n

    def remove(self, key: Hashable) -> None:
        """Drop key's sequence: its cells and its seq_id are free for the next request."""
        if key in self._seq:
            c, seq = self._seq.pop(key)
            del self._length[key]
            self._lc.llama_memory_seq_rm(c.mem, seq, -1, -1)
            c.free.append(seq)

    def _place(self, key: Hashable) -> tuple[_Context, int]:
        """key's context and seq_id, given one (a free id, or a new context) at its first feed."""
        if key not in self._seq:
            c = next((c for c in self._contexts if c.free), None)
            if c is None:
                ctx = self.engine.new_context(self.seqs)
                c = _Context(ctx, self._lc.llama_get_memory(ctx), self._lc.llama_batch_init(self.engine.n_batch, 0, 1))
                c.free = list(range(self.seqs - 1, -1, -1))
                self._contexts.append(c)
            self._seq[key], self._length[key] = (c, c.free.pop()), 0
        return self._seq[key]

    def feed(
        self, tokens: Mapping[Hashable, Sequence[int]], hidden: bool = False
    ) -> dict[Hashable, tuple[torch.Tensor, torch.Tensor | None]]:
        """Append tokens[key] to each key's sequence (a new key starts one) in one llama_decode per context
        (more where they exceed n_batch tokens); returns {key: ((vocab,) logits after its last token, its
        (n_embd,) last-layer state with `hidden`, else None)}."""
        by_context: dict[int, list[tuple[Hashable, int, list[int]]]] = {}
        for key, toks in tokens.items():
            if not len(toks):
                continue
            c, seq = self._place(key)
            if self._length[key] + len(toks) > self.engine.n_ctx:
                raise DiscoError(
                    f"a draft sequence ({self._length[key] + len(toks)} tokens) exceeds the llama.cpp context of "
                    f"{self.engine.n_ctx} tokens: lower vLLM's --max-model-len"
                )
            by_context.setdefault(id(c), []).append((key, seq, [int(t) for t in toks]))
        out: dict[Hashable, tuple[torch.Tensor, torch.Tensor | None]] = {}
        for items in by_context.values():
            out.update(self._decode(self._seq[items[0][0]][0], items, hidden))
        return out

    def _decode(
        self, c: _Context, items: list[tuple[Hashable, int, list[int]]], hidden: bool
    ) -> dict[Hashable, tuple[torch.Tensor, torch.Tensor | None]]:
        """One context's feed: every (key, seq, tokens) laid out in order, decoded in chunks of n_batch tokens;
        logits requested at each sequence's last token only."""
        lc, n_vocab = self._lc, self.engine.vocab_size
        if c.hidden != hidden:
            lc.llama_set_embeddings(c.ctx, hidden)
            c.hidden = hidden
        flat = [
            (key, seq, self._length[key] + i, t, i == len(toks) - 1)
            for key, seq, toks in items
            for i, t in enumerate(toks)
        ]
        out: dict[Hashable, tuple[torch.Tensor, torch.Tensor | None]] = {}
        b, n_batch = c.batch, self.engine.n_batch
        for start in range(0, len(flat), n_batch):
            chunk = flat[start : start + n_batch]
            for i, (_, seq, pos, t, last) in enumerate(chunk):
                b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0], b.logits[i] = t, pos, 1, seq, last
            b.n_tokens = len(chunk)
            rc = lc.llama_decode(c.ctx, b)
            if rc != 0:
                raise DiscoError(f"llama.cpp could not decode a batched draft of {len(chunk)} tokens (code {rc})")
            for i, (key, _, _, _, last) in enumerate(chunk):
                if last:  # (llama.cpp's output rows, read by batch index)
                    logits = np.ctypeslib.as_array(lc.llama_get_logits_ith(c.ctx, i), shape=(n_vocab,))
                    states = None
                    if hidden:
                        emb = lc.llama_get_embeddings_ith(c.ctx, i)
                        states = torch.from_numpy(np.ctypeslib.as_array(emb, shape=(self.engine.hidden_size,)).copy())
                    out[key] = (torch.from_numpy(logits.copy()), states)
        for key, _, toks in items:
            self._length[key] += len(toks)
        return out
