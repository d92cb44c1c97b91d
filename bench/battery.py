"""Reliability battery (issue 22): what a new user hits, on tiny random models, each case a real
`python cli.py …` subprocess. Records per case the exit code, the message (the first `error:` or
`warning:` line of stderr, else its first line), whether a traceback appeared, and whether the
user's data (trace shards, an artifact, a finished result) was lost or duplicated.

    python bench/battery.py [--work DIR] [--out bench/battery-results.json] [--only SUBSTRING]

Read-only and full outputs use small tmpfs mounts (needs root; skipped with a note otherwise).
A few minutes on 2 CPU cores (each case starts Python and imports torch)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

# the disco under test (DISCO_BATTERY_ROOT: another checkout, e.g. the code before a fix)
ROOT = Path(os.environ.get("DISCO_BATTERY_ROOT") or Path(__file__).resolve().parent.parent)
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

PY = sys.executable
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


# --- the user's world: a tiny pair (torch folders and GGUF files), prompts, traces, an artifact --------


@dataclass
class World:
    root: Path
    target: Path = field(init=False)
    draft: Path = field(init=False)
    gtarget: Path = field(init=False)
    gdraft: Path = field(init=False)
    prompts: Path = field(init=False)
    traces: Path = field(init=False)
    model: Path = field(init=False)

    def pair(self) -> list[str]:
        return ["--target", str(self.target), "--draft", str(self.draft), "--device", "cpu"]

    def gpair(self) -> list[str]:
        return ["--target", str(self.gtarget), "--draft", str(self.gdraft), "--engine", "llama.cpp", "--threads", "1"]

    def fresh(self, what: Path, name: str) -> Path:
        """A copy of a prepared folder, for a case that may damage it."""
        dest = self.root / "cases" / name
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(what, dest)
        return dest


def build(root: Path) -> World:
    import torch
    from tiny import char_tokenizer, save_tiny, tiny_pair
    from tiny_gguf import write_tiny_gguf

    w = World(root)
    root.mkdir(parents=True, exist_ok=True)
    target, draft = tiny_pair(noise=0.3, dtype=torch.float32)
    tok = char_tokenizer()
    w.target, w.draft = save_tiny(target, tok, root / "target"), save_tiny(draft, tok, root / "draft")
    w.gtarget = write_tiny_gguf(target, tok, root / "target.gguf")
    w.gdraft = write_tiny_gguf(draft, tok, root / "draft.gguf")
    w.prompts = root / "prompts.jsonl"
    w.prompts.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "task": ["code", "write"][i % 2], "prompt": f"def f{i}(x):"}) + "\n"
            for i in range(8)
        )
    )
    w.traces, w.model = root / "traces", root / "model"
    if not (w.traces / "manifest.json").is_file():
        run(
            [
                "collect",
                *w.pair(),
                "--prompts",
                str(w.prompts),
                "--out",
                str(w.traces),
                "--max-new-tokens",
                "12",
                "--shard-prompts",
                "2",
            ],
            check=True,
        )
    if not (w.model / "manifest.json").is_file():
        run(
            [
                "train",
                "--traces",
                str(w.traces),
                "--out",
                str(w.model),
                "--model",
                "logistic",
                "--no-head",
                "--overwrite",
            ],
            check=True,
        )
    return w


def run(argv: list[str], check: bool = False, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run([PY, "cli.py", *argv], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise SystemExit(f"setup failed: {' '.join(argv)}\n{proc.stderr[-3000:]}")
    return proc


# --- what "intact" means ----------------------------------------------------------------------------


def digest(folder: Path) -> str:
    """sha256 over every file of a folder (names and bytes), hidden lock files aside."""
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".lock")):
        h.update(str(f.relative_to(folder)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def trace_rows(folder: Path) -> tuple[int, int]:
    """(rows, duplicated (prompt_id, gen_pos) rows) of the finished shards, read directly."""
    import pandas as pd

    files = sorted((folder / "data").glob("part-*.parquet"))
    if not files:
        return 0, 0
    df = pd.concat([pd.read_parquet(f, columns=["prompt_id", "gen_pos"]) for f in files])
    return len(df), int(df.duplicated().sum())


# --- mounts: read-only and full ----------------------------------------------------------------------

MOUNTS: list[Path] = []


def tmpfs(path: Path, size: str = "2m", readonly: bool = False, leave: int | None = None) -> Path | None:
    """A small tmpfs at `path` (root only): read-only, or filled up to `leave` free bytes."""
    path.mkdir(parents=True, exist_ok=True)
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
        ).returncode
        != 0
    ):
        return None
    MOUNTS.append(path)
    if leave is not None:
        free = shutil.disk_usage(path).free
        with open(path / "filler", "wb") as f:
            f.write(b"\0" * max(0, free - leave))
    if readonly:
        subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)
    return path


def unmount_all() -> None:
    for m in reversed(MOUNTS):
        subprocess.run(["umount", "-l", str(m)], capture_output=True)
    MOUNTS.clear()


# --- cases --------------------------------------------------------------------------------------------


@dataclass
class Case:
    name: str
    group: str
    expect: int  # the exit code a correct disco gives
    argv: Callable[[World], list[str] | None]  # None: skipped (see note)
    data: Callable[[World, dict], str] | None = None  # after the run: "intact", "LOST …", "DUPLICATED …"
    setup: Callable[[World, dict], None] | None = None
    note: str = ""
    custom: Callable[[World, dict], subprocess.CompletedProcess] | None = None  # runs itself (kill -9, concurrency)


def traces_intact(key: str = "tr") -> Callable[[World, dict], str]:
    def check(w: World, st: dict) -> str:
        return "intact" if digest(st[key]) == st[key + "_digest"] else "LOST (the folder changed)"

    return check


def copy_traces(key: str = "tr"):
    def setup(w: World, st: dict) -> None:
        st[key] = w.fresh(w.traces, f"traces-{len(st)}-{time.monotonic_ns()}")
        st[key + "_digest"] = digest(st[key])

    return setup


def copy_model(key: str = "m"):
    def setup(w: World, st: dict) -> None:
        st[key] = w.fresh(w.model, f"model-{time.monotonic_ns()}")

    return setup


def edit_manifest(fn):
    def setup(w: World, st: dict) -> None:
        copy_model()(w, st)
        path = st["m"] / "manifest.json"
        m = json.loads(path.read_text())
        fn(m, st["m"])
        path.write_text(json.dumps(m))

    return setup


def gen(w: World, *more: str, engine: str = "torch") -> list[str]:
    pair = w.pair() if engine == "torch" else w.gpair()
    return ["generate", *pair, "--prompt", "def f(x):", "--max-new-tokens", "6", *more]


def prompts_file(w: World, name: str, data: bytes) -> Path:
    path = w.root / "cases" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def collect_argv(w: World, out: Path, *more: str) -> list[str]:
    return ["collect", *w.pair(), "--prompts", str(w.prompts), "--out", str(out), "--max-new-tokens", "12", *more]


def rows_ok(key: str, prompts: int) -> Callable[[World, dict], str]:
    """Every prompt traced once: no (prompt, position) twice, all prompts there, the manifest's count."""

    def check(w: World, st: dict) -> str:
        import pandas as pd

        rows, dup = trace_rows(st[key])
        if dup:
            return f"DUPLICATED ({dup} rows)"
        ids = {
            i
            for f in (st[key] / "data").glob("part-*.parquet")
            for i in pd.read_parquet(f, columns=["prompt_id"])["prompt_id"]
        }
        status = json.loads((st[key] / "manifest.json").read_text()).get("status", {})
        if len(ids) != prompts or status.get("rows") != rows:
            return f"LOST ({len(ids)} of {prompts} prompts, {rows} rows, manifest {status.get('rows')})"
        return "intact"

    return check


