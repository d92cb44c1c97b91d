"""llama.cpp's own draft-model speculative decoding, as a baseline row for `disco compare`.

llama-server with a draft model (`-md DRAFT --spec-type draft-simple`) drafts up to
`--spec-draft-n-max` tokens per step and stops drafting early when the draft's top
probability falls below `--spec-draft-p-min` (alias `--draft-p-min`). We run it on the same
GGUF pair, prompt token ids, thread count and token budget as our own loop, greedy.

    server_binary()   a llama-server built from the llama.cpp vendored in the *pinned*
                      llama-cpp-python sdist (the same llama.cpp our in-process engine runs),
                      cached under cache_root()/llama.cpp/llama-cpp-python-{version}/
    LlamaServer       starts it on 127.0.0.1 (free port, one slot), waits for /health,
                      complete(prompt_ids, max_new_tokens) -> tokens, wall time, server timings
                      and draft counts; stops it on exit

Facts about the vendored llama.cpp (read from its source, llama-cpp-python 0.3.36):
  * `-md` alone does NOT enable speculation: without `--spec-type draft-simple` the draft is
    loaded and then silently dropped (common_speculative_init finds no implementation).
  * `--draft-max` / `--draft-min` were removed (the server exits with an error); the flags are
    `--spec-draft-n-max` / `--spec-draft-n-min`. `--draft-p-min` is still an alias.
  * Defaults (common/common.h, common_params_speculative_draft): n_max=3, n_min=0, p_min=0.0
    (p_min=0: never stop early, i.e. a fixed draft length of 3).
  * The draft's "top probability" is taken after a top-k=10 filter: it is the softmax over the
    draft's 10 best logits, so it is >= the true top probability of the full distribution.
  * Per-request speculative settings are compiled out (tools/server/server-schema.cpp:
    `#if 0` around "speculative.n_max/n_min/p_min"), so a different n_max/n_min/p_min needs a
    server restart; LlamaServer.complete() does that transparently (see `restarts`).
  * A draft is also capped by the remaining budget: n_draft <= n_predict - n_generated - 1, so
    the server never returns more than n_predict tokens.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from disco.embedded import cache_root
from disco.errors import DiscoError
from disco.files import file_lock

PINNED_VERSION = "0.3.36"  # pyproject.toml pins llama-cpp-python==0.3.36
SDIST_ENV = "DISCO_LLAMA_SDIST"  # optional: a local llama-cpp-python sdist (.tar.gz) to build from
BINARY_NAME = "llama-server"
MARKER = "build.json"  # written beside the binary after a successful build
BUILD_LOG = "build.log"

# llama.cpp's own defaults for draft-model speculation (vendor/llama.cpp/common/common.h,
# struct common_params_speculative_draft).
DRAFT_N_MAX = 3
DRAFT_N_MIN = 0
DRAFT_P_MIN = 0.0

# CMake options: Release, static libs (a stand-alone binary), only what llama-server needs, no
# network at configure/build time (no curl, no HTTPS, no UI download from Hugging Face). CPU
# flags are left at llama.cpp's defaults (GGML_NATIVE=ON), as in pip's build of llama-cpp-python.
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
    """Cache folder of the llama-server built from llama-cpp-python `version`."""
    return cache_root() / "llama.cpp" / f"llama-cpp-python-{version}"


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
            f"run: python -m disco.llamacpp_server (builds it into {folder}, a few minutes)"
        )
    folder.mkdir(parents=True, exist_ok=True)
    with _build_lock(folder, progress):
        if _is_built(binary):  # another process built it while we waited
            return binary
        _build(version, folder, progress)
    return binary


def _build_lock(folder: Path, progress: bool):
    """Exclusive cross-process lock for building into `folder`."""
    return file_lock(folder.parent / f".{folder.name}.lock",
                     f"waiting for another process building {folder.name}/llama-server", progress)


def _find_tools() -> tuple[str, str | None]:
    """(cmake, generator or None): DiscoError when cmake or a C++ compiler is missing."""
    fix = "install them (e.g. apt-get install cmake g++) and run: python -m disco.llamacpp_server"
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
            raise DiscoError(f"{SDIST_ENV}={local} is not a file; point it at llama_cpp_python-{version}.tar.gz or unset it")
        return path
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           f"llama-cpp-python=={version}", "-d", str(dest)]
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
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            text=True, errors="replace")
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
        print(f"disco: building llama-server from llama-cpp-python {version}'s llama.cpp "
              f"(one time, ~5-10 min on 2 cores); log: {log_path}", file=sys.stderr)
    try:
        with open(log_path, "w") as log:
            sdist = _obtain_sdist(version, work / "sdist", log)
            src = _extract_llama_cpp(sdist, work / "src")
            build = work / "build"
            configure = [cmake, "-S", str(src), "-B", str(build), *CMAKE_OPTIONS]
            if generator:
                configure += ["-G", generator]
            if _run_logged(configure, log, False, "configuring") != 0:
                raise DiscoError(f"configuring llama-server with cmake failed; see {log_path}")
            cmd = [cmake, "--build", str(build), "--config", "Release", "--target", BINARY_NAME, "-j", str(BUILD_JOBS)]
            if _run_logged(cmd, log, progress, "building llama-server") != 0:
                raise DiscoError(f"building llama-server failed (compiler error or out of memory?); see {log_path}")
            built = next((p for p in (build / "bin" / BINARY_NAME, build / "bin" / "Release" / BINARY_NAME) if p.is_file()), None)
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
            "cmake_options": list(CMAKE_OPTIONS),
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


# --- the server ---------------------------------------------------------------------------------


def _cpu_count() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1  # pragma: no cover


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 15) -> str:
    try:
        with open(path, errors="replace") as fh:
            lines = [ln.rstrip() for ln in deque(fh, maxlen=n) if ln.strip()]
    except OSError:
        return "(no log)"
    return " | ".join(lines) or "(empty log)"


# Direct connections only: an http_proxy in the environment must not capture 127.0.0.1.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))

# Greedy and nothing else: top-k 1 at temperature 0, every other sampler neutral.
GREEDY_FIELDS: dict[str, Any] = {
    "temperature": 0.0,
    "top_k": 1,
    "top_p": 1.0,
    "min_p": 0.0,
    "typical_p": 1.0,
    "top_n_sigma": -1.0,
    "xtc_probability": 0.0,
    "dynatemp_range": 0.0,
    "repeat_penalty": 1.0,
    "repeat_last_n": 0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "dry_multiplier": 0.0,
    "mirostat": 0,
    "samplers": ["top_k", "temperature"],
    "seed": 0,
    "n_probs": 0,
}


def sampler_fields(temperature: float, top_p: float, seed: int) -> dict[str, Any]:
    """GREEDY_FIELDS, or the sampler chain disco's loop samples from (decode.warp): temperature, then
    top-p, and nothing else (llama.cpp's default top-k 40 and min-p 0.05 off)."""
    if temperature == 0.0:
        return GREEDY_FIELDS
    return {**GREEDY_FIELDS, "temperature": float(temperature), "top_k": 0, "top_p": float(top_p),
            "samplers": ["temperature", "top_p"], "seed": int(seed)}


class LlamaServer:
    """A llama-server on 127.0.0.1 serving TARGET (and optionally DRAFT for speculation).

        with LlamaServer(target_gguf, draft_gguf, threads=2, ctx=4096, p_min=0.8) as srv:
            r = srv.complete(prompt_ids, max_new_tokens=128)
            r["tokens"], r["wall_s"], r["draft_n"], r["draft_n_accepted"]

    Without a draft it is a target-only server (the greedy reference for the same binary).
    One slot (-np 1), no prompt cache (every request starts cold), no web UI. After /health
    is ok, one throwaway request warms it up (warmup=False skips it). The server's output goes
    to `log_path` (a temp file unless given; kept when the server fails).
    """

    def __init__(
        self,
        target: str | os.PathLike,
        draft: str | os.PathLike | None = None,
        *,
        threads: int | None = None,
        ctx: int = 4096,
        n_max: int = DRAFT_N_MAX,
        n_min: int = DRAFT_N_MIN,
        p_min: float = DRAFT_P_MIN,
        binary: str | os.PathLike | None = None,
        startup_timeout_s: float = 300.0,
        request_timeout_s: float = 3600.0,
        log_path: str | os.PathLike | None = None,
        extra_args: Sequence[str] = (),
        warmup: bool = True,
        progress: bool = True,
    ) -> None:
        self.target = Path(target)
        self.draft = Path(draft) if draft is not None else None
        for p in (self.target, self.draft):
            if p is not None and not p.is_file():
                raise DiscoError(f"GGUF file not found: {p}")
        self.threads = int(threads) if threads else _cpu_count()
        self.ctx = int(ctx)
        self.n_max, self.n_min, self.p_min = int(n_max), int(n_min), float(p_min)
        self.binary = Path(binary) if binary is not None else None
        self.startup_timeout_s = startup_timeout_s
        self.request_timeout_s = request_timeout_s
        self.extra_args = list(extra_args)
        self.warmup = warmup
        self.progress = progress
        self._own_log = log_path is None
        self.log_path = Path(log_path) if log_path is not None else None
        self.port: int | None = None
        self.restarts = 0  # restarts done by complete() to change n_max / n_min / p_min
        self._proc: subprocess.Popen | None = None
        self._log_fh = None
        self._failed = False

    # -- lifecycle

    @property
    def speculative(self) -> bool:
        return self.draft is not None

    @property
    def url(self) -> str:
        if self.port is None:
            raise DiscoError("llama-server is not running; use `with LlamaServer(...) as srv:`")
        return f"http://127.0.0.1:{self.port}"

    def spec_config(self) -> dict[str, float] | None:
        """The speculative settings the running server uses (None for a target-only server)."""
        if not self.speculative:
            return None
        return {"n_max": self.n_max, "n_min": self.n_min, "p_min": self.p_min}

    def command(self, port: int) -> list[str]:
        """The llama-server command line (binary path resolved by start())."""
        t = str(self.threads)
        cmd = [
            str(self.binary or BINARY_NAME),
            "--host", "127.0.0.1", "--port", str(port),
            "-m", str(self.target),
            "-c", str(self.ctx),
            "-t", t, "-tb", t,
            "-np", "1",
            "--cache-ram", "0",  # no host-memory prompt cache: every request is processed cold
            "--no-webui",
            "-fit", "off",  # keep exactly the -c we ask for
        ]
        if self.draft is not None:
            cmd += [
                "-md", str(self.draft),
                "--spec-type", "draft-simple",  # required: -md alone does not enable speculation
                "--spec-draft-threads", t, "--spec-draft-threads-batch", t,
                "--spec-draft-n-max", str(self.n_max),
                "--spec-draft-n-min", str(self.n_min),
                "--spec-draft-p-min", repr(self.p_min),
            ]
        return cmd + self.extra_args

    def start(self) -> LlamaServer:
        if self._proc is not None:
            return self
        if self.binary is None:
            self.binary = server_binary(build=True, progress=self.progress)
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="disco-llama-server-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}  # only our flags count
        for attempt in range(3):  # a free port can be taken between our probe and the server's bind
            port = _free_port()
            self._log_fh = open(self.log_path, "a")
            self._log_fh.write(f"$ {' '.join(self.command(port))}\n")
            self._log_fh.flush()
            self._proc = subprocess.Popen(
                self.command(port), stdout=self._log_fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, start_new_session=True,
            )
            self.port = port
            try:
                self._wait_ready()
                if self.warmup:
                    self._warm_up()
                return self
            except DiscoError:
                rc = self._proc.poll()
                bind_error = rc is not None and re.search(r"bind|address already in use", _tail(self.log_path, 5), re.I)
                self._shutdown()
                if bind_error and attempt < 2:
                    continue
                self._failed = True  # keep the log: the error names it
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _wait_ready(self) -> None:
        assert self._proc is not None and self.log_path is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            rc = self._proc.poll()
            if rc is not None:
                raise DiscoError(f"llama-server exited with code {rc} while starting; last lines of {self.log_path}: {_tail(self.log_path)}")
            try:
                with _OPENER.open(f"{self.url}/health", timeout=2) as resp:
                    if resp.status == 200 and json.loads(resp.read() or b"{}").get("status") == "ok":
                        return
            except (urllib.error.URLError, OSError, ValueError):
                pass  # not listening yet, or 503 while loading the model
            if time.monotonic() > deadline:
                raise DiscoError(
                    f"llama-server did not become healthy within {self.startup_timeout_s:.0f} s; "
                    f"last lines of {self.log_path}: {_tail(self.log_path)}"
                )
            time.sleep(0.1)

    def _warm_up(self) -> None:
        """One throwaway greedy request, so that one-time costs of the first request after a start
        (page faults on the mmap'd weights, buffer allocation, thread start) stay out of the
        first measured request."""
        n_prompt = max(1, min(16, self.ctx // 4))
        n_predict = max(1, min(16, self.ctx - n_prompt - 4))
        payload = {"prompt": [0] * n_prompt, "n_predict": n_predict, "cache_prompt": False, **GREEDY_FIELDS}
        self._request("/completion", payload, timeout=self.startup_timeout_s)

    def _shutdown(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)  # its own session: the server and nothing else
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None
        self.port = None

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s); drop its temp log unless it failed."""
        self._shutdown()
        if self._own_log and not self._failed and self.log_path is not None:
            self.log_path.unlink(missing_ok=True)
            self.log_path = None

    def restart(self, **spec: Any) -> None:
        """Restart with new speculative settings (n_max, n_min, p_min): llama-server reads them
        only from its command line (per-request overrides are compiled out in this version)."""
        for k in ("n_max", "n_min"):
            if spec.get(k) is not None:
                setattr(self, k, int(spec[k]))
        if spec.get("p_min") is not None:
            self.p_min = float(spec["p_min"])
        self._shutdown()
        self.restarts += 1
        self.start()

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and not issubclass(exc_type, KeyboardInterrupt):
            self._failed = True
        self.stop()

    # -- requests

    def _request(self, path: str, payload: dict | None = None, timeout: float | None = None) -> dict:
        data = json.dumps(payload).encode() if payload is not None else None
        req = urllib.request.Request(f"{self.url}{path}", data=data, headers={"Content-Type": "application/json"})
        try:
            with _OPENER.open(req, timeout=timeout or self.request_timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            try:
                msg = json.loads(e.read()).get("error", {}).get("message", "")
            except ValueError:
                msg = ""
            self._failed = True
            raise DiscoError(f"llama-server answered {e.code} to {path}: {msg or e.reason}") from None
        except (urllib.error.URLError, OSError) as e:
            self._failed = True
            rc = self._proc.poll() if self._proc is not None else None
            raise DiscoError(
                f"llama-server request {path} failed ({e}); server exit code {rc}; "
                f"last lines of {self.log_path}: {_tail(self.log_path) if self.log_path else '(no log)'}"
            ) from None

    def props(self) -> dict:
        """GET /props: the server's settings (n_ctx, default generation settings, ...)."""
        return self._request("/props", timeout=30)

    def complete(
        self,
        prompt_ids: list[int],
        max_new_tokens: int,
        p_min: float | None = None,
        n_max: int | None = None,
        n_min: int | None = None,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
    ) -> dict:
        """Greedy (or, with temperature > 0, sampled: sampler_fields) completion of `prompt_ids` (token
        ids, used as given: no BOS is added).

        Stops at the model's end-of-generation tokens (the EOS token is included in `tokens`,
        as in our loop) or after max_new_tokens. Speculative overrides that differ from the
        running server's settings restart the server first (seconds: both models reload).

        Returns: tokens (list[int]), wall_s (client-side, around the HTTP request), prompt_n,
        prompt_ms, predicted_n, predicted_ms (server timings), draft_n, draft_n_accepted
        (None for a target-only server), stop_type ("eos" | "limit" | ...), spec (settings
        used), timings (the server's raw timings object).
        """
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise DiscoError("llama-server needs a non-empty prompt")
        if len(prompt) + max_new_tokens + 2 > self.ctx:
            raise DiscoError(
                f"prompt ({len(prompt)} tokens) + max_new_tokens ({max_new_tokens}) does not fit the "
                f"server's context of {self.ctx}; start LlamaServer with a larger ctx"
            )
        if self.speculative:
            want = {"n_max": n_max, "n_min": n_min, "p_min": p_min}
            current = self.spec_config()
            assert current is not None
            if any(v is not None and v != current[k] for k, v in want.items()):
                self.restart(**want)
        if self._proc is None:
            self.start()
        payload = {
            "prompt": prompt,
            "n_predict": int(max_new_tokens),
            "cache_prompt": False,
            "return_tokens": True,
            "stream": False,
            **sampler_fields(temperature, top_p, seed),
        }
        t0 = time.perf_counter()
        res = self._request("/completion", payload)
        wall = time.perf_counter() - t0
        timings = res.get("timings", {})
        tokens = [int(t) for t in res.get("tokens", [])]
        draft_n = draft_acc = None
        if self.speculative:  # the server omits both fields when nothing was drafted
            draft_n, draft_acc = int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0))
        return {
            "tokens": tokens,
            "wall_s": wall,
            "prompt_n": timings.get("prompt_n"),
            "prompt_ms": timings.get("prompt_ms"),
            "predicted_n": timings.get("predicted_n"),
            "predicted_ms": timings.get("predicted_ms"),
            "draft_n": draft_n,
            "draft_n_accepted": draft_acc,
            "stop_type": res.get("stop_type"),
            "spec": self.spec_config(),
            "timings": timings,
        }


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m disco.llamacpp_server`: build (if needed) and print the llama-server path."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m disco.llamacpp_server", description=main.__doc__)
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
