"""Builds llama-server once from the llama.cpp vendored in the pinned llama-cpp-python sdist (the same
llama.cpp the in-process engine runs), cached under cache_root()/llama.cpp/llama-cpp-python-{version}/.

    server_binary()                      the binary's path, built on first use (minutes)
    python -m disco.engines.llamacpp.llamacpp_build   what `make install` runs: build it and print its path

engines/llamacpp/llamacpp_server.py runs it (the llama.cpp engine's anchor row in `disco compare`).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from disco.base.errors import DiscoError
from disco.base.files import file_lock
from disco.engines.llamacpp.llamacpp_cpu import cmake_args, flags_label
from disco.sources.embedded import cache_root

PINNED_VERSION = "0.3.36"  # pyproject.toml pins llama-cpp-python==0.3.36
SDIST_ENV = "DISCO_LLAMA_SDIST"  # optional: a local llama-cpp-python sdist (.tar.gz) to build from
BINARY_NAME = "llama-server"
MARKER = "build.json"  # written beside the binary after a successful build
BUILD_LOG = "build.log"


# CMake options: Release, static libs (a stand-alone binary), only what llama-server needs, no
# network at configure/build time (no curl, no HTTPS, no UI download from Hugging Face). CPU
# flags: llama_cpp_cpu.cmake_args(), the same as the llama-cpp-python wheel's (native, minus AMX where
# the CPU has it).
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
)
BUILD_JOBS = 2


def _installed_version() -> str:
    try:
        return importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        return PINNED_VERSION


# The llama-cpp-python version whose vendored llama.cpp the server is built from: the installed
# one (so the server runs the same llama.cpp as the in-process engine), else the pin.
SERVER_VERSION = _installed_version()


def server_dir(version: str = SERVER_VERSION) -> Path:
    """Cache folder of the llama-server built from llama-cpp-python `version` with this CPU's flags
    (llama.cpp's defaults keep the folder name they always had)."""
    suffix = f"-{flags_label(cmake_args())}" if cmake_args() else ""
    return cache_root() / "llama.cpp" / f"llama-cpp-python-{version}{suffix}"


def _is_built(binary: Path) -> bool:
    return binary.is_file() and os.access(binary, os.X_OK)


def server_binary(build: bool = True, progress: bool = True, version: str = SERVER_VERSION) -> Path:
    """Path of a llama-server built from the vendored llama.cpp of llama-cpp-python==`version`.

    Built once (minutes) and cached; later calls return at once. With build=False a missing
    binary is a DiscoError. Build failures raise DiscoError naming the build log.
    """
    folder = server_dir(version)
    binary = folder / BINARY_NAME
    if _is_built(binary):
        return binary
    if not build:
        raise DiscoError(
            f"llama-server for llama-cpp-python {version} is not built yet; "
            f"run: python -m disco.engines.llamacpp.llamacpp_build (builds it into {folder}, a few minutes)"
        )
    folder.mkdir(parents=True, exist_ok=True)
    with _build_lock(folder, progress):
        if _is_built(binary):  # another process built it while we waited
            return binary
        _build(version, folder, progress)
    return binary


def _build_lock(folder: Path, progress: bool):
    """Exclusive cross-process lock for building into `folder`."""
    return file_lock(
        folder.parent / f".{folder.name}.lock",
        f"waiting for another process building {folder.name}/llama-server",
        progress,
    )


def _find_tools() -> tuple[str, str | None]:
    """(cmake, generator or None): DiscoError when cmake or a C++ compiler is missing."""
    fix = "install them (e.g. apt-get install cmake g++) and run: python -m disco.engines.llamacpp.llamacpp_build"
    cmake = shutil.which("cmake")
    if cmake is None:
        raise DiscoError(f"building llama-server needs cmake and a C++ compiler; cmake is missing: {fix}")
    cxx = os.environ.get("CXX")
    if not (cxx and shutil.which(cxx.split()[0])) and not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
        raise DiscoError(f"building llama-server needs cmake and a C++ compiler; no C++ compiler found: {fix}")
    if shutil.which("ninja"):
        return cmake, "Ninja"
    if shutil.which("make"):
        return cmake, None  # CMake's default generator (Unix Makefiles)
    raise DiscoError(f"building llama-server needs ninja or make; neither is installed: {fix}")


def _obtain_sdist(version: str, dest: Path, log) -> Path:
    """The llama-cpp-python sdist: $DISCO_LLAMA_SDIST if set, else `pip download` (pip caches it)."""
    local = os.environ.get(SDIST_ENV)
    if local:
        path = Path(local).expanduser()
        if not path.is_file():
            raise DiscoError(
                f"{SDIST_ENV}={local} is not a file; point it at llama_cpp_python-{version}.tar.gz or unset it"
            )
        return path
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",
        ":all:",
        f"llama-cpp-python=={version}",
        "-d",
        str(dest),
    ]
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
    found = sorted(dest.glob("llama_cpp_python-*.tar.gz")) + sorted(dest.glob("llama-cpp-python-*.tar.gz"))
    if rc != 0 or not found:
        raise DiscoError(
            f"could not download the llama-cpp-python {version} sdist with pip (see {log.name}); "
            f"check access to PyPI or set {SDIST_ENV} to a local copy of the sdist"
        )
    return found[0]