def kill9_and_resume(w: World, st: dict) -> subprocess.CompletedProcess:
    out = w.root / "cases" / f"kill9-{time.monotonic_ns()}"
    st["k9"] = out
    proc = subprocess.Popen(
        [PY, "cli.py", *collect_argv(w, out, "--shard-prompts", "1", "--max-new-tokens", "40")],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list((out / "data").glob("part-*.parquet"))) < 2:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return run(collect_argv(w, out, "--shard-prompts", "1", "--max-new-tokens", "40"))


def concurrent_collects(w: World, st: dict) -> subprocess.CompletedProcess:
    """The issue's repro: a collect with --shard-prompts 3; once a shard exists, the same command
    with --shard-prompts 4 into the same folder. The second must say busy; the rows stay unique."""
    out = w.root / "cases" / f"concurrent-{time.monotonic_ns()}"
    st["cc"] = out
    many = w.root / "prompts-24.jsonl"  # enough work that the first is still running when the second starts
    many.write_text(
        "".join(json.dumps({"id": f"q{i}", "task": "code", "prompt": f"def g{i}(x):"}) + "\n" for i in range(24))
    )
    argv = lambda n: [
        "collect",
        *w.pair(),
        "--prompts",
        str(many),
        "--out",
        str(out),
        "--max-new-tokens",
        "100",  # noqa: E731
        "--shard-prompts",
        str(n),
    ]
    first = subprocess.Popen(
        [PY, "cli.py", *argv(3)], cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list((out / "data").glob("part-*.parquet"))) < 1:
        time.sleep(0.2)
    second = run(argv(4))
    first.wait(timeout=600)
    return second


def damaged_then_recollect(w: World, st: dict) -> subprocess.CompletedProcess:
    """Truncate a shard, collect again (sets it aside, traces its prompts again), then train."""
    tr = st["tr"]
    shard = sorted((tr / "data").glob("part-*.parquet"))[1]
    shard.write_bytes(shard.read_bytes()[:200])
    again = run(collect_argv(w, tr, "--shard-prompts", "2"))
    if again.returncode != 0:
        return again
    st["damaged_left"] = [p.name for p in (tr / "data").glob(".damaged-*")]
    return run(
        [
            "train",
            "--traces",
            str(tr),
            "--out",
            str(w.root / "cases" / f"m-{time.monotonic_ns()}"),
            "--model",
            "logistic",
            "--no-head",
        ]
    )


