"""tests/tiny_gguf.py: the tiny Qwen2 written as GGUF runs in llama.cpp and loads in transformers
with the same logits and the same tokenization as the in-process model and char_tokenizer()."""

from __future__ import annotations

from pathlib import Path

import llama_cpp
import numpy as np
import pytest
import torch
from tiny import CHARS, EOS, VOCAB, char_tokenizer, tiny_pair
from tiny_gguf import write_tiny_gguf
from transformers import AutoModelForCausalLM, AutoTokenizer

TEXTS = [
    "Hello, World! 123\nfoo_bar(baz) = {'q': 4.5};  x\n\n  y?",
    "def f(x):\n    return x * 2  # double it\n",
    CHARS,
]
TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
EXTRA = ["hello", "<think>", "ab"]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("gguf")
    target, draft = tiny_pair()  # the draft's noise also makes norms and biases non-trivial
    tok = char_tokenizer()
    return {
        "target": (target, write_tiny_gguf(target, tok, root / "target.gguf", chat_template=TEMPLATE)),
        "draft": (draft, write_tiny_gguf(draft, tok, root / "draft.gguf")),
        "extra": (draft, write_tiny_gguf(draft, tok, root / "extra" / "draft.gguf", extra_tokens=EXTRA)),
    }


def _llama(path: Path, f32_kv: bool = True) -> llama_cpp.Llama:
    # llama.cpp keeps its KV cache in F16 by default, which alone costs ~1e-3 in the logits here.
    kv = dict(type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32) if f32_kv else {}
    # One thread: the model is tiny, and on a busy 2-core machine two OpenMP threads wait on each
    # other (the first batch then takes ~0.6 s instead of ~10 ms).
    return llama_cpp.Llama(
        model_path=str(path), n_ctx=256, logits_all=True, verbose=False, n_threads=1, n_threads_batch=1, **kv
    )


def _reference(model: torch.nn.Module, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].double().numpy()


def _same_choices(got: np.ndarray, ref: np.ndarray, gap: float) -> None:
    """Identical argmax wherever the reference's top two are further apart than `gap` (twice the
    largest logit error: closer ones are honest ties at this precision)."""
    top2 = np.sort(ref, axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > gap
    assert clear.mean() > 0.9
    assert (got.argmax(-1) == ref.argmax(-1))[clear].all()


@pytest.mark.parametrize("name", ["target", "draft"])
@pytest.mark.parametrize("f32_kv,tol", [(True, 1e-4), (False, 1e-2)])
def test_llama_cpp_logits_match_transformers(files, name, f32_kv, tol):
    model, path = files[name]
    ids = char_tokenizer()(TEXTS[0] + TEXTS[1]).input_ids
    llm = _llama(path, f32_kv)
    try:
        llm.eval(ids)
        got = np.array(llm.scores[: len(ids)], dtype=np.float64)
    finally:
        llm.close()
    ref = _reference(model, ids)
    assert got.shape == ref.shape == (len(ids), VOCAB)
    assert np.abs(got - ref).max() < tol * np.abs(ref).max()
    _same_choices(got, ref, gap=2 * np.abs(got - ref).max())


def test_llama_cpp_tokenizer_matches_char_tokenizer(files):
    tok = char_tokenizer()
    llm = _llama(files["target"][1])
    try:
        assert llm.n_vocab() == VOCAB and llm.token_eos() == EOS
        for text in TEXTS:
            ids = llm.tokenize(text.encode(), add_bos=False, special=False)
            assert ids == tok(text).input_ids
            assert llm.detokenize(ids).decode() == text
        assert llm.tokenize(b"ab<eos>", add_bos=True, special=True) == [*tok("ab").input_ids, EOS]
        assert llm.metadata["tokenizer.chat_template"] == TEMPLATE
    finally:
        llm.close()


def test_transformers_tokenizer_from_gguf(files):
    tok, path = char_tokenizer(), files["target"][1]
    gtok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for text in TEXTS:
        ids = gtok(text).input_ids
        assert ids == tok(text).input_ids
        assert gtok.decode(ids) == text
    assert (gtok.eos_token_id, gtok.pad_token_id, gtok.unk_token_id) == (EOS, tok.pad_token_id, tok.unk_token_id)
    assert gtok.decode([EOS, 3, 4, tok.pad_token_id], skip_special_tokens=True) == tok.decode([3, 4])
    assert gtok.chat_template == TEMPLATE
    # Every id the model knows means the same token. (transformers' GGUF byte-level builder also
    # appends "<|endoftext|>" after them when a vocabulary lacks it, so len(gtok) == VOCAB + 1.)
    assert [gtok.decode([i]) for i in range(VOCAB)] == [tok.decode([i]) for i in range(VOCAB)]


def test_transformers_model_from_gguf(files):
    model, path = files["draft"]
    gmodel = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    assert not gmodel.config.tie_word_embeddings and gmodel.config.eos_token_id == EOS
    ids = char_tokenizer()(TEXTS[0]).input_ids
    got, ref = _reference(gmodel, ids), _reference(model, ids)
    assert np.abs(got - ref).max() < 1e-4 * np.abs(ref).max()


def test_extra_tokens_make_a_different_vocabulary(files):
    model, path = files["extra"]
    tok = char_tokenizer()
    gtok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    llm = _llama(path)
    try:
        assert llm.n_vocab() == VOCAB + len(EXTRA)
        assert [llm.detokenize([VOCAB + i]).decode() for i in range(len(EXTRA))] == EXTRA
        # Text without the extra tokens keeps its ids; text with them now tokenizes differently,
        # the same way in llama.cpp and transformers.
        assert gtok(TEXTS[1]).input_ids == tok(TEXTS[1]).input_ids
        text = "say hello <think>abc</think>"
        ids = gtok(text).input_ids
        assert ids == llm.tokenize(text.encode(), add_bos=False, special=False)
        assert ids != tok(text).input_ids and set(ids) >= {VOCAB, VOCAB + 1, VOCAB + 2}
        assert gtok.decode(ids) == text
        # The padded rows leave the original logits alone and give the new tokens logit 0.
        ids = tok(TEXTS[0]).input_ids
        llm.eval(ids)
        got = np.array(llm.scores[: len(ids)], dtype=np.float64)
    finally:
        llm.close()
    ref = _reference(model, ids)
    assert np.abs(got[:, :VOCAB] - ref).max() < 1e-4 * np.abs(ref).max()
    assert np.abs(got[:, VOCAB:]).max() < 1e-6


def test_extra_tokens_must_be_plain_ascii(tmp_path):
    target, _ = tiny_pair()
    with pytest.raises(ValueError, match="printable ASCII"):
        write_tiny_gguf(target, char_tokenizer(), tmp_path / "x.gguf", extra_tokens=["two words"])
