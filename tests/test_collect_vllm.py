"""`disco collect --engine vllm` on tiny float32 Qwen2 models (head size 64, which vLLM's CPU attention takes):
its rows equal the torch collector's where both compute the same numbers, an interrupted or killed run resumes
to exactly the rows of an uninterrupted one, two ranks write the rows of one, sampled continuations follow
each prompt's own seed, `disco train` refuses the target signals such traces lack, and bad input fails in one
line before anything is written. One vLLM instance serves the in-process tests (a start is ~5-15 s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import KILLED_AT_4TH_PROMPT, cli, collect_args, free_port
from tiny import char_tokenizer, perturbed, save_char_tiny, tiny_vllm_qwen
from tiny_gguf import write_tiny_gguf

import disco.jobs.collect as collect_mod
from disco.base.errors import DiscoError
from disco.base.options import PairOptions
from disco.core.features import FEATURES, TARGET_SIGNALS, TOKEN_FEATURES
from disco.formats.prompts import load_prompt_sources
from disco.formats.trace import HIDDEN_COLUMN, read_manifest, read_trace_rows
from disco.jobs.collect import collect
from disco.loop.decode import DecodeConfig
from disco.loop.pair import load_pair
from disco.training.train import TrainConfig, train
from disco.vllm.engine import SpecConfig

ROOT = Path(__file__).resolve().parent.parent
CONFIG = DecodeConfig(max_new_tokens=16, max_window=5)
TOKEN_INFO = ["prompt_id", "task", "gen_pos", "window_id", "oracle_drafted", "label", "draft_token", "target_token"]
# the draft's side, which both collectors compute (vLLM's traces have no target side)
DRAFT_SIDE = [f for f in FEATURES if f not in TARGET_SIGNALS and f != "gen_pos"] + ["draft_prob", "draft_prob_target"]
TARGET_SIDE = ["target_prob", "accept_prob", "overlap", "target_top1", "target_entropy", "target_prob_target"]
TEXTS = [
    "def add(a, b):\n    return",
    "Hello, world! The quick brown fox",
    "x = [1, 2, 3]",
    "ab",
    "zz top 12",
    "for i in range(10):",
    "Dear friend,",
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("collect-vllm")
    target = tiny_vllm_qwen()
    draft = perturbed(target, 0.1)  # accepts often, rejects sometimes: both labels
    prompts = root / "p.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "task": ["code", "write"][i % 2], "prompt": t}) + "\n"
            for i, t in enumerate(TEXTS)
        )
    )
    return save_char_tiny(target, root / "target"), save_char_tiny(draft, root / "draft"), prompts


@pytest.fixture(scope="module")
def prompts(folders):
    return load_prompt_sources([str(folders[2])])


@pytest.fixture(scope="module")
def vpair(folders):
    target, draft, _ = folders
    p = load_pair(PairOptions(target=str(target), draft=str(draft), engine="vllm", dtype="float32"))
    yield p
    p.target_engine.close()


@pytest.fixture(scope="module")
def reference(vpair, prompts, tmp_path_factory):
    """An uninterrupted single-process run: the folder every other run must equal."""
    out = tmp_path_factory.mktemp("ref") / "traces"
    stats = collect(vpair, prompts, out, CONFIG, shard_prompts=3, progress=False, max_batch=4)
    assert stats.prompts_traced == len(TEXTS) and stats.manifest is not None
    return out


def vllm_collect_args(folders, out, *more) -> list:
    """`disco collect --engine vllm` of the pair on its prompts into `out`, at CONFIG's settings, 4 at once."""
    settings = {"max_new_tokens": CONFIG.max_new_tokens, "max_window": CONFIG.max_window, "max_batch": 4}
    return collect_args(*folders, out, *more, engine="vllm", dtype="float32", **settings)


# --- the rows ---------------------------------------------------------------------------------------


