"""A crash in native code (llama.cpp, torch, vLLM) as one line, never a dump (docs/architecture.md, "Crashes").

The installed `disco` command runs its heavy commands (SUPERVISED) in a child process and waits
(`supervise`). The child writes faulthandler's report to a file the parent named (`watch`); a stage says
what a crash from then on would leave on disk (`keep`). When the child dies by a signal, the parent names
the engine from the innermost disco/engines frame of the report and prints one line: the engine, the
signal, what to try, what was kept. Standard library only: the parent imports nothing heavy.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

SUPERVISED = ("compare", "collect", "demo", "generate")
ENV = "DISCO_CRASH_REPORT"  # set in the child: where faulthandler writes; beside it, ".kept": what a crash keeps
# the folder under disco/ an engine's modules live in -> the engine
ENGINE_MODULES = {("engines", "llamacpp"): "llama.cpp", ("engines", "torch"): "torch", ("vllm",): "vllm"}
# what to try when an engine crashes: (option, value), offered where the command has the option
ADVICE = {
    "llama.cpp": [("--repack", "off"), ("--engine", "torch")],
    "torch": [("--cpu-backend", "eager")],
    "vllm": [("--engine", "torch")],
}
_FRAME = re.compile(r'^\s*File "(?P<file>.+)", line (?P<line>\d+) in ')
_report = None  # the child's open report file: faulthandler writes to it at the crash


def watch() -> None:
    """In the child (ENV set): have faulthandler write a crash's Python stacks to the parent's file."""
    global _report
    path = os.environ.get(ENV)
    if path:
        _report = open(path, "w")  # open until the process ends
        faulthandler.enable(file=_report, all_threads=True)


def keep(what: str) -> None:
    """Tell the supervising parent (if any) what a crash from now on leaves on disk, e.g. "the finished
    rows are kept in FILE" (the last call wins)."""
    path = os.environ.get(ENV)
    if path:
        with contextlib.suppress(OSError):  # only a message: never a reason to stop the run
            Path(path + ".kept").write_text(what, encoding="utf-8")


def supervise(command: list[str], name: str, flags: Callable[[], set[str]]) -> int:
    """Run `command` (disco NAME in a child process) and return the exit code to leave with. Ctrl-C
    reaches the child (the terminal signals both; the parent ignores it), SIGTERM/SIGHUP are passed on;
    a child killed by a signal becomes one line on stderr and 128 + the signal's number. `flags`: the
    command's options (for the advice)."""
    fd, report = tempfile.mkstemp(prefix="disco-crash-", suffix=".txt")
    os.close(fd)
    kept = Path(report + ".kept")
    child: subprocess.Popen | None = None
    stacks = False

    def pass_on(signum: int, _frame: object) -> None:
        if child is not None:
            child.send_signal(signum)

    handlers: dict[signal.Signals, Any] = {signal.SIGINT: signal.SIG_IGN, signal.SIGTERM: pass_on}
    if hasattr(signal, "SIGHUP"):
        handlers[signal.SIGHUP] = pass_on
    before = {s: signal.signal(s, h) for s, h in handlers.items()}
    try:
        child = subprocess.Popen(command, env={**os.environ, ENV: report}, preexec_fn=_child_setup())
        code = child.wait()
        if code >= 0:
            return code
        text = Path(report).read_text(errors="replace")
        what = kept.read_text(encoding="utf-8") if kept.is_file() else ""
        # on a line of its own: a progress bar may have left the last one open
        print("\n" + describe(name, -code, text, what, report, flags), file=sys.stderr)
        stacks = bool(text.strip())  # they stay for a bug report: the line names the file
        return 128 - code
    finally:
        for s, h in before.items():
            signal.signal(s, h)
        kept.unlink(missing_ok=True)
        if not stacks:
            Path(report).unlink(missing_ok=True)


def _child_setup() -> Callable[[], None]:
    """What the child runs between fork and exec: Ctrl-C's default back (Python installs its handler only
    over the default), and, on Linux, an end with its parent (PR_SET_PDEATHSIG): it never runs on unseen."""
    prctl = None
    if sys.platform.startswith("linux"):
        import ctypes

        prctl = ctypes.CDLL(None).prctl

    def setup() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if prctl is not None:
            prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG

    return setup


def innermost_engine(report: str) -> tuple[str, str] | None:
    """(engine, "disco/FOLDER/FILE.py:LINE") of the innermost frame in an engine's folder (ENGINE_MODULES) of the
    crashing thread in a faulthandler report; None when no engine ran there."""
    current = report.split("Current thread", 1)[-1]  # faulthandler lists the crashing thread so, innermost first
    for line in current.splitlines():
        m = _FRAME.match(line)
        parts = Path(m["file"]).parts if m else ()
        if m is None or "disco" not in parts:
            continue
        inside = parts[len(parts) - 1 - parts[::-1].index("disco") + 1 :]  # the path below the last disco/
        for folder, engine in ENGINE_MODULES.items():
            if inside[: len(folder)] == folder and len(inside) > len(folder):
                return engine, f"disco/{'/'.join(inside)}:{m['line']}"
    return None


def describe(name: str, signum: int, report: str, kept: str, path: str, flags: Callable[[], set[str]]) -> str:
    """The one line for `disco NAME` killed by signal `signum`."""
    try:
        sig = f"{signal.Signals(signum).name}, {signal.strsignal(signum)}"
    except ValueError:
        sig = f"signal {signum}"
    kept = f"; {kept}" if kept else ""
    if not report.strip():  # no faulthandler report: killed from outside
        hint = ": the system may have run out of memory" if signum == getattr(signal, "SIGKILL", -1) else ""
        return f"error: disco {name} was stopped by {sig}{hint}{kept}"
    found = innermost_engine(report)
    if found is None:
        return f"error: disco {name} crashed in native code ({sig}){kept} (Python stacks: {path})"
    engine, where = found
    have = flags()
    tries = [f"{opt} {value}" for opt, value in ADVICE[engine] if opt in have]
    advice = f": try {' or '.join(tries)}" if tries else ""
    return f"error: the {engine} engine crashed in native code ({sig}, under {where}){advice}{kept} (Python stacks: {path})"
