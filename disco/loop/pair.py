"""A draft/target pair: two models sharing one tokenizer, on one engine, device and dtype.

Models load from a Hugging Face model id, a local folder, or a GGUF file, on the engine the options
name or `--engine auto` picks (loop/engine_registry.py; each engine loads its own pairs). With no model
given, the embedded Qwen2.5-Coder pair is prepared (once) and loaded from the local cache.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from disco.base.options import PairOptions
from disco.engines.base import PairParts
from disco.loop.engine_registry import as_engine, load_parts
from disco.sources.hub import encode_prompt, eos_ids, tokenizer_hash
from disco.sources.pair_files import PAIR_CONFIG_KEYS, apply_pair_file, load_pair_config

__all__ = ["PAIR_CONFIG_KEYS", "Pair", "apply_pair_file", "load_pair", "load_pair_config", "pair_from_models"]


@dataclass
class Pair(PairParts):
    """The loaded pair (PairParts' fields) and what every stage asks of it."""

    def token_classes(self) -> torch.Tensor:
        """(vocab,) class index of every token (features.token_class_table), on the device; built once."""
        if getattr(self, "_token_classes", None) is None:
            from disco.core.features import token_class_table

            self._token_classes = token_class_table(self.tokenizer, self.vocab_size).to(self.device)
        return self._token_classes

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    @property
    def context_length(self) -> int:
        return min(as_engine(self.target).context_length, as_engine(self.draft).context_length)

    @property
    def vocab_size(self) -> int:
        """Width of the draft's logits (heads may be padded past the tokenizer's length)."""
        return as_engine(self.draft).vocab_size or len(self.tokenizer)

    @property
    def draft_hidden_size(self) -> int:
        """Width of the draft's last hidden state (a policy's `needs_hidden` input)."""
        return as_engine(self.draft).hidden_size

    @property
    def target_engine(self):
        return as_engine(self.target)

    @property
    def engine_name(self) -> str:
        return self.target_engine.name

    def encode(self, prompt: str | list[dict], chat: bool | None = None) -> list[int]:
        """Token ids of a prompt: the chat template for instruct models (default when the
        tokenizer has one), else `tokenizer(prompt)` exactly as the tokenizer does by default."""
        return encode_prompt(self.tokenizer, prompt, self.has_chat_template if chat is None else chat)

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def warm_up(self, capacity: int) -> float:
        """Compile (and capture) both models' steps before anything is timed (torch --compile), for decodes
        reaching `capacity` positions: the seconds it took, 0 when there is nothing to compile."""
        return sum(as_engine(m).warm_up(capacity) for m in (self.target, self.draft))

    def describe(self) -> dict:
        # the engine's own record: name, version, and what changes its numbers (cpu backend, quantization, ...)
        own = self.target_engine.pair_description(as_engine(self.draft))
        return {
            "target": self.target_name,
            "draft": self.draft_name,
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "tokenizer_hash": tokenizer_hash(self.tokenizer),
            "cpu_backend": own["cpu_backend"],
            "engine": own["engine"],
        }


def load_pair(options: PairOptions = PairOptions()) -> Pair:
    """Load the pair `options` describe (loop.engine_registry.load_parts); with neither model given, the
    embedded Qwen2.5-Coder pair."""
    parts = load_parts(options)
    return Pair(*(getattr(parts, f.name) for f in fields(parts)))


def pair_from_models(target: torch.nn.Module, draft: torch.nn.Module, tokenizer, name: str = "in-memory") -> Pair:
    """A Pair around transformers models already in memory (tests, notebooks, the transformers drop-in)."""
    param = next(target.parameters())
    names = [
        getattr(m.config, "_name_or_path", "") or f"{name}:{role}" for m, role in ((target, "target"), (draft, "draft"))
    ]
    return Pair(target, draft, tokenizer, names[0], names[1], param.device, param.dtype, eos_ids(target, tokenizer))
