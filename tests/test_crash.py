"""Issue 30, item 3: a native crash never takes a run down. In the tests, a test that kills its process
fails alone, with its signal, and the suite reaches its summary line (pytest-xdist, tests/conftest.py).
On the command line, a command whose engine dies by a signal says so in one line, keeps what finished,
and exits non-zero (disco/base/crash.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import cli, collect_args, one_error_line
from tiny import char_tokenizer, save_tiny, tiny_pair

from disco.base import crash
from disco.base.errors import DiscoError

ROOT = Path(__file__).resolve().parent.parent

SUITE = """
import os, signal

def test_dies_in_native_code():
    os.kill(os.getpid(), signal.SIGSEGV)

def test_after_it():
    assert True
"""


def test_a_test_that_crashes_fails_alone_and_the_suite_reaches_its_summary(tmp_path):
    (tmp_path / "test_suite.py").write_text(SUITE)
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path)  # the hook that names the signal
    proc = subprocess.run(  # the project's pytest options (pyproject.toml: addopts), on that file
        [sys.executable, "-m", "pytest", "-q", "-c", ROOT / "pyproject.toml", "--rootdir", tmp_path, tmp_path],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert re.search(r"^1 failed, 1 passed in ", proc.stdout, re.M), out
    crashed = "test_suite.py::test_dies_in_native_code"
    assert f"killed by SIGSEGV (Segmentation fault): worker 'gw0' crashed while running '{crashed}'" in out
    assert re.search(rf"^FAILED {crashed} - killed by SIG", proc.stdout, re.M), out


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    target, draft = tiny_pair(noise=0.3, dtype=torch.float32)
    tok = char_tokenizer()
    prompts = root / "p.jsonl"
    prompts.write_text(  # the second prompt is long: the stand-in crash below fires on its prefill
        json.dumps({"id": "p0", "task": "code", "prompt": "def f(x):"})
        + "\n"
        + json.dumps({"id": "p1", "task": "code", "prompt": "def g(x):\n    return " + "x + " * 12 + "x"})
        + "\n"
    )
    return {
        "target": save_tiny(target, tok, root / "target"),
        "draft": save_tiny(draft, tok, root / "draft"),
        "prompts": prompts,
    }


# The installed command's entry point, with a child that stands in for a crash in the torch engine's native
# code: a forward of 30 tokens or more (the second prompt's prefill) kills the process with SIGSEGV.
PARENT = """
import sys
import disco.cli.cli as cli
cli._CHILD = '''
import os, signal
import disco.engines.torch.torch_engine as engine
real = engine._forward
def forward(model, cache, tokens, *args, **kwargs):
    if len(tokens) >= 30:
        os.kill(os.getpid(), signal.SIGSEGV)
    return real(model, cache, tokens, *args, **kwargs)
engine._forward = forward
''' + cli._CHILD
sys.argv[0] = "disco"
cli.entry()
"""


def disco(*args, crash: bool = True) -> subprocess.CompletedProcess:
    code = PARENT if crash else "import sys; sys.argv[0] = 'disco'; from disco.cli.cli import entry; entry()"
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def crash_line(err: str, engine: str = "torch") -> str:
    """The one error line of a crashed engine, nothing else said about it, its Python stacks file removed."""
    assert "Traceback" not in err and "Fatal Python error" not in err, err
    errors = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, err
    line = errors[0]
    assert line.startswith(f"error: the {engine} engine crashed in native code (SIGSEGV, Segmentation fault, under ")
    stacks = Path(line.rsplit("(Python stacks: ", 1)[1].rstrip(")"))
    assert "disco/engines/torch/torch_engine.py" in stacks.read_text()
    stacks.unlink()
    return line


def test_compare_crashed_says_one_line_and_keeps_the_finished_rows(pair, tmp_path):
    out = tmp_path / "cmp"
    args = ["compare", "--target", pair["target"], "--draft", pair["draft"], "--prompts", pair["prompts"]]
    proc = disco(*args, "--out", out, "--policies", "constant", "--max-new-tokens", 8, "--device", "cpu")
    assert proc.returncode == 128 + signal.SIGSEGV, proc.stderr[-3000:]
    line = crash_line(proc.stderr)
    partial = tmp_path / "cmp.partial.jsonl"
    assert ": try --cpu-backend eager; " in line
    assert f"; the rows of 1 finished prompt are kept in {partial} (" in line
    rows = [json.loads(r) for r in partial.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["p0"] and set(rows[0]["runs"]) == {"target", "constant k=5"}
    assert not out.exists()
    proc = disco(*args, "--out", out, "--policies", "constant", "--max-new-tokens", 8, "--device", "cpu", crash=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["id"] for r in json.loads((out / "compare.json").read_text())["prompts"]] == ["p0", "p1"]
    assert not partial.exists()  # the whole result written: the partial rows are gone


def test_an_engine_error_in_compare_also_says_where_the_finished_rows_are(pair, tmp_path, capsys, monkeypatch):
    import disco.jobs.runner

    real = disco.jobs.runner.target_generate

    def target_generate(target, ids, *args, **kwargs):  # the second prompt's engine fails (llama-server died)
        if len(ids) >= 30:
            raise DiscoError("llama-server request /completion failed (connection reset); server exit code -11")
        return real(target, ids, *args, **kwargs)

    monkeypatch.setattr(disco.jobs.runner, "target_generate", target_generate)
    out = tmp_path / "cmp"
    args = ["compare", "--target", pair["target"], "--draft", pair["draft"], "--prompts", pair["prompts"]]
    code, _, err = cli(capsys, *args, "--out", out, "--policies", "constant", "--max-new-tokens", 8, "--device", "cpu")
    assert code == 2
    assert one_error_line(err).endswith(
        f"server exit code -11; the rows of 1 finished prompt are kept in {tmp_path / 'cmp.partial.jsonl'}"
    )
    assert [json.loads(r)["id"] for r in (tmp_path / "cmp.partial.jsonl").read_text().splitlines()] == ["p0"]


def test_collect_crashed_keeps_its_shards_and_resumes(pair, tmp_path):
    out = tmp_path / "traces"
    args = collect_args(
        pair["target"], pair["draft"], pair["prompts"], out, max_new_tokens=8, device="cpu", shard_prompts=1
    )
    proc = disco(*args)
    assert proc.returncode == 128 + signal.SIGSEGV, proc.stderr[-3000:]
    assert f"the finished shards are kept in {out}: rerun the same command to resume" in crash_line(proc.stderr)
    assert len(list((out / "data").glob("part-*.parquet"))) == 1
    proc = disco(*args, crash=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "1 already done" in proc.stderr


REPORT = """Fatal Python error: Segmentation fault

