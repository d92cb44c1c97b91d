"""Tiny models for offline tests: random-weight transformers models built in-process, a
character-level tokenizer, and stub models with fixed logits."""

from __future__ import annotations

import copy
import string
from pathlib import Path

import torch
from transformers import DynamicCache, PretrainedConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

CHARS = string.ascii_letters + string.digits + string.punctuation + " \n"
SPECIALS = ["<pad>", "<eos>", "<unk>"]
VOCAB = len(SPECIALS) + len(CHARS)
EOS = 1


def char_tokenizer(chat_template: str | None = None) -> PreTrainedTokenizerFast:
    """A character-level tokenizer (one token per character) with pad/eos/unk."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(SPECIALS + list(CHARS))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    if chat_template:
        fast.chat_template = chat_template
    return fast


def tiny_qwen(seed: int = 0, dtype: torch.dtype = torch.float64, layers: int = 2) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=EOS,
        pad_token_id=0,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(cfg).to(dtype).eval()
    # Random init gives near-uniform logits; sharpen them so greedy choices are far from ties.
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    return model


def perturbed(model: torch.nn.Module, noise: float, seed: int = 1, by_name: bool = False) -> torch.nn.Module:
    """A draft that agrees with `model` part of the time: the same weights plus noise, drawn in the order the
    model registers its parameters, or in name order (by_name: the same draft whatever order a transformers
    version registers them in)."""
    g = torch.Generator().manual_seed(seed)
    draft = copy.deepcopy(model)
    params = sorted(draft.named_parameters(), key=lambda item: item[0]) if by_name else draft.named_parameters()
    with torch.no_grad():
        for _, p in params:
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * noise * p.std().clamp_min(1e-3))
    return draft


def tiny_vllm_qwen(seed: int = 0, vocab: int = 384) -> Qwen2ForCausalLM:
    """A float32 Qwen2 vLLM's CPU attention takes (head size 64)."""
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,  # head size 64
        num_key_value_heads=2,
        max_position_embeddings=1024,
        eos_token_id=EOS,
        pad_token_id=0,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(cfg).float().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)  # far from ties: greedy choices are stable in float32
    return model


def tiny_pair(noise: float = 0.3, seed: int = 0, dtype: torch.dtype = torch.float64):
    target = tiny_qwen(seed, dtype)
    return target, perturbed(target, noise, seed + 1)


def save_tiny(model: torch.nn.Module, tokenizer, folder: Path) -> Path:
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def save_char_tiny(model: torch.nn.Module, folder: Path) -> Path:
    """The model with the character-level tokenizer."""
    return save_tiny(model, char_tokenizer(), folder)


def _output(logits: torch.Tensor, keep: int, positions: list[int], hidden: bool):
    """The model output the engine reads: logits of the last `keep` positions, and with `hidden` a
    2-dim "last hidden state" per position (its absolute position and the top logit)."""
    out = {"logits": logits[:, -keep:]}
    if hidden:
        states = torch.stack([torch.tensor(positions, dtype=torch.float32), logits[0].max(-1).values.float()], 1)
        out["hidden_states"] = (states.unsqueeze(0),)
    return type("Out", (), out)()


class StubLM(torch.nn.Module):
    """A causal LM with fixed logits: after token t at absolute position i it predicts
    rule(t, i) with probability `confidence(i)`; the rest of the mass is spread evenly.

    It keeps a real DynamicCache of dummy tensors so the loop's cache bookkeeping is exercised,
    and logs (cache length before the call, number of tokens fed) for every call."""

    def __init__(self, rule, vocab: int = 16, confidence=lambda i: 0.9) -> None:
        super().__init__()
        self.config = PretrainedConfig(num_hidden_layers=1, max_position_embeddings=4096, hidden_size=2)
        self.rule, self.vocab, self.confidence = rule, vocab, confidence
        self.dummy = torch.nn.Parameter(torch.zeros(1))
        self.calls: list[tuple[int, int]] = []

    def forward(self, input_ids, cache, use_cache=True, logits_to_keep=0, output_hidden_states=False):
        start = cache.get_seq_length()
        n = input_ids.shape[1]
        self.calls.append((start, n))
        cache.update(torch.zeros(1, 1, n, 1), torch.zeros(1, 1, n, 1), 0)
        logits = torch.empty(1, n, self.vocab)
        for j in range(n):
            pos = start + j
            c = self.confidence(pos)
            probs = torch.full((self.vocab,), (1 - c) / (self.vocab - 1))
            probs[self.rule(int(input_ids[0, j]), pos)] = c
            logits[0, j] = probs.log()
        return _output(logits, logits_to_keep or n, list(range(start, start + n)), output_hidden_states)


class DistStubLM(StubLM):
    """A stub whose next-token distribution depends only on the absolute position: dist(pos)."""

    def __init__(self, dist, vocab: int) -> None:
        super().__init__(rule=lambda t, i: 0, vocab=vocab)
        self.dist = dist

    def forward(self, input_ids, cache, use_cache=True, logits_to_keep=0, output_hidden_states=False):
        start = cache.get_seq_length()
        n = input_ids.shape[1]
        cache.update(torch.zeros(1, 1, n, 1), torch.zeros(1, 1, n, 1), 0)
        logits = torch.stack([self.dist(start + j).log() for j in range(n)]).unsqueeze(0)
        return _output(logits, logits_to_keep or n, list(range(start, start + n)), output_hidden_states)


POSITION_VOCAB = 12  # the position stubs' vocabulary


class PositionStub(DistStubLM):
    """DistStubLM that also runs without a cache, as the collector's teacher-forced forward calls it."""

    def forward(self, input_ids, cache=None, use_cache=True, logits_to_keep=0, output_hidden_states=False):
        return super().forward(
            input_ids, DynamicCache() if cache is None else cache, use_cache, logits_to_keep, output_hidden_states
        )


def position_stub_pair() -> tuple[PositionStub, PositionStub]:
    """Distributions that depend on the position only: teacher-forced features equal the live ones
    even after a mismatch, so every policy must simulate exactly."""
    g = torch.Generator().manual_seed(0)
    t_logits = torch.randn(200, POSITION_VOCAB, generator=g) * 3
    d_logits = t_logits + torch.randn(200, POSITION_VOCAB, generator=g) * 2.5
    return (
        PositionStub(lambda i: torch.softmax(t_logits[i], -1), POSITION_VOCAB),
        PositionStub(lambda i: torch.softmax(d_logits[i], -1), POSITION_VOCAB),
    )
