"""The GPU probe's models (disco.gpu_probe.measure): random-weight causal LMs in a shape pair's exact
configurations (configs/shapes/*.json), shrunk with --tiny, and the noise pair (a target and, as its draft,
the same weights plus noise calibrated to an acceptance rate). Step costs and losslessness do not depend
on the weights' values, so nothing heavy travels."""

from __future__ import annotations

import copy
import inspect
import json
import time
from pathlib import Path

import torch

from disco.loop.decode import target_generate

# --tiny: the same families and configurations, shrunk (CPU tests)
TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 512,
    "max_position_embeddings": 16384,
}
TINY_DRAFT = {
    **TINY,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}  # smaller than the tiny target, as a draft is: shapes of its own
LOGIT_STD = 4.0  # random models' logits are scaled to this spread: a top-1 probability near 0.5, not uniform
AGREEMENT = 0.7  # the noise pair's draft agrees with the target on about this share of tokens
NOISES = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0)  # relative noise levels tried, smallest first


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Clock:
    def __init__(self, budget_s: float) -> None:
        self.t0, self.budget = time.monotonic(), budget_s

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> float:
        return self.budget - self.elapsed()


class IdsTokenizer:
    """What `disco profile` and a Pair read of a tokenizer, for random-weight models that have none:
    token ids for the profiling context, no vocabulary, no special tokens."""

    bos_token_id = eos_token_id = pad_token_id = unk_token_id = None
    chat_template = None

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    def __call__(self, text: str) -> dict:
        return {"input_ids": [3 + (ord(c) * 131 + 7 * i) % (self.vocab - 3) for i, c in enumerate(text)]}

    def __len__(self) -> int:
        return self.vocab

    def get_vocab(self) -> dict:
        return {}

    def decode(self, ids, **kwargs) -> str:
        return ""


class TokenClasses:
    """Stands for the pair in ClassifierPolicy.for_pair: a token class table (random models have no text)."""

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table

    def token_classes(self) -> torch.Tensor:
        return self.table


# --- models ---------------------------------------------------------------------------------------


def check_transformers() -> str | None:
    """Why this transformers cannot run disco's torch engine, or None."""
    import transformers
    from transformers import Qwen2ForCausalLM

    params = inspect.signature(Qwen2ForCausalLM.forward).parameters
    if "cache" not in params and "past_key_values" not in params:  # the two keywords model_kind knows
        return (
            f"transformers {transformers.__version__}: Qwen2's forward takes neither cache= nor past_key_values=, "
            "the KV cache keywords disco's torch engine knows (transformers >= 5.16.1, pyproject.toml)"
        )
    return None


def load_shapes(path: Path) -> dict:
    shapes = json.loads(path.read_text())
    for role in ("target", "draft"):
        if "config" not in shapes.get(role, {}):
            raise SystemExit(f"{path}: no {role}.config")
    return shapes


def build_model(
    config: dict, device: torch.device, dtype: torch.dtype, seed: int, tiny: dict | None = None
) -> torch.nn.Module:
    """A causal LM of this configuration with random weights, its logits scaled to LOGIT_STD; `tiny`:
    fields that shrink it (TINY, TINY_DRAFT)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = {k: v for k, v in config.items() if k not in ("model_type", "architectures")}
    cfg.update(tiny or {})
    cfg.update(eos_token_id=None, bos_token_id=None, pad_token_id=None)  # random models: no EOS stops
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(config["model_type"], **cfg), dtype=dtype)
    model.eval()
    with torch.inference_mode():
        probe = torch.randint(3, model.config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(seed))
        std = float(model(input_ids=probe.to(device)).logits.float().std())
        model.get_decoder().norm.weight.mul_(LOGIT_STD / max(std, 1e-6))  # the final norm scales the logits
    return model


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def noisy_copy(model: torch.nn.Module, noise: float, seed: int) -> torch.nn.Module:
    """The same weights plus Gaussian noise of `noise` times each tensor's spread."""
    draft = copy.deepcopy(model)
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.inference_mode():
        for p in draft.parameters():
            spread = p.float().std().clamp_min(1e-3) if p.numel() > 1 else torch.tensor(1e-3, device=device)
            p.add_((torch.randn(p.shape, generator=gen, device=device) * noise * spread).to(p.dtype))
    return draft


@torch.inference_mode()
def agreement(
    target: torch.nn.Module, draft: torch.nn.Module, prompts: list[list[int]], outputs: list[list[int]]
) -> float:
    """Share of positions of the target's greedy outputs where the draft, teacher-forced, predicts the same token."""
    same = total = 0
    device = next(target.parameters()).device
    for p, y in zip(prompts, outputs):
        ids = torch.tensor(p + y, device=device).unsqueeze(0)
        pred = draft(input_ids=ids).logits[0, len(p) - 1 : -1].argmax(-1).tolist()
        same += sum(a == b for a, b in zip(pred, y))
        total += len(y)
    return same / max(total, 1)


def calibrate_noise(target, prompts, cfg, seed: int, fixed: float | None) -> tuple[torch.nn.Module, dict]:
    """The noise pair's draft: the noise level whose agreement is nearest AGREEMENT (or `fixed`)."""
    outputs = [target_generate(target, p, cfg).tokens for p in prompts]
    tried, best = {}, None
    for noise in (fixed,) if fixed is not None else NOISES:
        draft = noisy_copy(target, noise, seed)
        tried[noise] = agreement(target, draft, prompts, outputs)
        if best is None or abs(tried[noise] - AGREEMENT) < abs(tried[best[0]] - AGREEMENT):
            best = (noise, draft)
        else:
            del draft
        if tried[noise] < AGREEMENT - 0.2:
            break  # agreement falls with noise: larger levels only fall further
    return best[1], {"chosen": best[0], "agreement": tried[best[0]], "tried": tried}