def cases() -> list[Case]:
    C: list[Case] = []
    add = C.append
    cdir = lambda w, n: w.root / "cases" / n  # noqa: E731

    # item 1: train must never destroy a trace folder; --out discipline
    add(
        Case(
            "train --out = --traces",
            "1 train out",
            2,
            lambda w: ["train", "--traces", "{tr}", "--out", "{tr}", "--model", "logistic"],
            traces_intact(),
            copy_traces(),
        )
    )
    add(
        Case(
            "train --out inside --traces",
            "1 train out",
            2,
            lambda w: ["train", "--traces", "{tr}", "--out", "{tr}/model", "--model", "logistic"],
            traces_intact(),
            copy_traces(),
        )
    )
    add(
        Case(
            "train --out = a trace folder, --overwrite",
            "1 train out",
            2,
            lambda w: ["train", "--traces", str(w.traces), "--out", "{tr}", "--model", "logistic", "--overwrite"],
            traces_intact(),
            copy_traces(),
        )
    )
    add(
        Case(
            "train --out non-empty folder",
            "1 train out",
            2,
            lambda w: ["train", "--traces", str(w.traces), "--out", "{m}", "--model", "logistic"],
            lambda w, st: "intact" if digest(st["m"]) == st["m_digest"] else "LOST",
            lambda w, st: (copy_model()(w, st), st.update(m_digest=digest(st["m"]))),
        )
    )
    add(
        Case(
            "train --overwrite, other model kind: no stale file",
            "1 train out",
            0,
            lambda w: [
                "train",
                "--traces",
                str(w.traces),
                "--out",
                "{m}",
                "--model",
                "lightgbm",
                "--no-head",
                "--overwrite",
            ],
            lambda w, st: (
                "intact"
                if not (st["m"] / "model.json").exists() and (st["m"] / "model.txt").is_file()
                else "STALE model.json left"
            ),
            copy_model(),
        )
    )
    add(
        Case(
            "train --out a file",
            "1 train out",
            2,
            lambda w: ["train", "--traces", str(w.traces), "--out", str(w.prompts), "--model", "logistic"],
        )
    )
    add(
        Case(
            "collect --out an artifact folder",
            "1 train out",
            2,
            lambda w: collect_argv(w, Path("{m}")),
            lambda w, st: "intact" if digest(st["m"]) == st["m_digest"] else "LOST",
            lambda w, st: (copy_model()(w, st), st.update(m_digest=digest(st["m"]))),
        )
    )
    add(
        Case("collect --out someone's non-empty folder", "1 train out", 2, lambda w: collect_argv(w, w.root / "target"))
    )
    add(Case("collect --out a file", "5 files", 2, lambda w: collect_argv(w, w.prompts)))

    # item 2: damaged shard recovery
    add(
        Case(
            "train on a truncated shard",
            "2 damaged",
            2,
            lambda w: ["train", "--traces", "{tr}", "--out", str(cdir(w, "m-damaged")), "--model", "logistic"],
            None,
            lambda w, st: (copy_traces()(w, st), _truncate(st["tr"])),
        )
    )
    add(
        Case(
            "truncated shard -> collect -> train",
            "2 damaged",
            0,
            lambda w: [],
            lambda w, st: (
                "intact"
                if not st.get("damaged_left") and trace_rows(st["tr"]) == (96, 0)
                else f"LEFT {st.get('damaged_left')} / rows {trace_rows(st['tr'])}"
            ),
            copy_traces(),
            custom=damaged_then_recollect,
        )
    )
    add(
        Case(
            "collect --overwrite removes a set-aside shard",
            "2 damaged",
            0,
            lambda w: collect_argv(w, Path("{tr}"), "--overwrite", "--max-new-tokens", "8"),
            lambda w, st: "intact" if not list((st["tr"] / "data").glob(".damaged-*")) else "LEFT .damaged",
            lambda w, st: (
                copy_traces()(w, st),
                (st["tr"] / "data" / ".damaged-part-r000-000009.parquet").write_bytes(b"x"),
            ),
        )
    )

    # item 3: concurrency and duplicates
    add(
        Case(
            "two collects into one folder at once",
            "3 lock",
            2,
            lambda w: [],
            rows_ok("cc", 24),
            custom=concurrent_collects,
            note="second says busy; the first finishes",
        )
    )
    add(
        Case(
            "train on a prompt in two shards",
            "3 lock",
            2,
            lambda w: ["train", "--traces", "{tr}", "--out", str(cdir(w, "m-dup")), "--model", "logistic"],
            None,
            lambda w, st: (copy_traces()(w, st), _duplicate_shard(st["tr"])),
        )
    )
    add(
        Case(
            "collect into a folder with a prompt in two shards",
            "3 lock",
            2,
            lambda w: collect_argv(w, Path("{tr}"), "--shard-prompts", "2"),
            None,
            lambda w, st: (copy_traces()(w, st), _duplicate_shard(st["tr"])),
        )
    )
    add(Case("kill -9 mid-collect, then resume", "3 lock", 0, lambda w: [], rows_ok("k9", 8), custom=kill9_and_resume))

    # item 4: compare rows
    add(
        Case(
            "compare --policies classifier without --classifier",
            "4 compare",
            2,
            lambda w: [
                "compare",
                *w.pair(),
                "--prompts",
                str(w.prompts),
                "--policies",
                "classifier",
                "--out",
                str(cdir(w, "cmp1")),
            ],
        )
    )
    add(
        Case(
            "compare --policies transformers --no-anchor",
            "4 compare",
            2,
            lambda w: [
                "compare",
                *w.pair(),
                "--prompts",
                str(w.prompts),
                "--policies",
                "transformers",
                "--no-anchor",
                "--out",
                str(cdir(w, "cmp2")),
            ],
        )
    )
    add(
        Case(
            "compare --policies oracle at T 0.7",
            "4 compare",
            2,
            lambda w: [
                "compare",
                *w.pair(),
                "--prompts",
                str(w.prompts),
                "--policies",
                "oracle",
                "--temperature",
                "0.7",
                "--out",
                str(cdir(w, "cmp3")),
            ],
        )
    )
    add(
        Case(
            "compare --policies llama-server on torch",
            "4 compare",
            2,
            lambda w: [
                "compare",
                *w.pair(),
                "--prompts",
                str(w.prompts),
                "--policies",
                "llama-server",
                "--out",
                str(cdir(w, "cmp4")),
            ],
        )
    )
    add(
        Case(
            "compare --policies nope",
            "4 compare",
            2,
            lambda w: [
                "compare",
                *w.pair(),
                "--prompts",
                str(w.prompts),
                "--policies",
                "nope",
                "--out",
                str(cdir(w, "cmp5")),
            ],
        )
    )

    # item 5: file-system errors on outputs
    ro = lambda w: tmpfs(cdir(w, f"ro-{time.monotonic_ns()}"), readonly=True)  # noqa: E731
    add(
        Case(
            "collect --out on a read-only mount", "5 files", 2, lambda w: _on(ro(w), lambda d: collect_argv(w, d / "t"))
        )
    )
    add(
        Case(
            "train --out on a read-only mount",
            "5 files",
            2,
            lambda w: _on(
                ro(w), lambda d: ["train", "--traces", str(w.traces), "--out", str(d / "m"), "--model", "logistic"]
            ),
        )
    )
    add(
        Case(
            "compare --out on a read-only mount",
            "5 files",
            2,
            lambda w: _on(
                ro(w),
                lambda d: [
                    "compare",
                    *w.pair(),
                    "--prompts",
                    str(w.prompts),
                    "--limit",
                    "1",
                    "--policies",
                    "constant",
                    "--out",
                    str(d / "c"),
                ],
            ),
        )
    )
    add(
        Case(
            "generate --json on a read-only mount",
            "5 files",
            2,
            lambda w: _on(ro(w), lambda d: gen(w, "--json", str(d / "o.json"))),
        )
    )
    add(
        Case(
            "profile --out on a read-only mount",
            "5 files",
            2,
            lambda w: _on(
                ro(w),
                lambda d: [
                    "profile",
                    *w.pair(),
                    "--out",
                    str(d / "p.json"),
                    "--max-window",
                    "2",
                    "--repeats",
                    "1",
                    "--warmup",
                    "0",
                    "--context",
                    "8",
                ],
            ),
        )
    )
    add(
        Case(
            "collect onto a full disk",
            "5 files",
            2,
            lambda w: _on(_full(w, "c", 40_000), lambda d: collect_argv(w, d / "t", "--shard-prompts", "1")),
            lambda w, st: _shards_readable(st.get("mount")),
        )
    )
    add(
        Case(
            "train onto a full disk (result rescued)",
            "5 files",
            2,
            lambda w: _on(
                _full(w, "t", 6_000),
                lambda d: [
                    "train",
                    "--traces",
                    str(w.traces),
                    "--out",
                    str(d / "m"),
                    "--model",
                    "logistic",
                    "--no-head",
                ],
            ),
            lambda w, st: _rescued(st, "manifest.json"),
        )
    )
    add(
        Case(
            "generate --json onto a full disk (result rescued)",
            "5 files",
            2,
            lambda w: _on(_full(w, "g", 200), lambda d: gen(w, "--json", str(d / "o.json"))),
            lambda w, st: _rescued(st, ""),
        )
    )
    add(
        Case(
            "profile --out onto a full disk (result rescued)",
            "5 files",
            2,
            lambda w: _on(
                _full(w, "p", 100),
                lambda d: [
                    "profile",
                    *w.pair(),
                    "--out",
                    str(d / "p.json"),
                    "--max-window",
                    "2",
                    "--repeats",
                    "1",
                    "--warmup",
                    "0",
                    "--context",
                    "8",
                ],
            ),
            lambda w, st: _rescued(st, ""),
        )
    )
    add(Case("generate --json names a folder", "5 files", 2, lambda w: gen(w, "--json", str(w.root))))
    add(Case("profile --out names a folder", "5 files", 2, lambda w: ["profile", *w.pair(), "--out", str(w.root)]))
    add(
        Case(
            "compare --out names a file",
            "5 files",
            2,
            lambda w: ["compare", *w.pair(), "--prompts", str(w.prompts), "--out", str(w.prompts)],
        )
    )
    add(
        Case(
            "compare --out a non-empty folder",
            "5 files",
            2,
            lambda w: ["compare", *w.pair(), "--prompts", str(w.prompts), "--out", str(w.root / "target")],
        )
    )
    add(
        Case(
            "compare --overwrite an old run: no stale plot",
            "9 smaller",
            0,
            lambda w: [
                "compare",
                *w.pair(),
                "--prompts",
                str(w.prompts),
                "--limit",
                "1",
                "--max-new-tokens",
                "6",
                "--policies",
                "constant",
                "--overwrite",
                "--out",
                str(cdir(w, "old-compare")),
            ],
            lambda w, st: "intact" if not (cdir(w, "old-compare") / "stale.png").exists() else "STALE plot left",
            lambda w, st: (
                cdir(w, "old-compare").mkdir(parents=True, exist_ok=True),
                (cdir(w, "old-compare") / "stale.png").write_bytes(b"png"),
            ),
        )
    )
    add(
        Case(
            "generate --json keeps the umask's mode",
            "9 smaller",
            0,
            lambda w: gen(w, "--json", str(cdir(w, "mode.json"))),
            lambda w, st: (
                "intact"
                if (cdir(w, "mode.json").stat().st_mode & 0o777) == 0o644
                else f"mode {oct(cdir(w, 'mode.json').stat().st_mode & 0o777)}"
            ),
        )
    )

    # item 6, 7: training size, artifacts checked whole
    add(
        Case(
            "train on 2 prompts",
            "6 train",
            2,
            lambda w: ["train", "--traces", "{tr}", "--out", str(cdir(w, "m-2p")), "--model", "logistic"],
            None,
            lambda w, st: (copy_traces()(w, st), _keep_prompts(st["tr"], 2)),
        )
    )
    add(
        Case(
            "train on 1 prompt",
            "6 train",
            2,
            lambda w: ["train", "--traces", "{tr}", "--out", str(cdir(w, "m-1p")), "--model", "logistic"],
            None,
            lambda w, st: (copy_traces()(w, st), _keep_prompts(st["tr"], 1)),
        )
    )
    for label, fn in [
        ("columns reversed", lambda m, f: m.update(columns=m["columns"][::-1])),
        ("a column dropped", lambda m, f: m.update(columns=m["columns"][:-1])),
        ("threshold edited", lambda m, f: m.update(threshold=0.01)),
        ("rule edited", lambda m, f: m.update(rule="token" if m.get("rule") != "token" else "cumulative")),
        ("calibration edited", lambda m, f: m.update(calibration={"a": 5.0, "b": 0.0})),
        ("cost model edited", lambda m, f: m.update(cost_model={"c_d": 0.0, "c_t": [1.0] * 22})),
    ]:
        add(
            Case(
                f"artifact: {label}",
                "7 artifact",
                2,
                lambda w: gen(w, "--policy", "classifier", "--classifier", "{m}"),
                None,
                edit_manifest(fn),
            )
        )
    add(
        Case(
            "artifact: model file edited",
            "7 artifact",
            2,
            lambda w: gen(w, "--policy", "classifier", "--classifier", "{m}"),
            None,
            lambda w, st: (
                copy_model()(w, st),
                (st["m"] / "model.json").write_text((st["m"] / "model.json").read_text().replace("0.", "0.1", 1)),
            ),
        )
    )
    add(
        Case(
            "artifact: model file missing",
            "7 artifact",
            2,
            lambda w: gen(w, "--policy", "classifier", "--classifier", "{m}"),
            None,
            lambda w, st: (copy_model()(w, st), (st["m"] / "model.json").unlink()),
        )
    )
    add(
        Case(
            "artifact: manifest not JSON",
            "7 artifact",
            2,
            lambda w: gen(w, "--policy", "classifier", "--classifier", "{m}"),
            None,
            lambda w, st: (copy_model()(w, st), (st["m"] / "manifest.json").write_text("{")),
        )
    )
    add(
        Case(
            "artifact: no such folder",
            "7 artifact",
            2,
            lambda w: gen(w, "--policy", "classifier", "--classifier", str(cdir(w, "no-model"))),
        )
    )
    add(
        Case(
            "compare --classifier damaged manifest",
            "7 artifact",
            2,
            lambda w: [
                "compare",
                *w.pair(),
                "--prompts",
                str(w.prompts),
                "--classifier",
                "{m}",
                "--out",
                str(cdir(w, "cmp6")),
            ],
            None,
            lambda w, st: (copy_model()(w, st), (st["m"] / "manifest.json").write_text("{")),
        )
    )
    add(Case("classifier policy without --classifier", "7 artifact", 2, lambda w: gen(w, "--policy", "classifier")))
    add(
        Case(
            "shipped artifact loads (llama.cpp pair refused: other tokenizer)",
            "7 artifact",
            2,
            lambda w: gen(w, "--policy", "classifier", "--classifier", str(ROOT / "models" / "embedded-qwen2.5-coder")),
        )
    )

    # item 8: options that do not apply: refused in both directions
    add(Case("--verify fast on torch", "8 engine", 2, lambda w: gen(w, "--verify", "fast")))
    add(Case("--draft-quant q8_0 on torch", "8 engine", 2, lambda w: gen(w, "--draft-quant", "q8_0")))
    add(Case("--threads 2 on torch", "8 engine", 2, lambda w: gen(w, "--threads", "2")))
    add(Case("--top-p 0.9 with greedy decoding", "8 engine", 2, lambda w: gen(w, "--top-p", "0.9")))
    add(Case("--cache static on llama.cpp", "8 engine", 2, lambda w: gen(w, "--cache", "static", engine="llama.cpp")))
    add(Case("--compile on llama.cpp", "8 engine", 2, lambda w: gen(w, "--compile", engine="llama.cpp")))
    add(
        Case(
            "--cpu-backend eager on llama.cpp",
            "8 engine",
            2,
            lambda w: gen(w, "--cpu-backend", "eager", engine="llama.cpp"),
        )
    )
    add(Case("--dtype float16 on llama.cpp", "8 engine", 2, lambda w: gen(w, "--dtype", "float16", engine="llama.cpp")))
    add(
        Case(
            "--engine llama.cpp --device cuda", "8 engine", 2, lambda w: gen(w, "--device", "cuda", engine="llama.cpp")
        )
    )
    add(Case("--engine nope", "8 engine", 2, lambda w: gen(w, "--engine", "nope")))

    # item 9 and ranges: refused before any model loads
    for label, more in [
        ("--threshold 1.5", ["--threshold", "1.5"]),
        ("--k 0", ["--policy", "constant", "--k", "0"]),
        ("--max-new-tokens 0", ["--max-new-tokens", "0"]),
        ("--temperature -1", ["--temperature", "-1"]),
        ("--top-p 0 at T 0.7", ["--temperature", "0.7", "--top-p", "0"]),
        ("--max-window -1", ["--max-window", "-1"]),
        ("--lambda 2", ["--lambda", "2"]),
        ("--svip-h -1", ["--svip-h", "-1"]),
        ("--threshold nan", ["--threshold", "nan"]),
    ]:
        add(Case(f"generate {label}", "9 ranges", 2, lambda w, more=more: gen(w, *more)))
    add(
        Case(
            "generate --threads 0 on llama.cpp",
            "9 ranges",
            2,
            lambda w: [
                "generate",
                "--target",
                str(w.gtarget),
                "--draft",
                str(w.gdraft),
                "--threads",
                "0",
                "--prompt",
                "x",
            ],
        )
    )
    add(
        Case(
            "collect --shard-prompts 0",
            "9 ranges",
            2,
            lambda w: collect_argv(w, cdir(w, "sp0"), "--shard-prompts", "0"),
        )
    )
    add(Case("collect --limit 0", "9 ranges", 2, lambda w: collect_argv(w, cdir(w, "lim0"), "--limit", "0")))
    add(
        Case(
            "compare --seeds 0",
            "9 ranges",
            2,
            lambda w: [
                "compare",
                *w.pair(),
                "--prompts",
                str(w.prompts),
                "--seeds",
                "0",
                "--out",
                str(cdir(w, "cmp7")),
            ],
        )
    )
    add(
        Case(
            "compare --seeds 3 greedy",
            "9 ranges",
            2,
            lambda w: [
                "compare",
                *w.pair(),
                "--prompts",
                str(w.prompts),
                "--seeds",
                "3",
                "--out",
                str(cdir(w, "cmp8")),
            ],
        )
    )
    add(
        Case(
            "train --val-fraction 1.5",
            "9 ranges",
            2,
            lambda w: ["train", "--traces", str(w.traces), "--out", str(cdir(w, "m-vf")), "--val-fraction", "1.5"],
        )
    )
    add(
        Case(
            "train --max-window 0",
            "9 ranges",
            2,
            lambda w: ["train", "--traces", str(w.traces), "--out", str(cdir(w, "m-mw")), "--max-window", "0"],
        )
    )
    add(Case("profile --repeats 0", "9 ranges", 2, lambda w: ["profile", *w.pair(), "--repeats", "0"]))

    # inputs a user gets wrong
    add(Case("--prompts a folder", "9 smaller", 2, lambda w: ["generate", *w.pair(), "--prompts", str(w.root)]))
    add(
        Case(
            "--prompts missing file",
            "inputs",
            2,
            lambda w: ["generate", *w.pair(), "--prompts", str(cdir(w, "nope.jsonl"))],
        )
    )
    add(
        Case(
            "--prompts bad JSONL",
            "inputs",
            2,
            lambda w: ["generate", *w.pair(), "--prompts", str(prompts_file(w, "bad.jsonl", b'{"id": 1,\n'))],
        )
    )
    add(
        Case(
            "--prompts not UTF-8",
            "inputs",
            2,
            lambda w: ["generate", *w.pair(), "--prompts", str(prompts_file(w, "bin.jsonl", b"\xff\xfe\x00\x81"))],
        )
    )
    add(
        Case(
            "--prompts a whitespace prompt (generate)",
            "9 smaller",
            2,
            lambda w: [
                "generate",
                *w.pair(),
                "--prompts",
                str(prompts_file(w, "ws.jsonl", b'{"id": "blank-1", "prompt": "   "}\n')),
            ],
        )
    )
    add(
        Case(
            "--prompts a whitespace prompt (compare)",
            "9 smaller",
            2,
            lambda w: [
                "compare",
                *w.pair(),
                "--out",
                str(cdir(w, "cmp9")),
                "--prompts",
                str(prompts_file(w, "ws2.jsonl", b'{"id": "a", "prompt": "x"}\n{"id": "blank-2", "prompt": "\\t"}\n')),
            ],
        )
    )
    add(Case("--prompt empty", "inputs", 2, lambda w: ["generate", *w.pair(), "--prompt", "  "]))
    add(
        Case(
            "--target missing folder",
            "inputs",
            2,
            lambda w: ["generate", "--target", str(cdir(w, "none")), "--draft", str(w.draft), "--prompt", "x"],
        )
    )
    add(
        Case(
            "--target damaged config.json",
            "inputs",
            2,
            lambda w: ["generate", "--target", "{bad}", "--draft", str(w.draft), "--prompt", "x", "--device", "cpu"],
            None,
            lambda w, st: (
                st.update(bad=w.fresh(w.target, f"badcfg-{time.monotonic_ns()}")),
                (st["bad"] / "config.json").write_text("{nope"),
            ),
        )
    )
    add(
        Case(
            "--target a truncated GGUF",
            "9 smaller",
            2,
            lambda w: ["generate", "--target", "{g}", "--draft", str(w.gdraft), "--prompt", "x", "--threads", "1"],
            None,
            lambda w, st: st.update(g=_truncated_copy(w.gtarget, cdir(w, "cut.gguf"))),
        )
    )
    add(
        Case(
            "--target a .gguf that is not GGUF",
            "inputs",
            2,
            lambda w: [
                "generate",
                "--target",
                str(prompts_file(w, "fake.gguf", b"not a gguf" * 100)),
                "--draft",
                str(w.gdraft),
                "--prompt",
                "x",
            ],
        )
    )
    add(
        Case(
            "--pair bad YAML",
            "inputs",
            2,
            lambda w: ["generate", "--pair", str(prompts_file(w, "bad.yaml", b"target: [\n")), "--prompt", "x"],
        )
    )
    add(
        Case(
            "train --traces missing",
            "inputs",
            2,
            lambda w: ["train", "--traces", str(cdir(w, "no-traces")), "--out", str(cdir(w, "m-nt"))],
        )
    )
    add(
        Case(
            "train --profile not JSON",
            "inputs",
            2,
            lambda w: [
                "train",
                "--traces",
                str(w.traces),
                "--out",
                str(cdir(w, "m-np")),
                "--profile",
                str(prompts_file(w, "p.json", b"{")),
            ],
        )
    )
    add(
        Case(
            "mismatched tokenizer pair",
            "inputs",
            2,
            lambda w: ["generate", "--target", str(w.gtarget), "--draft", str(w.draft), "--prompt", "x"],
        )
    )

    # what works (so the refusals are not all there is)
    add(Case("generate (torch) works", "works", 0, lambda w: gen(w, "--json", str(cdir(w, "ok.json")))))
    add(Case("generate (llama.cpp) works", "works", 0, lambda w: gen(w, engine="llama.cpp")))
    add(
        Case(
            "generate --policy classifier works",
            "works",
            0,
            lambda w: gen(w, "--policy", "classifier", "--classifier", str(w.model)),
        )
    )
    add(
        Case(
            "compare (2 rows) works",
            "works",
            0,
            lambda w: [
                "compare",
                *w.pair(),
                "--prompts",
                str(w.prompts),
                "--limit",
                "1",
                "--max-new-tokens",
                "6",
                "--policies",
                "constant,threshold",
                "--out",
                str(cdir(w, "cmp-ok")),
            ],
        )
    )
    add(
        Case(
            "collect rerun of a finished folder does nothing",
            "works",
            0,
            lambda w: collect_argv(w, Path("{tr}"), "--shard-prompts", "2"),
            traces_intact(),
            copy_traces(),
        )
    )
    return C


