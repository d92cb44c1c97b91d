"""The transformers drop-in: run disco's loop inside `model.generate()`.

    from disco.hf import disco_generate

    out = target.generate(**inputs, max_new_tokens=128,
                          custom_generate=disco_generate(draft, "models/embedded-qwen2.5-coder", tokenizer))

transformers 5.x has no public hook for a per-token draft stopping rule (stopping_criteria given
to the target are not forwarded to the assistant), but `custom_generate=callable` is public:
generate() prepares the inputs and the generation config, then hands the decoding loop to the
callable. Ours runs disco's speculative loop with the chosen policy. The draft is bound to the
callable because generate() does not hand `assistant_model` on to a custom_generate callable. Greedy output is identical to
`target.generate(**inputs, do_sample=False)`; with do_sample=True, temperature and top_p are used
and rejection sampling keeps the target's distribution (other logits processors are not applied).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from disco.base.errors import DiscoError
from disco.loop.decode import DecodeConfig, speculative_generate, target_generate
from disco.loop.pair import eos_ids, pair_from_models
from disco.policies.policy import DEFAULT_MAX_WINDOW
from disco.policies.policy_registry import PolicySpec


def disco_generate(
    draft: torch.nn.Module | None,
    classifier: str | Path | None = None,
    tokenizer=None,
    *,
    policy: PolicySpec | None = None,
    max_window: int = DEFAULT_MAX_WINDOW,
) -> Callable:
    """A `custom_generate` callable drafting with `draft` under the trained classifier (artifact
    folder) or any PolicySpec; draft=None decodes with the target alone.

    tokenizer: the pair's tokenizer (the classifier's token-class features need it)."""
    if (classifier is None) == (policy is None):
        raise DiscoError("give a classifier artifact folder or a PolicySpec (not both)")
    spec = policy or PolicySpec("classifier", classifier=str(classifier))
    if spec.kind.needs_pair and tokenizer is None:
        raise DiscoError(f"the {spec.name} policy needs the tokenizer: disco_generate(path, tokenizer)")
    if spec.kind.needs_target_tokens:
        raise DiscoError(f"the {spec.name} policy needs the target's output in advance: use disco compare")

    def custom_generate(
        model,
        input_ids: torch.Tensor,
        logits_processor=None,
        stopping_criteria=None,
        generation_config=None,
        **model_kwargs,
    ) -> torch.Tensor:
        if input_ids.shape[0] != 1:
            raise DiscoError("disco's speculative loop decodes one sequence at a time: pass a batch of 1")
        if model.config.is_encoder_decoder:
            raise DiscoError("the drop-in covers decoder-only models; use disco generate for encoder-decoders")
        mask = model_kwargs.get("attention_mask")
        if mask is not None and not bool(mask.all()):
            raise DiscoError("padded inputs are not supported: pass the prompt without padding")
        prompt = input_ids[0].tolist()
        max_new = (
            generation_config.max_new_tokens
            if generation_config.max_new_tokens is not None
            else generation_config.max_length - len(prompt)
        )
        sampling = bool(generation_config.do_sample)
        config = DecodeConfig(
            max_new_tokens=max_new,
            max_window=max_window,
            temperature=float(generation_config.temperature or 1.0) if sampling else 0.0,
            top_p=float(generation_config.top_p or 1.0) if sampling else 1.0,
        )
        eos = set(_as_list(generation_config.eos_token_id)) or set(eos_ids(model, tokenizer) if tokenizer else ())
        if draft is None:
            res = target_generate(model, prompt, config, eos)
        else:
            pair = pair_from_models(model, draft, tokenizer)
            policy = spec.build(pair=pair, max_window=max_window, sampling=(config.temperature, config.top_p))
            res = speculative_generate(model, draft, prompt, policy, config, eos)
        custom_generate.last_stats = res.stats  # the run's stats, for whoever wants them
        return torch.cat([input_ids, torch.tensor([res.tokens], dtype=input_ids.dtype, device=input_ids.device)], 1)

    custom_generate.last_stats = None
    return custom_generate


def _as_list(value) -> list[int]:
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        return [int(v) for v in value.flatten().tolist()]
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]