def test_rows_equal_the_torch_collectors(folders, reference, prompts, tmp_path):
    """float32 on both: vLLM's continuations are the torch engine's, token for token, and the features the
    same within rtol 1e-4 / atol 2e-5 (the torch engine's oneDNN Linear layers against eager torch: each
    probability within 1e-5, measured up to 5.1e-6 on an AVX2-only AMD EPYC; the margin, a difference of two,
    within twice that, measured 1.02e-5 there); the hidden states within float16's rounding. vLLM's traces
    have no target side: NaN there, and said so."""
    target, draft, _ = folders
    tpair = load_pair(PairOptions(target=str(target), draft=str(draft), engine="torch", dtype="float32", device="cpu"))
    collect(tpair, prompts, tmp_path / "torch", CONFIG, progress=False)
    v, t = read_trace_rows(reference), read_trace_rows(tmp_path / "torch")
    pd.testing.assert_frame_equal(v[TOKEN_INFO], t[TOKEN_INFO])
    assert 0 < v["label"].mean() < 1  # both labels occur
    pd.testing.assert_frame_equal(v[DRAFT_SIDE], t[DRAFT_SIDE], check_exact=False, rtol=1e-4, atol=2e-5)
    hv, ht = (np.frombuffer(b"".join(df[HIDDEN_COLUMN]), np.float16).astype(np.float32) for df in (v, t))
    np.testing.assert_allclose(hv, ht, rtol=1e-2, atol=1e-2)
    assert v[TARGET_SIDE + list(TARGET_SIGNALS)].isna().all().all()
    assert t[TARGET_SIDE + list(TARGET_SIGNALS)].notna().all().all()

    m = read_manifest(reference)
    engine = m["pair"]["engine"]
    assert engine["name"] == "vllm" and engine["version"] and engine["dtype"] == "float32"
    assert engine["draft_engine"]["name"] == "torch" and m["pair"]["dtype"] == "float32"
    assert m["collection"]["target_signals"] is False and "at most 4 requests" in m["collection"]["continuations"]
    assert m["collection"]["features"].startswith("torch float32 on ")
    assert m["status"]["complete"] and m["status"]["rows"] == len(v)
    assert read_manifest(tmp_path / "torch")["collection"]["target_signals"] is True
    whole = pd.read_parquet(reference / "data")  # shards as pandas reads them
    assert len(whole) == len(v) and whole["label"].dtype == np.int64


