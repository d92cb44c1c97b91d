"""The llama-cpp-python library and the GGUF files the llama.cpp engine runs: importing the library (or one line
saying how to install it), its build (`build_id`, `build_features`: what traces record), its backend (`init_backend`,
once per process, logging silenced), the GGUF magic check (`is_gguf`) and re-quantized drafts (`requantized`).
disco.engines.llamacpp.llamacpp runs the models; this module's name keeps the llamacpp prefix by which a native crash is
named (disco.base.crash.ENGINE_MODULES: its folder).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

from disco.base.defaults import DRAFT_QUANT_CHOICES
from disco.base.errors import DiscoError
from disco.base.machine import usable_cores

INSTALL_HINT = (
    "install it with `pip install 'disco-spec[llamacpp]'` (llama-cpp-python 0.3.36, what `make install` does; "
    "it builds llama.cpp from source, ~6 min), or run the torch engine with --engine torch"
)
_GGUF_MAGIC = b"GGUF"


def llama_cpp_module():
    """The llama_cpp package, or a one-line error saying how to install it."""
    try:
        import llama_cpp
    except ImportError as e:
        raise DiscoError(
            f"the llama.cpp engine needs llama-cpp-python, which is not importable ({e}): " + INSTALL_HINT
        ) from None
    except OSError as e:  # the package is there but its shared library does not load
        raise DiscoError(
            f"llama-cpp-python is installed but its llama.cpp library does not load ({e}): reinstall it: {INSTALL_HINT}"
        ) from None
    return llama_cpp


def is_gguf(path: str | Path) -> bool:
    """True when the file starts with the GGUF magic bytes."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == _GGUF_MAGIC
    except OSError:
        return False


# A draft may be re-quantized: the draft never changes the output, only how fast it drafts. Q4_0
# (output matrix included) runs llama.cpp's fastest repacked CPU kernels; measured on the embedded
# draft: 9.0 ms/token against 16.4 for its Q4_K_M file, top-1 agreement with the target unchanged
# (bench/results/llamacpp.md, "llama.cpp engine").
DRAFT_QUANTS = {"q4_0": 2, "q8_0": 7}  # name -> llama_ftype (LLAMA_FTYPE_MOSTLY_*)
assert set(DRAFT_QUANT_CHOICES) == {"auto", "none", *DRAFT_QUANTS}, "defaults.DRAFT_QUANT_CHOICES"
# the embedded draft runs re-quantized to Q4_0 (1.8x faster, same top-1 agreement). The target is never
# re-quantized: it defines the output.
EMBEDDED_DRAFT_QUANT = "q4_0"


def requantized(path: Path, quant: str, progress: bool = True) -> Path:
    """`path` re-quantized to `quant` (every tensor, the output matrix included), made once (seconds)
    and cached beside disco's other GGUFs, keyed by the source file's path, size and mtime."""
    import sys
    import tempfile

    from disco.base.files import file_key
    from disco.sources.embedded import cache_root

    if quant not in DRAFT_QUANTS:
        raise DiscoError(f"unknown draft quantization {quant!r}: choose one of {', '.join(DRAFT_QUANTS)}")
    dest = cache_root() / "gguf" / "requantized" / f"{path.stem}-{quant}-{file_key(path)}.gguf"
    if dest.is_file():
        return dest
    lc = llama_cpp_module()
    init_backend(lc)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    try:
        params = lc.llama_model_quantize_default_params()
        params.ftype = params.output_tensor_type = DRAFT_QUANTS[quant]
        params.allow_requantize = True
        params.nthread = usable_cores()
        if progress:
            print(f"disco: re-quantizing the draft {path.name} to {quant} (once)", file=sys.stderr)
        if lc.llama_model_quantize(str(path).encode(), tmp.encode(), ctypes.byref(params)) != 0:
            raise DiscoError(f"llama.cpp could not re-quantize {path} to {quant}: use --draft-quant none")
        os.replace(tmp, dest)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return dest


def build_id(lc) -> str:
    """Names the llama.cpp build llama-cpp-python loads: its version and its libraries as installed."""
    import hashlib

    from disco.base.files import file_key

    libs = sorted((Path(lc.__file__).parent / "lib").glob("*.so*")) or [Path(lc.__file__)]
    return f"{lc.__version__}-" + hashlib.sha256("".join(map(file_key, libs)).encode()).hexdigest()[:12]


def build_features(lc) -> str:
    """The CPU features llama.cpp was compiled with (its system info, e.g. "AVX2 AVX512 AVX512_VNNI"):
    what a trace records of the build (an AMX build says AMX_INT8)."""
    info = lc.llama_print_system_info().decode("utf-8", "replace")  # "CPU : SSE3 = 1 | AVX = 1 | ..."
    items = (m.split(":")[-1].strip() for m in info.split("|"))
    return " ".join(sorted({m.split("=")[0].strip() for m in items if m.endswith("= 1")}))


_LOG_CALLBACK: Any = None  # keeps the ctypes callback alive for as long as llama.cpp may call it
_BACKEND_READY = False


def init_backend(lc) -> None:
    """Once per process: silence llama.cpp's console logging (errors surface as DiscoErrors) and init."""
    global _LOG_CALLBACK, _BACKEND_READY
    if _BACKEND_READY:
        return
    if not os.environ.get("DISCO_LLAMA_LOG"):  # DISCO_LLAMA_LOG=1 shows llama.cpp's own log
        _LOG_CALLBACK = lc.llama_log_callback(lambda level, text, user_data: None)
        lc.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
    lc.llama_backend_init()
    _BACKEND_READY = True