def _extract_llama_cpp(sdist: Path, dest: Path) -> Path:
    """Extract vendor/llama.cpp of the sdist into dest; return the llama.cpp source folder."""
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if re.match(r"^[^/]+/vendor/llama\.cpp/", m.name)]
        if not members:
            raise DiscoError(f"{sdist} has no vendor/llama.cpp folder; is it a llama-cpp-python sdist?")
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, members=members, filter="data")
        else:  # pragma: no cover  (Python without PEP 706 filters)
            tar.extractall(dest, members=members)
    top = members[0].name.split("/", 1)[0]
    return dest / top / "vendor" / "llama.cpp"


def _run_logged(cmd: Sequence[str], log, progress: bool, what: str) -> int:
    """Run cmd with its output appended to the log; with progress, echo the build's [n/N]
    counter to stderr every ~20 s."""
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, errors="replace"
    )
    last_echo, last_step = time.monotonic(), ""
    assert proc.stdout is not None
    for line in proc.stdout:
        log.write(line)
        m = re.match(r"^\s*(\[\s*\d+/\d+\]|\[\s*\d+%\])", line)
        if m:
            last_step = m.group(1)
        if progress and last_step and time.monotonic() - last_echo > 20:
            print(f"disco: {what} {last_step}", file=sys.stderr)
            last_echo = time.monotonic()
    log.flush()
    return proc.wait()


def _build(version: str, folder: Path, progress: bool) -> None:
    """Build llama-server into folder/llama-server (caller holds the lock)."""
    log_path = folder / BUILD_LOG
    cmake, generator = _find_tools()
    for stale in folder.glob(".build-*"):  # leftovers of interrupted builds
        shutil.rmtree(stale, ignore_errors=True)
    work = folder / f".build-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    t0 = time.perf_counter()
    if progress:
        print(
            f"disco: building llama-server from llama-cpp-python {version}'s llama.cpp "
            f"(one time, ~5-10 min on 2 cores); log: {log_path}",
            file=sys.stderr,
        )
    try:
        with open(log_path, "w") as log:
            sdist = _obtain_sdist(version, work / "sdist", log)
            src = _extract_llama_cpp(sdist, work / "src")
            build = work / "build"
            configure = [cmake, "-S", str(src), "-B", str(build), *CMAKE_OPTIONS, *cmake_args()]
            if generator:
                configure += ["-G", generator]
            if _run_logged(configure, log, False, "configuring") != 0:
                raise DiscoError(f"configuring llama-server with cmake failed; see {log_path}")
            cmd = [cmake, "--build", str(build), "--config", "Release", "--target", BINARY_NAME, "-j", str(BUILD_JOBS)]
            if _run_logged(cmd, log, progress, "building llama-server") != 0:
                raise DiscoError(f"building llama-server failed (compiler error or out of memory?); see {log_path}")
            built = next(
                (p for p in (build / "bin" / BINARY_NAME, build / "bin" / "Release" / BINARY_NAME) if p.is_file()), None
            )
            if built is None:
                raise DiscoError(f"the llama-server build finished without producing bin/{BINARY_NAME}; see {log_path}")
            elapsed = time.perf_counter() - t0
            log.write(f"\nbuilt in {elapsed:.0f} s\n")
        staged = folder / f".{BINARY_NAME}.{uuid.uuid4().hex[:8]}"
        shutil.copy2(built, staged)
        staged.chmod(0o755)
        marker = {
            "llama_cpp_python": version,
            "sdist": sdist.name,
            "cmake_options": [*CMAKE_OPTIONS, *cmake_args()],
            "cpu_flags": flags_label(cmake_args()),
            "build_seconds": round(elapsed, 1),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        (folder / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        os.replace(staged, folder / BINARY_NAME)  # atomic: the binary appears complete or not at all
    except OSError as e:
        raise DiscoError(f"building llama-server failed: {e}; see {log_path}") from e
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if progress:
        print(f"disco: built {folder / BINARY_NAME} in {elapsed:.0f} s", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m disco.engines.llamacpp.llamacpp_build`: build (if needed) and print the llama-server path."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m disco.engines.llamacpp.llamacpp_build", description=main.__doc__)
    ap.add_argument("--no-build", action="store_true", help="only locate the binary; fail if it is not built")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress messages")
    args = ap.parse_args(argv)
    try:
        t0 = time.perf_counter()
        path = server_binary(build=not args.no_build, progress=not args.quiet)
    except DiscoError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not args.quiet and time.perf_counter() - t0 > 1:
        print(f"disco: llama-server ready after {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