Thread 0x00007f0000000001 (most recent call first):
  File "/x/disco/engines/torch/torch_engine.py", line 10 in other_thread

Current thread 0x00007f0000000000 (most recent call first):
  File "/x/site-packages/llama_cpp/llama_cpp.py", line 99 in llama_decode
  File "/x/disco/engines/llamacpp/llamacpp.py", line 412 in forward
  File "/x/disco/loop/decode.py", line 50 in target_generate
"""


def test_the_engine_is_named_from_the_crashing_threads_innermost_engine_frame():
    assert crash.innermost_engine(REPORT) == ("llama.cpp", "disco/engines/llamacpp/llamacpp.py:412")
    assert crash.innermost_engine(REPORT.replace("disco/engines/llamacpp/llamacpp.py", "disco/loop/pair.py")) is None
    line = crash.describe("demo", signal.SIGSEGV, REPORT, "", "/tmp/r.txt", lambda: {"--engine", "--repack"})
    assert line == (
        "error: the llama.cpp engine crashed in native code (SIGSEGV, Segmentation fault, under "
        "disco/engines/llamacpp/llamacpp.py:412): try --repack off or --engine torch (Python stacks: /tmp/r.txt)"
    )
    assert ": try --engine torch (" in crash.describe("demo", signal.SIGSEGV, REPORT, "", "r", lambda: {"--engine"})
    killed = crash.describe("collect", signal.SIGKILL, "", "the shards are kept in t", "r", set)
    assert killed == (
        "error: disco collect was stopped by SIGKILL, Killed: the system may have run out of memory; "
        "the shards are kept in t"
    )
