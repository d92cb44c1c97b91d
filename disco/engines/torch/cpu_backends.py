"""CPU backends: how the Linear layers of a model on the CPU compute x @ Wᵀ.

A decode step of a 1–2 B model on a CPU is memory-bound: it reads every Linear weight once.
Verifying k draft tokens reads the same weights, so it should cost about one step. With
PyTorch's default `F.linear` it does not: MKL's sgemm takes a slow path for 2–16 rows (a
1.5B target verifies 8 tokens at ~4x the cost of one; see bench/results/torch-cpu.md, "CPU backends").
A backend swaps each `nn.Linear` of a loaded model for a module of ours with the same
interface (what torch.ao's quantize_dynamic does); transformers' code is not touched.

    eager       F.linear, as loaded (the reference numerics)
    transposed  (W @ xᵀ)ᵀ on the same weights: a faster MKL path for a few rows
    onednn      weights prepacked once for oneDNN (float32, same math as eager up to rounding)
    int8        int8 weights (per output channel) and int8 activations (per token): ~4x fewer
                bytes per step, but different numerics — a different target

Float32 backends change only rounding (logits within ~1e-4 of eager); `int8` changes what the
model computes, so Pair.describe() records the backend in every trace and artifact manifest.
Greedy speculative decoding stays lossless under every backend relative to the same backend's
target-only decoding. For float32 this is the usual "up to last-bit rounding" (a batched
forward rounds a little differently from one-token steps, eager included). int8 would amplify
those last bits into whole-logit differences (a flipped rounding of a quantised activation), so
it makes verify(k) bit-identical to k decode steps: every token is quantised with its own scale
(never one shared across the batch) and attention runs one query row at a time through a
function registered with transformers' AttentionInterface (its public extension point).

Memory: `onednn` and `int8` replace each weight by a repacked copy one layer at a time and
drop the original, so at most one extra layer is held while converting.

Threads and the machine: disco/base/machine.py; load profiles: disco/core/load_profiles.py.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from disco.base.defaults import CPU_BACKENDS, DEFAULT_CPU_BACKEND
from disco.base.errors import DiscoError

FLOAT32_EXACT = ("eager", "transposed", "onednn")  # same math as eager up to float rounding


class TransposedLinear(nn.Module):
    """y = (W @ xᵀ)ᵀ + b: the same product as F.linear, on the same weight tensor."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        if self.bias is None:
            y = torch.mm(self.weight, x2.t())
        else:
            y = torch.addmm(self.bias.unsqueeze(1), self.weight, x2.t())
        return y.t().reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class OneDNNLinear(nn.Module):
    """F.linear with the weight reordered once into oneDNN's blocked layout (float32).

    The packed weight is an opaque mkldnn tensor kept as a plain attribute (not a parameter or
    buffer): it is not in state_dict() and does not move with .to(); this module is for inference
    on the CPU only."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach().contiguous())
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Int8Linear(nn.Module):
    """Dynamic int8 linear (fbgemm): int8 weights with one scale per output channel; the input
    is quantised per row (per token), so a row's output never depends on the other rows.

    fbgemm quantises its whole input with one scale taken from the input's min and max. We
    divide each row by its own max |x| (rows then lie in [-1, 1]) and append one row holding
    -1 and +1, so the input's min and max — hence fbgemm's scale and zero point — are the same
    constants for every call; the row scale is multiplied back afterwards."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach().float()
        scale = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12).double()
        zero = torch.zeros(w.shape[0], dtype=torch.long)
        with warnings.catch_warnings():  # quantized tensors are deprecated but fbgemm's prepack needs one
            warnings.simplefilter("ignore")
            qw = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)
        self.packed = torch.ops.quantized.linear_prepack(qw, None)
        del qw
        self.bias = (
            None if linear.bias is None else nn.Parameter(linear.bias.detach().float().clone(), requires_grad=False)
        )
        anchor = torch.zeros(1, self.in_features)
        anchor[0, 0], anchor[0, -1] = -1.0, 1.0
        self.register_buffer("anchor", anchor, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        row_max = x2.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
        y = torch.ops.quantized.linear_dynamic(torch.cat([x2 / row_max, self.anchor]), self.packed, True)
        y = y[:-1] * row_max
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


ROWWISE_ATTENTION = "disco_rowwise"  # the attention the int8 backend registers with transformers


def _is_plain_causal(mask: torch.Tensor | None, q_len: int, kv_len: int) -> bool:
    """Is this attention mask (batch 1) just "every query sees the cache and itself, causally"?"""
    if mask is None:
        return True
    if mask.dim() != 4 or mask.shape[0] != 1 or mask.shape[-2:] != (q_len, kv_len):
        return False
    visible = mask if mask.dtype == torch.bool else mask == 0
    causal = (
        torch.arange(kv_len, device=mask.device) <= torch.arange(kv_len - q_len, kv_len, device=mask.device)[:, None]
    )
    return bool((visible == causal).all())


def rowwise_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """SDPA one query row at a time, each row exactly as a one-token decode step computes it.

    A transformers attention function (AttentionInterface): query (b, heads, q, d), key/value
    (b, kv_heads, kv, d) holding the cache plus the q new tokens; returns (b, q, heads, d).
    Batched attention over k new tokens rounds differently from k one-token steps; with int8
    activations those last-bit differences flip quantisation steps and grow to whole logits,
    so verification would disagree with decoding. Per row, verify(k) is bit-identical to k
    decode steps. Anything but one unpadded sequence falls back to transformers' sdpa."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    b, heads, q_len, d = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    if (
        b != 1
        or dropout
        or kwargs.get("sliding_window") is not None
        or kwargs.get("softcap") is not None
        or kwargs.get("position_bias") is not None
        or not _is_plain_causal(attention_mask, q_len, kv_len)
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    out = query.new_empty(b, q_len, heads, value.shape[-1])
    for i in range(q_len):
        seen = kv_len - q_len + i + 1
        q = query[:, :, i].reshape(b, kv_heads, heads // kv_heads, d)  # a kv head's query heads as rows (GQA)
        o = torch.nn.functional.scaled_dot_product_attention(q, key[:, :, :seen], value[:, :, :seen], scale=scaling)
        out[:, i] = o.reshape(b, heads, -1)
    return out, None


def _use_rowwise_attention(model: nn.Module) -> None:
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(ROWWISE_ATTENTION, rowwise_attention)
    AttentionMaskInterface.register(ROWWISE_ATTENTION, sdpa_mask)  # for the fallback; plain causal is checked
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "set_attn_implementation"):
        return  # not a transformers model (a bare layer stack): nothing to set
    model.set_attn_implementation(ROWWISE_ATTENTION)
    if config._attn_implementation != ROWWISE_ATTENTION:
        raise DiscoError(
            f"--cpu-backend int8 needs a model whose attention goes through transformers' "
            f"AttentionInterface ({type(model).__name__} does not): use --cpu-backend onednn"
        )


_MODULES = {"transposed": TransposedLinear, "onednn": OneDNNLinear, "int8": Int8Linear}
_FLOAT32_ONLY = ("onednn", "int8")


def check_cpu_backend(backend: str) -> str:
    if backend not in CPU_BACKENDS:
        raise DiscoError(f"unknown CPU backend {backend!r}: choose one of {', '.join(CPU_BACKENDS)}")
    return backend


def apply_cpu_backend(model: nn.Module, backend: str = DEFAULT_CPU_BACKEND) -> nn.Module:
    """Swap every nn.Linear of `model` (on the CPU) for `backend`'s module, in place; returns `model`.

    Layers are converted one at a time and each original weight is released as soon as its
    module is replaced (a weight shared with another module — tied embeddings — stays alive
    through that module)."""
    check_cpu_backend(backend)
    current = cpu_backend_of(model)
    if backend == current:
        return model
    if current != "eager":
        raise DiscoError(f"this model already runs on CPU backend {current!r}: load it again for {backend!r}")
    param = next(model.parameters(), None)
    if param is not None and param.device.type != "cpu":
        raise DiscoError(f"--cpu-backend {backend} applies to models on the CPU (this one is on {param.device})")
    if backend in _FLOAT32_ONLY and param is not None and param.dtype != torch.float32:
        raise DiscoError(
            f"--cpu-backend {backend} computes in float32 but the model is {param.dtype}: "
            "use --dtype float32 (the CPU default) or --cpu-backend eager"
        )
    cls = _MODULES[backend]
    if backend == "int8":
        _use_rowwise_attention(model)
    names = [name for name, mod in model.named_modules() if type(mod) is nn.Linear]  # names only: no refs
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        with torch.no_grad():
            setattr(parent, child, cls(getattr(parent, child)))
    model.cpu_backend = backend  # read back by cpu_backend_of()
    return model


def cpu_backend_of(model: nn.Module) -> str:
    """The backend applied to `model` ("eager" when none was)."""
    return getattr(model, "cpu_backend", "eager")


def linear_weight_bytes(model: nn.Module) -> int:
    """Bytes of Linear weights (and biases) one forward reads: what bounds a decode step on a
    memory-bound CPU. Embeddings are left out (a step reads one row of them)."""
    total = 0
    for mod in model.modules():
        bias = getattr(mod, "bias", None)
        if isinstance(mod, (nn.Linear, TransposedLinear)):
            total += mod.weight.numel() * mod.weight.element_size()
        elif isinstance(mod, OneDNNLinear):
            total += mod.packed_weight.numel() * mod.packed_weight.element_size()
        elif isinstance(mod, Int8Linear):
            total += mod.in_features * mod.out_features + 8 * mod.out_features  # int8 weights + scales
        else:
            continue
        if isinstance(bias, torch.Tensor):
            total += bias.numel() * bias.element_size()
    return total
