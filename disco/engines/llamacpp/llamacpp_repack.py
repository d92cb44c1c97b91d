"""Whether llama.cpp may repack a GGUF file's weights on this CPU: probed once in a child process,
cached beside the build (docs/architecture.md, "llama.cpp on every CPU").

Weight repacking (llama.cpp's default: weights moved into CPU-friendly layouts, "extra buffer types")
is the fastest path, and the one whose kernels crashed on Intel AMX machines (issue 30). The build
leaves out what is known to crash (llamacpp_cpu.py); this is the safety net for what no build flag
foresees. Before a file is first loaded with repacking, a child process loads it with repacking on and
decodes a few tokens (llamacpp.py's `probe-repack` entry). The verdict:

    the child exits 0 and its logits are finite   repack on
    the child dies by a signal (SIGSEGV, ...)      repack off: the crash stayed in the child
    the child reports non-finite logits            repack off
    the child fails otherwise (exit code > 0)      repack off for this run, not cached (retried next time)

is cached per (GGUF file, llama.cpp build, CPU) under cache_root()/llama.cpp/repack/, so each file is
probed once; a rebuilt llama.cpp, another CPU or a changed file probes again. `--repack on|off`
overrides the probe, except that `on` is refused where the probe saw repacking fail.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from disco.base.defaults import REPACK_MODES
from disco.base.errors import DiscoError
from disco.base.files import atomic_write_json, file_key
from disco.engines.llamacpp.llamacpp_cpu import cpu_key
from disco.sources.embedded import cache_root

PROBE_TIMEOUT_S = 600.0  # loading + a few tokens takes seconds; a hung child is a failed probe


@dataclass(frozen=True)
class RepackChoice:
    """What an engine runs with and why (recorded in describe(): traces, profiles, artifacts, compare)."""

    repack: bool
    reason: str


def verdict_path(gguf: Path, build: str) -> Path:
    """The cached verdict for `gguf` under llama.cpp build `build` on this CPU."""
    return cache_root() / "llama.cpp" / "repack" / f"{build}-{cpu_key()}" / f"{gguf.name}-{file_key(gguf)}.json"


def probe(gguf: Path, build: str, command: Sequence[str], progress: bool = True) -> dict:
    """The cached verdict for `gguf`, probing in a child process (`command`) on first use."""
    path = verdict_path(gguf, build)
    if path.is_file():
        return json.loads(path.read_text())
    if progress:
        print(f"disco: checking once that llama.cpp's weight repacking works here for {gguf.name}", file=sys.stderr)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(list(command), capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        rc, out = proc.returncode, proc.stdout.strip().splitlines()
    except subprocess.TimeoutExpired:
        rc, out = None, []
    seconds = round(time.perf_counter() - t0, 1)
    if rc == 0 and out and out[-1] == "finite":
        verdict = {"repack": True, "why": "probe ok"}
    elif rc == 0:
        verdict = {"repack": False, "why": "probe: repacked weights gave non-finite logits"}
    elif rc is not None and rc < 0:
        verdict = {"repack": False, "why": f"probe: llama.cpp died by {_signal_name(-rc)} with repacked weights"}
    else:  # a failure of the child itself (or a hang): not a verdict on repacking, so not cached
        why = "timed out" if rc is None else f"exited with code {rc}"
        return {"repack": False, "why": f"probe {why}; not cached", "seconds": seconds}
    verdict.update(seconds=seconds, file=str(gguf), build=build, cpu=cpu_key())
    atomic_write_json(path, verdict)
    return verdict


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def choose(mode: str, gguf: Path, build: str, command: Sequence[str], progress: bool = True) -> RepackChoice:
    """Repack or not for `gguf`: --repack auto follows the probe, on insists (refused where the probe
    failed), off never repacks (and never probes)."""
    if mode not in REPACK_MODES:
        raise DiscoError(f"unknown repack mode {mode!r}: choose one of {', '.join(REPACK_MODES)}")
    if mode == "off":
        return RepackChoice(False, "repack off (asked)")
    verdict = probe(gguf, build, command, progress)
    if mode == "on" and not verdict["repack"]:
        raise DiscoError(
            f"repack on refused for {gguf.name}: {verdict['why']} on this CPU; use repack auto or off "
            "(the same output, without repacked kernels)"
        )
    if mode == "on":
        return RepackChoice(True, "repack on (asked; probe ok)")
    return RepackChoice(bool(verdict["repack"]), f"auto: {verdict['why']}")