def _on(mount: Path | None, argv: Callable[[Path], list[str]]) -> list[str] | None:
    return None if mount is None else argv(mount)


def _full(w: World, name: str, leave: int) -> Path | None:
    return tmpfs(w.root / "cases" / f"full-{name}-{time.monotonic_ns()}", size="1m", leave=leave)


def _shards_readable(mount: Path | None) -> str:
    """After a full disk: every shard collect left is whole (no torn one reads as complete)."""
    import pyarrow.parquet as pq

    if mount is None:
        return "-"
    for f in (mount / "t" / "data").glob("part-*.parquet"):
        try:
            pq.read_table(f)
        except Exception:  # noqa: BLE001
            return f"LOST (torn shard {f.name})"
    return "intact"


def _rescued(st: dict, name: str) -> str:
    """The finished result is where the message says."""
    msg = st.get("message", "")
    if "saved in " not in msg:
        return "LOST (no rescue named)"
    where = Path(msg.split("saved in ", 1)[1].split(" instead")[0])
    return "intact (rescued)" if (where / name if name else where).exists() else f"LOST ({where} missing)"


def _truncate(tr: Path) -> None:
    shard = sorted((tr / "data").glob("part-*.parquet"))[1]
    shard.write_bytes(shard.read_bytes()[:200])


