"""How to load a pair: one options object for every command and caller (docs/architecture.md, "Options").

Plain values, no torch: the CLI builds a PairOptions from its shared options before any heavy import,
and `pair.load_pair(options)` takes it whole. Each field names the engine that reads it; the engine's
loader checks what does not apply to it (engines.ENGINE_KINDS).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from disco.base.defaults import (
    DEFAULT_CACHE,
    DEFAULT_CPU_BACKEND,
    DEFAULT_DEVICE,
    DEFAULT_DRAFT_QUANT,
    DEFAULT_DTYPE,
    DEFAULT_ENGINE,
    DEFAULT_REPACK,
    DEFAULT_VERIFY,
)


@dataclass(frozen=True)
class PairOptions:
    target: str | None = None  # HF model id, local folder or .gguf file; None (with draft None): the embedded pair
    draft: str | None = None  # a draft sharing the target's tokenizer
    pair_file: Path | None = None  # configs/pairs/*.yaml: target, draft, dtype, chat (explicit options override it)
    device: str = DEFAULT_DEVICE  # auto, cpu or cuda
    dtype: str = DEFAULT_DTYPE  # auto, float32, bfloat16 or float16 (torch engine)
    engine: str = DEFAULT_ENGINE  # auto, torch, llama.cpp or vllm
    cpu_backend: str = DEFAULT_CPU_BACKEND  # torch on the CPU: how Linear layers compute (cpu.py)
    cache: str = DEFAULT_CACHE  # torch: static, dynamic or auto KV caches
    compile: bool | None = None  # torch, static caches: captured steps (None: on for static caches on cuda)
    threads: int | None = None  # llama.cpp: CPU threads (None: the cores this process may use, machine.usable_cores)
    verify: str = DEFAULT_VERIFY  # llama.cpp: exact or fast verification
    draft_quant: str = DEFAULT_DRAFT_QUANT  # llama.cpp: re-quantize the draft (auto, none, q4_0, q8_0)
    repack: str = DEFAULT_REPACK  # llama.cpp: weight repacking (auto: probed once per file, build and CPU)
    tensor_parallel_size: int = 1  # vLLM: GPUs the target is split across (vLLM's own option, passed through)
