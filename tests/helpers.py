"""Helpers the test files share (tests/conftest.py holds the shared fixtures, tests/tiny.py and
tests/tiny_gguf.py the tiny models): the CLI run in-process and its command lines, its one error line,
the collect tests' prompts and settings, hand-made traces, stand-in classifiers, and `vllm serve`'s
process. A test file imports these from here, never from another test file."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from disco.cli.cli import main
from disco.core.features import FEATURES, TOKEN_CLASSES, TOKEN_FEATURES, WINDOW_FEATURES, WindowState, token_features
from disco.formats.prompts import Prompt
from disco.formats.trace import COLUMNS, HIDDEN_COLUMN, signals_at
from disco.jobs.collect import trace_prompt
from disco.loop.decode import DecodeConfig, GenStats
from disco.loop.pair import Pair
from disco.policies.policy import OraclePolicy

# --- the command line ------------------------------------------------------------------------------


def cli(capsys, *args):
    """Run the real entry point in-process; return (exit code, stdout, stderr)."""
    argv = sys.argv
    sys.argv = ["disco", *map(str, args)]
    code = 0
    try:
        main()
    except SystemExit as e:
        code = e.code or 0
    finally:
        sys.argv = argv
    out = capsys.readouterr()
    return code, out.out, out.err


def cli_args(command: str, *more, **options) -> list:
    """A command line: the command, each option as its flag in the order given (max_new_tokens=12 ->
    --max-new-tokens 12; True -> the bare flag; None or False -> left out), then `more` as it is."""
    args: list = [command]
    for name, value in options.items():
        if value is None or value is False:
            continue
        args += [f"--{name.replace('_', '-')}"] + ([] if value is True else [value])
    return [*args, *more]


def collect_args(target, draft, prompts, out, *more, **options) -> list:
    """`disco collect` of a pair on its prompts into `out`; the options and `more` as cli_args takes them."""
    return cli_args("collect", *more, target=target, draft=draft, prompts=prompts, out=out, **options)


def one_error_line(err: str) -> str:
    """The error line, asserting it is the only error and no traceback came with it."""
    assert "Traceback" not in err, err
    errors = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, err
    return errors[0]


# --- the collector -----------------------------------------------------------------------------------


def make_prompts(n, task="code"):
    return [Prompt(f"{task}-{i:03d}", task, f"def f{i}(x):\n    return x * {i}") for i in range(n)]


CONFIG = DecodeConfig(max_new_tokens=12, max_window=5)  # the collect tests' settings on the `pair32` fixture


class RecordingOracle(OraclePolicy):
    """The oracle policy, recording the features a live policy computes at each draft step (the
    target-side signals included) and the draft's hidden state the loop hands it."""

    needs_hidden = True

    def __init__(self, target_tokens, token_classes):
        super().__init__(target_tokens)
        self.token_classes, self.state, self.window, self.rows = token_classes, WindowState(), -1, []

    def start(self):
        self.state.start()
        self.window += 1

    def should_stop(self, step):
        tok = token_features(step.probs, step.token, step.gen_pos, step.context(), self.token_classes)
        feats = self.state.step(tok, step.window_pos)
        self.rows.append(
            {
                "gen_pos": step.gen_pos,
                "window_id": self.window,
                "draft_token": int(step.token),
                "features": feats.numpy(),
                "hidden": step.hidden.numpy(),
            }
        )
        return super().should_stop(step)

    def update(self, n_drafted, n_accepted, signals=None):
        self.state.end(n_drafted, n_accepted, signals())


# A process that dies at its 4th prompt as under SIGKILL (os._exit: no handler, no flush runs).
KILLED_AT_4TH_PROMPT = """
import os, sys
import disco.jobs.collect as c
real, calls = c.teacher_forced_trace, []
def trace(*args, **kwargs):
    calls.append(1)
    if len(calls) == 4:
        os._exit(9)
    return real(*args, **kwargs)
c.teacher_forced_trace = trace
sys.argv = ["disco", *sys.argv[1:]]
from disco.cli.cli import main
main()
"""


# --- hand-made traces ----------------------------------------------------------------------------------


def trace_frame(
    prompt_id: str,
    tok_feats: torch.Tensor,
    draft_tokens,
    target_tokens,
    max_window: int = 20,
    max_new: int | None = None,
    task: str = "t",
) -> pd.DataFrame:
    """Trace rows in the schema of disco/formats/trace.py, with the oracle's windows as the collector marks them."""
    L = len(target_tokens)
    max_new = L if max_new is None else max_new
    labels = [int(d == t) for d, t in zip(draft_tokens, target_tokens)]
    # target-side signal columns: varied, so a policy reading them sees different windows differently
    top1, ent = np.full(L, 0.9), 0.1 + 0.01 * np.arange(L)
    dpt = np.where(labels, tok_feats[:, TOKEN_FEATURES.index("p_chosen")].numpy(), 0.3)
    window = torch.zeros(L, len(WINDOW_FEATURES))
    window_id, drafted = [-1] * L, [False] * L
    state, out, wid = WindowState(), 0, 0
    while out < L:  # the oracle loop: draft until the first mismatch or the window cap
        k_max, k = min(max_window, max_new - out - 1), 0
        state.start()
        for pos in range(1, k_max + 1):
            j = out + pos - 1
            if j >= L:
                break
            window[j] = state.step(tok_feats[j], pos)[len(TOKEN_FEATURES) :]
            window_id[j], drafted[j], k = wid, True, pos
            if not labels[j]:
                break
        n = int(np.cumprod(labels[out : out + k]).sum())
        end = out + n
        state.end(k, n, signals_at(top1[end], ent[end], dpt[end], n < k) if end < L else None)
        wid += k > 0
        out += min(n + 1, L - out)
    feats = torch.cat([tok_feats, window], 1).double().numpy()
    df = pd.DataFrame(feats, columns=list(FEATURES))
    p = df["p_chosen"]
    df = df.assign(
        prompt_id=prompt_id,
        task=task,
        gen_pos=np.arange(L),
        window_id=window_id,
        oracle_drafted=drafted,
        label=labels,
        draft_token=list(draft_tokens),
        target_token=list(target_tokens),
        draft_prob=p,
        target_prob=np.where(labels, 0.9, 0.05),
        accept_prob=1.0,
        overlap=0.5,
        target_top1=top1,
        target_prob_target=top1,
        target_entropy=ent,
        draft_prob_target=dpt,
    )
    # a 4-dim "hidden state" per position, float16 bytes as the collector stores it
    hid = np.stack([df["p_chosen"], df["entropy"], np.sin(np.arange(L)), np.ones(L)], 1).astype(np.float16)
    df[HIDDEN_COLUMN] = [row.tobytes() for row in hid]
    df["gen_pos"] = df["gen_pos"].astype(float)  # the FEATURES column doubles as the id column
    return df[list(dict.fromkeys(COLUMNS))]