def _duplicate_shard(tr: Path) -> None:
    shards = sorted((tr / "data").glob("part-*.parquet"))
    shutil.copy(shards[0], tr / "data" / "part-r000-000099.parquet")


def _keep_prompts(tr: Path, n: int) -> None:
    import pandas as pd

    shards = sorted((tr / "data").glob("part-*.parquet"))
    df = pd.concat([pd.read_parquet(s) for s in shards])
    keep = sorted(df["prompt_id"].unique())[:n]
    for s in shards:
        s.unlink()
    df[df["prompt_id"].isin(keep)].to_parquet(tr / "data" / "part-r000-000000.parquet", index=False)


def _truncated_copy(src: Path, dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    data = src.read_bytes()
    dest.write_bytes(data[: len(data) * 2 // 3])
    return dest


def message_of(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith(("error:", "warning:")):
            return ln
    return lines[0] if lines else ""


def markdown(results: list[dict]) -> str:
    """The table for bench/RESULTS.md: case -> exit code -> first line of the message."""
    lines = ["| # | group | case | exit | message (first line) | traceback | data |", "|---|---|---|---|---|---|---|"]
    for i, r in enumerate(results, 1):
        if "skipped" in r:
            lines.append(f"| {i} | {r['group']} | {r['case']} | – | skipped: {r['skipped']} | – | – |")
            continue
        msg = re.sub(r"-\d{9,}", "", r["message"].replace("|", "\\|").replace(str(Path("/tmp/disco-battery")), "W"))
        msg = re.sub(r"/tmp/disco-(\w+)-\w+", r"/tmp/disco-\1-…", msg)
        msg = msg if msg.startswith(("error:", "warning:")) else "(no error; " + msg[:60] + ")"
        lines.append(
            f"| {i} | {r['group']} | {r['case']} | {r['exit']} | {msg} | {'YES' if r['traceback'] else 'no'} "
            f"| {r['data']} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/disco-battery"))
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "battery-results.json")
    ap.add_argument("--only", default="")
    ap.add_argument("--markdown", action="store_true", help="print the table of an earlier run's --out and stop")
    args = ap.parse_args()
    if args.markdown:
        print(markdown(json.loads(args.out.read_text())))
        return
    shutil.rmtree(args.work / "cases", ignore_errors=True)
    world = build(args.work)
    results = []
    try:
        for case in cases():
            if args.only and args.only not in case.name:
                continue
            st: dict = {}
            t0 = time.monotonic()
            if case.setup is not None:
                case.setup(world, st)
            if case.custom is not None:
                proc = case.custom(world, st)
            else:
                argv = case.argv(world)
                if argv is None:
                    results.append({"case": case.name, "group": case.group, "skipped": "needs root (tmpfs mounts)"})
                    continue
                st["mount"] = next((Path(a).parent for a in argv if "/full-" in a or "/ro-" in a), None)
                argv = [a.format(**{k: v for k, v in st.items() if isinstance(v, Path)}) for a in argv]
                proc = run(argv)
            st["message"] = message_of(proc.stderr)
            data = case.data(world, st) if case.data is not None else "-"
            row = {
                "case": case.name,
                "group": case.group,
                "expect": case.expect,
                "exit": proc.returncode,
                "message": st["message"],
                "traceback": "Traceback" in proc.stderr,
                "data": data,
                "seconds": round(time.monotonic() - t0, 1),
                "note": case.note,
            }
            row["ok"] = (
                row["exit"] == case.expect
                and not row["traceback"]
                and not str(data).startswith(("LOST", "DUP", "STALE", "LEFT", "mode"))
            )
            results.append(row)
            print(
                f"{'ok ' if row['ok'] else 'BAD'} {row['exit']:>3} {case.name}: {row['message'][:150]} [{data}]",
                flush=True,
            )
    finally:
        unmount_all()
    args.out.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    ran = [r for r in results if "skipped" not in r]
    print(
        f"\n{len(ran)} cases ({len(results) - len(ran)} skipped): {sum(r['ok'] for r in ran)} as expected, "
        f"{sum(r['traceback'] for r in ran)} tracebacks, "
        f"{sum(str(r['data']).startswith('LOST') for r in ran)} data lost, "
        f"{sum(str(r['data']).startswith('DUP') for r in ran)} duplicated"
    )


if __name__ == "__main__":
    main()