def test_interrupted_run_resumes_to_the_same_rows(vpair, prompts, reference, tmp_path, monkeypatch):
    """Ctrl-C while tracing the 4th continuation vLLM handed over: the 3 traced prompts are kept, the 4th
    (finished, not written) and the requests still running are dropped (vLLM keeps none) and redone."""
    out = tmp_path / "out"
    real, calls = collect_mod.teacher_forced_trace, []

    def ctrl_c_at_4th(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(collect_mod, "teacher_forced_trace", ctrl_c_at_4th)
    with pytest.raises(KeyboardInterrupt):
        collect(vpair, prompts, out, CONFIG, shard_prompts=2, progress=False, max_batch=4)
    assert read_trace_rows(out)["prompt_id"].nunique() == 3 and not read_manifest(out)["status"]["complete"]
    assert not vpair.target_engine.llm(SpecConfig()).llm_engine.has_unfinished_requests()
    monkeypatch.setattr(collect_mod, "teacher_forced_trace", real)
    stats = collect(vpair, prompts, out, CONFIG, shard_prompts=2, progress=False, max_batch=4)
    assert (stats.prompts_skipped, stats.prompts_traced) == (3, len(TEXTS) - 3)
    pd.testing.assert_frame_equal(read_trace_rows(out), read_trace_rows(reference))
    assert read_manifest(out)["status"]["complete"]


def test_killed_cli_run_resumes_to_the_same_rows(folders, vpair, prompts, reference, tmp_path):
    out = tmp_path / "killed"
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_AT_4TH_PROMPT, *map(str, vllm_collect_args(folders, out, "--shard-prompts", 2))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 9, proc.stderr[-3000:]
    assert read_trace_rows(out)["prompt_id"].nunique() == 2  # the 3rd was in memory, the 4th not traced yet
    stats = collect(vpair, prompts, out, CONFIG, shard_prompts=2, progress=False, max_batch=4)
    assert (stats.prompts_skipped, stats.prompts_traced) == (2, len(TEXTS) - 2)
    pd.testing.assert_frame_equal(read_trace_rows(out), read_trace_rows(reference))


def test_two_ranks_write_disjoint_shards_that_make_one_run(folders, reference, tmp_path):
    """RANK / WORLD_SIZE as torchrun sets them: each rank its own vLLM instance over prompts i % 2 == rank."""
    out = tmp_path / "ranks"
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    env["OMP_NUM_THREADS"] = "1"
    procs = [
        subprocess.Popen(
            [sys.executable, "cli.py", *map(str, vllm_collect_args(folders, out))],
            cwd=ROOT,
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    results = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 0, err[-3000:]
    assert "rank 0/2: traced 4 prompts" in results[0][1] and "rank 1/2: traced 3 prompts" in results[1][1]
    shards = {r: sorted((out / "data").glob(f"part-r{r:03d}-*.parquet")) for r in (0, 1)}
    ids = {r: set(pd.concat([pd.read_parquet(f) for f in files])["prompt_id"]) for r, files in shards.items()}
    assert ids == {0: {"p0", "p2", "p4", "p6"}, 1: {"p1", "p3", "p5"}}
    pd.testing.assert_frame_equal(read_trace_rows(out), read_trace_rows(reference))
    assert read_manifest(out)["status"]["complete"]


def test_sampled_continuations_follow_each_prompts_seed(vpair, prompts, tmp_path):
    """Sampled: vLLM draws each prompt from its own seed (collect.prompt_seed), whatever runs beside it, and
    the labels come from the target's distribution (one teacher-forced target forward on torch)."""
    sampled = DecodeConfig(max_new_tokens=16, max_window=5, temperature=1.0, top_p=0.95, seed=3)
    collect(vpair, prompts, tmp_path / "all", sampled, progress=False, max_batch=4)
    collect(vpair, prompts[2:4], tmp_path / "two", sampled, progress=False, max_batch=4)
    every, two = read_trace_rows(tmp_path / "all"), read_trace_rows(tmp_path / "two")
    pd.testing.assert_frame_equal(every[every["prompt_id"].isin(["p2", "p3"])].reset_index(drop=True), two)
    assert every[TARGET_SIDE].notna().all().all()
    accepted = every["label"] == 1
    assert (every.loc[accepted, "draft_token"] == every.loc[accepted, "target_token"]).all()
    assert ((every["accept_prob"] >= 0) & (every["accept_prob"] <= 1)).all()
    record = read_manifest(tmp_path / "all")["collection"]
    assert record["target_signals"] is True and record["target_distribution"].startswith("torch float32")


def test_train_refuses_the_target_signals_the_trace_lacks(reference, tmp_path):
    with pytest.raises(DiscoError, match=r"hold no target-side signals.*--no-target-signals") as refused:
        train(TrainConfig([reference], tmp_path / "a", model="logistic", max_window=5, progress=False))
    assert "collected on vllm" in str(refused.value) and "\n" not in str(refused.value)
    art = tmp_path / "b"
    train(TrainConfig([reference], art, model="logistic", max_window=5, progress=False, target_signals=False))
    manifest = json.loads((art / "manifest.json").read_text())
    assert not set(manifest["columns"]) & set(TARGET_SIGNALS) and set(TOKEN_FEATURES) <= set(manifest["columns"])


# --- bad input: one line, nothing written ------------------------------------------------------------


def _one_line_and_nothing_written(code, err, out: Path, wanted: str) -> None:
    assert code == 2 and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and wanted in last, err
    assert not (out / "data").exists() or not any((out / "data").iterdir())


def test_a_gguf_target_is_refused(folders, tmp_path, capsys):
    gguf = write_tiny_gguf(tiny_vllm_qwen(), char_tokenizer(), tmp_path / "target.gguf")
    args = vllm_collect_args(folders, tmp_path / "o")
    args[args.index("--target") + 1] = gguf
    code, _, err = cli(capsys, *args)
    _one_line_and_nothing_written(code, err, tmp_path / "o", "loads the target from a transformers folder")


def test_a_draft_with_another_vocabulary_is_refused(folders, tmp_path, capsys):
    other = save_char_tiny(tiny_vllm_qwen(vocab=2048), tmp_path / "other")
    args = vllm_collect_args(folders, tmp_path / "o")
    args[args.index("--draft") + 1] = other
    code, _, err = cli(capsys, *args)
    _one_line_and_nothing_written(code, err, tmp_path / "o", "vocabulary")


def test_without_vllm_installed(folders, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    code, _, err = cli(capsys, *vllm_collect_args(folders, tmp_path / "o"))
    _one_line_and_nothing_written(code, err, tmp_path / "o", "needs vLLM, which is not installed")


def test_max_batch_on_an_engine_that_does_not_batch(folders, tmp_path, capsys):
    args = vllm_collect_args(folders, tmp_path / "o")
    args[args.index("vllm")] = "torch"
    code, _, err = cli(capsys, *args)
    assert code == 2 and "--max-batch 4 applies to the vllm engine only" in err, err