def synthetic_token_feats(p_chosen, copy=None) -> torch.Tensor:
    """Token features of greedy draft tokens whose top-1 probability is p_chosen."""
    L = len(p_chosen)
    rows = []
    for j, p in enumerate(p_chosen):
        rest = (1 - p) * 0.5 ** np.arange(1, 10)  # a geometric tail for p_top2..p_top10
        top = np.concatenate([[p], rest])
        probs = np.concatenate([top, [max(1 - top.sum(), 1e-9)]])
        entropy = float(-(probs * np.log(probs)).sum())
        c = 0.0 if copy is None else float(copy[j])
        klass = np.eye(len(TOKEN_CLASSES))[TOKEN_CLASSES.index("word")]
        rows.append([*top, entropy, top[0] - top[1], p, j, c, c, c, *klass])
    assert len(rows[0]) == len(TOKEN_FEATURES)
    return torch.tensor(rows, dtype=torch.float32).reshape(L, len(TOKEN_FEATURES))


def synthetic_trace(prompt_id: str, labels, p_chosen=None, copy=None, **kw) -> pd.DataFrame:
    labels = list(labels)
    p = p_chosen if p_chosen is not None else [0.9 if ok else 0.3 for ok in labels]
    target = [3 + (7 * j) % 50 for j in range(len(labels))]
    draft = [t if ok else t + 1 for t, ok in zip(target, labels)]
    return trace_frame(prompt_id, synthetic_token_feats(p, copy), draft, target, **kw)


def random_traces(n_prompts: int, length: int, seed: int = 0) -> pd.DataFrame:
    """Prompts whose acceptance depends on the draft's confidence and, beyond it, on the copy flag
    (a signal a threshold on p_chosen cannot use)."""
    rng = np.random.default_rng(seed)
    frames = []
    for i in range(n_prompts):
        p = rng.beta(4, 1.5, length)
        copy = rng.random(length) < 0.3
        accept = rng.random(length) < np.clip(0.15 + 0.6 * p + 0.35 * copy - 0.25 * (~copy), 0.02, 0.98)
        frames.append(synthetic_trace(f"p{i}", accept, p, copy, task="code" if i % 2 else "write"))
    return pd.concat(frames, ignore_index=True)


def collected_trace(
    target, draft, prompt: list[int], max_new: int, table: torch.Tensor, prompt_id: str, max_window: int = 20
) -> pd.DataFrame:
    """The trace `disco collect` writes for one prompt (no EOS: y runs to the budget)."""
    pair = Pair(target, draft, None, "t", "d", torch.device("cpu"), torch.float64, frozenset())
    return trace_prompt(pair, prompt, DecodeConfig(max_new, max_window), table, prompt_id).to_pandas()


# --- a stand-in classifier, and the counts a run is compared by ----------------------------------------


class ProbModel:
    """A stand-in classifier: P(accept) is a fixed function of the FEATURES vector. Logs every call."""

    def __init__(self, fn):
        self.fn, self.seen = fn, []

    def predict_proba(self, X):
        self.seen += [dict(zip(FEATURES, row)) for row in X]
        return np.array([self.fn(dict(zip(FEATURES, row))) for row in X])

    def torch_predictor(self, device):
        return lambda x: torch.tensor(self.predict_proba(x.double().cpu().numpy()[None])[0])


def counts(s: GenStats) -> tuple:
    return s.new_tokens, s.target_forwards, s.draft_forwards, s.windows, s.accepted_per_window


PAIR = {"target": "/models/tiny-target", "draft": "/models/tiny-draft", "tokenizer_hash": "abc"}


def write_traces(folder: Path, df, pair=PAIR, max_new=None, manifest=True) -> Path:
    folder.mkdir(parents=True)
    df.to_parquet(folder / "shard-00000.parquet")
    if manifest:
        (folder / "manifest.json").write_text(
            json.dumps({"pair": pair, "features": list(FEATURES), "max_new_tokens": max_new})
        )
    return folder


# --- `vllm serve` as a process ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(proc: subprocess.Popen, port: int, timeout: float = 240) -> bool:
    import urllib.request

    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            time.sleep(1)
    return False


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
