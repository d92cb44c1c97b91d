"""What llama.cpp is compiled for on this CPU: the build flags both copies share (docs/architecture.md,
"llama.cpp on every CPU"), and the wheel of llama-cpp-python built with them.

llama.cpp builds natively (-march=native) by default. On CPUs with Intel AMX (4th-generation Xeon and
later) that compiles in its AMX "extra buffer type", which takes the repacked weights, and whose matmul
kernel crashed with SIGSEGV on the first decode of the embedded Q4_0 draft and Q4_K_M target (issue 30,
gdb: ggml_backend_amx_mul_mat). So on such CPUs we build natively *minus AMX*: every other instruction
set of the machine stays (AVX-512, VNNI, BF16), repacking stays on, nothing that crashes is compiled in
(measured there: 1.24x the speed of a native build run without repacking). Elsewhere the build is
llama.cpp's default, unchanged. GCC honours an explicit -mno-X over what -march=native implies,
whatever their order on the command line.

Both copies are built with the same flags: the llama-cpp-python wheel (through CMAKE_ARGS, in `make
install`) and llama-server (engines/llamacpp/llamacpp_build.py). pip caches a wheel built from an sdist by its
download link, not by CMAKE_ARGS, so a cached native (AMX) wheel would be reused: we build the wheel
once per flag set into our own cache folder and install it from there.

Stdlib only, and importable before disco's dependencies are installed: `make install` runs

    python -m disco.engines.llamacpp.llamacpp_cpu wheel        build (once per flag set) and install llama-cpp-python
    python -m disco.engines.llamacpp.llamacpp_cpu cmake-args   the flags for this CPU, as CMAKE_ARGS text
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from disco.base.machine import cpu_flags, cpu_name

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"  # as pinned in pyproject.toml
AMX_FLAGS = ("amx_tile", "amx_int8", "amx_bf16")  # /proc/cpuinfo names
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
WHEEL_MARKER = "build.json"


def cpu_key() -> str:
    """Names this CPU for caches of what ran on it: its model name and feature flags."""
    text = cpu_name() + "|" + " ".join(sorted(cpu_flags()))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def has_amx(flags: frozenset[str] | None = None) -> bool:
    return any(f in (cpu_flags() if flags is None else flags) for f in AMX_FLAGS)


def cmake_args(flags: frozenset[str] | None = None) -> list[str]:
    """CMake options for llama.cpp on this CPU: native minus AMX where the CPU has AMX, else none."""
    if platform.machine() not in ("x86_64", "AMD64") or not has_amx(flags):
        return []
    return [f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"]


def flags_label(args: Sequence[str]) -> str:
    """One word for a flag set: what the build is (recorded in build.json and describe())."""
    return "native-no-amx" if args else "native"


def wheel_dir(args: Sequence[str]) -> Path:
    """Cache folder of the llama-cpp-python wheel built with `args` (one per flag set)."""
    from disco.sources.embedded import cache_root  # stdlib only at import

    key = hashlib.sha256(json.dumps([LLAMA_CPP_PYTHON, *args]).encode()).hexdigest()[:10]
    return cache_root() / "llama.cpp" / "wheels" / f"{LLAMA_CPP_PYTHON.replace('==', '-')}-{flags_label(args)}-{key}"


def install_wheel(python: str = sys.executable, quiet: bool = False) -> Path:
    """Build llama-cpp-python's wheel with this CPU's flags (once, ~5 min) and pip-install it."""
    args = cmake_args()
    folder = wheel_dir(args)
    wheels = sorted(folder.glob("llama_cpp_python-*.whl"))
    if not wheels:
        say = (lambda m: None) if quiet else (lambda m: print(f"disco: {m}", file=sys.stderr))
        say(
            f"building {LLAMA_CPP_PYTHON} for this CPU ({flags_label(args)}: {' '.join(args) or 'defaults'}), ~5 min once"
        )
        staging = folder.with_name(folder.name + f".partial-{os.getpid()}")
        staging.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        env = {**os.environ, "CMAKE_ARGS": " ".join(shlex.quote(a) for a in args)}
        cmd = [python, "-m", "pip", "wheel", "-q", "--no-deps", "--no-cache-dir", "--no-binary", "llama-cpp-python"]
        subprocess.run([*cmd, "-w", str(staging), LLAMA_CPP_PYTHON], env=env, check=True)
        marker = {
            "package": LLAMA_CPP_PYTHON,
            "cmake_args": args,
            "flags": flags_label(args),
            "cpu": cpu_name(),
            "build_seconds": round(time.perf_counter() - t0, 1),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        (staging / WHEEL_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        if folder.exists():  # another build finished meanwhile: keep it
            shutil.rmtree(staging, ignore_errors=True)
        else:
            staging.rename(folder)
        wheels = sorted(folder.glob("llama_cpp_python-*.whl"))
    quiet_flag = ["-q"] if quiet else []
    subprocess.run(
        [python, "-m", "pip", "install", *quiet_flag, "--no-deps", "--force-reinstall", str(wheels[-1])], check=True
    )
    return wheels[-1]


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m disco.engines.llamacpp.llamacpp_cpu", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument(
        "what", choices=("cmake-args", "wheel"), help="print this CPU's CMake flags, or build+install the wheel"
    )
    ap.add_argument("-q", "--quiet", action="store_true")
    a = ap.parse_args(argv)
    if a.what == "cmake-args":
        print(" ".join(shlex.quote(x) for x in cmake_args()))
        return 0
    try:
        print(install_wheel(quiet=a.quiet))
    except subprocess.CalledProcessError as e:
        print(f"error: building or installing {LLAMA_CPP_PYTHON} failed ({e}); see pip's output above", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
