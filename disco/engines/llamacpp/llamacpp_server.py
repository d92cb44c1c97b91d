"""llama.cpp's own draft-model speculative decoding, as a baseline row for `disco compare`.

llama-server with a draft model (`-md DRAFT --spec-type draft-simple`) drafts up to
`--spec-draft-n-max` tokens per step and stops drafting early when the draft's top
probability falls below `--spec-draft-p-min` (alias `--draft-p-min`). We run it on the same
GGUF pair, prompt token ids, thread count and token budget as our own loop, greedy.

    server_binary()   the llama-server binary (engines/llamacpp/llamacpp_build.py builds it once)
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

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from disco.base.defaults import LLAMA_SERVER_DRAFT_N_MAX, LLAMA_SERVER_DRAFT_N_MIN, LLAMA_SERVER_DRAFT_P_MIN
from disco.base.errors import DiscoError
from disco.base.machine import usable_cores
from disco.core.stats import GenResult, GenStats
from disco.engines.llamacpp.llamacpp_build import BINARY_NAME, server_binary
from disco.policies.rounds import eos_cut

# --- the server ---------------------------------------------------------------------------------


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
    return {
        **GREEDY_FIELDS,
        "temperature": float(temperature),
        "top_k": 0,
        "top_p": float(top_p),
        "samplers": ["temperature", "top_p"],
        "seed": int(seed),
    }


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
        n_max: int = LLAMA_SERVER_DRAFT_N_MAX,
        n_min: int = LLAMA_SERVER_DRAFT_N_MIN,
        p_min: float = LLAMA_SERVER_DRAFT_P_MIN,
        binary: str | os.PathLike | None = None,
        startup_timeout_s: float = 300.0,
        request_timeout_s: float = 3600.0,
        log_path: str | os.PathLike | None = None,
        extra_args: Sequence[str] = (),
        repack: bool = True,
        warmup: bool = True,
        progress: bool = True,
    ) -> None:
        self.target = Path(target)
        self.draft = Path(draft) if draft is not None else None
        for p in (self.target, self.draft):
            if p is not None and not p.is_file():
                raise DiscoError(f"GGUF file not found: {p}")
        self.threads = int(threads) if threads else usable_cores()
        self.ctx = int(ctx)
        self.n_max, self.n_min, self.p_min = int(n_max), int(n_min), float(p_min)
        self.binary = Path(binary) if binary is not None else None
        self.startup_timeout_s = startup_timeout_s
        self.request_timeout_s = request_timeout_s
        self.extra_args = list(extra_args)
        self.repack = repack  # llama.cpp's weight repacking, as the in-process engine chose it (--no-repack if off)
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
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-m",
            str(self.target),
            "-c",
            str(self.ctx),
            "-t",
            t,
            "-tb",
            t,
            "-np",
            "1",
            "--cache-ram",
            "0",  # no host-memory prompt cache: every request is processed cold
            "--no-webui",
            "-fit",
            "off",  # keep exactly the -c we ask for
        ]
        if not self.repack:
            cmd.append("--no-repack")  # both models: the server's draft takes the same model parameters
        if self.draft is not None:
            cmd += [
                "-md",
                str(self.draft),
                "--spec-type",
                "draft-simple",  # required: -md alone does not enable speculation
                "--spec-draft-threads",
                t,
                "--spec-draft-threads-batch",
                t,
                "--spec-draft-n-max",
                str(self.n_max),
                "--spec-draft-n-min",
                str(self.n_min),
                "--spec-draft-p-min",
                repr(self.p_min),
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
                self.command(port),
                stdout=self._log_fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
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
                raise DiscoError(
                    f"llama-server exited with code {rc} while starting; last lines of {self.log_path}: {_tail(self.log_path)}"
                )
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


# --- the anchor: rows of `disco compare` decoded by llama-server ---------------------------------------

SERVER_TARGET_LABEL = "llama-server target-only"
SERVER_LABEL = "llama-server -md"  # llama.cpp's own draft-model speculative decoding


class ServerAnchor:
    """One llama-server row: started before any timing on the pair's own GGUF files (the draft as the
    pair runs it, re-quantized or not) and thread count, stopped when compare's stack closes.
    spec: {} target-only, else {n_max, n_min, p_min} of -md."""

    forwards_known = False  # the server reports drafted/accepted counts, not its forward calls

    def __init__(self, label: str, target, draft, spec: dict) -> None:
        self.label, self.target, self.draft, self.spec = label, target, draft, spec
        self.server: LlamaServer | None = None

    def start(self, stack: contextlib.ExitStack, progress: bool) -> None:
        binary = server_binary(progress=progress)
        srv = LlamaServer(
            self.target.path,
            self.draft.path if self.spec else None,
            threads=self.target.threads,
            ctx=self.target.n_ctx,
            binary=binary,
            repack=self.target.repack and self.draft.repack,  # what the engines' probe chose (llamacpp_repack.py)
            progress=progress,
            **self.spec,
        )
        self.server = stack.enter_context(srv)

    def generate(self, prompt_ids: list[int], config, eos_token_ids: frozenset[int]) -> GenResult:
        """One completion, as a GenResult (its forward counts are not exposed)."""
        r = self.server.complete(
            prompt_ids, config.max_new_tokens, temperature=config.temperature, top_p=config.top_p, seed=config.seed
        )
        tokens = eos_cut(r["tokens"], eos_token_ids)  # it stops at llama.cpp's end-of-generation tokens, as the loop
        stats = GenStats(
            new_tokens=len(tokens), wall_s=r["wall_s"], drafted=r["draft_n"] or 0, accepted=r["draft_n_accepted"] or 0
        )
        return GenResult(tokens, stats)


def server_anchors(target, draft, tuned: dict | None) -> list[ServerAnchor]:
    """llama-server target-only, with -md at llama.cpp's defaults, and at `tuned` ({n_max, p_min}, tuned
    on validation prompts: disco.jobs.server_tuning) when given."""
    defaults = {"n_max": LLAMA_SERVER_DRAFT_N_MAX, "n_min": LLAMA_SERVER_DRAFT_N_MIN, "p_min": LLAMA_SERVER_DRAFT_P_MIN}
    rows = [
        ServerAnchor(SERVER_TARGET_LABEL, target, draft, {}),
        ServerAnchor(
            f"{SERVER_LABEL} (defaults: n-max {LLAMA_SERVER_DRAFT_N_MAX}, p-min {LLAMA_SERVER_DRAFT_P_MIN:g})",
            target,
            draft,
            defaults,
        ),
    ]
    if tuned:
        spec = {**defaults, **tuned}
        rows.append(
            ServerAnchor(f"{SERVER_LABEL} (tuned: n-max {spec['n_max']}, p-min {spec['p_min']:g})", target, draft, spec)
        )
    return rows
