"""llama-server (llama.cpp's own draft-model speculative decoding) on a tiny GGUF pair.

The binary is built once from the pinned llama-cpp-python sdist (minutes; `make install` does
not build it, the first run of this file does) and cached; after that these tests take seconds.
A failed build fails the tests with the build's message: it is never a skip."""

from __future__ import annotations

import pytest
import torch
from tiny import EOS, char_tokenizer, tiny_pair
from tiny_gguf import write_tiny_gguf

from disco.base.defaults import LLAMA_SERVER_DRAFT_N_MAX
from disco.base.errors import DiscoError
from disco.engines.llamacpp.llamacpp_server import LlamaServer, server_binary

PROMPTS = ["def add(a, b):\n    return", "Hello, world! The quick brown fox", "x = [1, 2, 3]"]
MAX_NEW = 24
CTX = 256  # tiny_qwen's max_position_embeddings


@pytest.fixture(scope="module")
def binary():
    try:
        return server_binary(build=True, progress=True)
    except DiscoError as e:  # a failure, with the build's message, not a skip
        pytest.fail(f"llama-server could not be built: {e}")


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory):
    target, draft = tiny_pair(noise=0.3, dtype=torch.float32)
    tok = char_tokenizer()
    folder = tmp_path_factory.mktemp("gguf")
    return write_tiny_gguf(target, tok, folder / "target.gguf"), write_tiny_gguf(draft, tok, folder / "draft.gguf")


@pytest.fixture(scope="module")
def prompts():
    tok = char_tokenizer()
    return [tok.encode(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def reference(binary, ggufs, prompts):
    """Greedy target-only decoding by the same binary: what speculation must reproduce."""
    with LlamaServer(ggufs[0], binary=binary, threads=1, ctx=CTX) as srv:
        assert not srv.speculative and srv.spec_config() is None
        return [srv.complete(p, MAX_NEW) for p in prompts]


def test_target_only(reference):
    for r in reference:
        assert 0 < len(r["tokens"]) <= MAX_NEW
        assert r["draft_n"] is None and r["draft_n_accepted"] is None and r["spec"] is None
        assert r["predicted_n"] == len(r["tokens"])
        assert r["wall_s"] > 0 and r["predicted_ms"] > 0
        assert r["stop_type"] in ("eos", "limit")
        assert (r["stop_type"] == "eos") == (r["tokens"][-1] == EOS)  # EOS is kept, as in our loop


def test_speculative_reproduces_target(binary, ggufs, prompts, reference):
    with LlamaServer(*ggufs, binary=binary, threads=1, ctx=CTX) as srv:
        assert srv.spec_config() == {"n_max": LLAMA_SERVER_DRAFT_N_MAX, "n_min": 0, "p_min": 0.0}
        for p, ref in zip(prompts, reference):
            r = srv.complete(p, MAX_NEW)
            assert r["tokens"] == ref["tokens"]
            assert len(r["tokens"]) <= MAX_NEW
            assert r["prompt_n"] == len(p)  # cache_prompt=false: the whole prompt, every time
            # p_min=0: a draft every step; a perturbed draft agrees part of the time.
            assert r["draft_n"] > 0
            assert 0 <= r["draft_n_accepted"] <= r["draft_n"]
        assert srv.restarts == 0


def test_per_request_settings_restart_the_server(binary, ggufs, prompts, reference):
    with LlamaServer(*ggufs, binary=binary, threads=1, ctx=CTX, n_max=6) as srv:
        loose = srv.complete(prompts[0], MAX_NEW)
        assert srv.restarts == 0 and loose["spec"]["n_max"] == 6
        # p_min above any probability: the draft stops before its first token, so nothing is drafted.
        strict = srv.complete(prompts[0], MAX_NEW, p_min=1.5)
        assert srv.restarts == 1 and strict["spec"] == {"n_max": 6, "n_min": 0, "p_min": 1.5}
        assert strict["draft_n"] == 0 and strict["draft_n_accepted"] == 0
        assert strict["tokens"] == loose["tokens"] == reference[0]["tokens"]
        srv.complete(prompts[0], 4, p_min=1.5)  # same settings: no restart
        assert srv.restarts == 1


def test_budget_caps_tokens_and_drafts(binary, ggufs, prompts, reference):
    with LlamaServer(*ggufs, binary=binary, threads=1, ctx=CTX, n_max=8) as srv:
        for budget in (1, 2, 5):
            r = srv.complete(prompts[1], budget)
            assert r["tokens"] == reference[1]["tokens"][:budget]


def test_errors(binary, ggufs, tmp_path, monkeypatch):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf")
    with pytest.raises(DiscoError, match="exited with code"):
        LlamaServer(bad, binary=binary, threads=1, startup_timeout_s=60).start()
    with pytest.raises(DiscoError, match="not found"):
        LlamaServer(tmp_path / "missing.gguf")
    with LlamaServer(ggufs[0], binary=binary, threads=1, ctx=CTX) as srv:
        with pytest.raises(DiscoError, match="does not fit"):
            srv.complete([5] * 200, 100)
    monkeypatch.setenv("DISCO_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(DiscoError, match="python -m disco.engines.llamacpp.llamacpp_build"):
        server_binary(build=False)
