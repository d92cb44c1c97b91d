"""`disco collect`: the teacher-forced trace equals the real oracle loop, the folder is Parquet
that pandas and datasets read, reruns resume exactly, bad input is refused, and two processes
write the rows of one."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import CONFIG, KILLED_AT_4TH_PROMPT, RecordingOracle, cli, collect_args, make_prompts
from tiny import VOCAB, char_tokenizer, save_tiny, tiny_pair

import disco.jobs.collect as collect_mod
from disco.base.errors import DiscoError
from disco.core.features import FEATURES, token_class_table, top_probs
from disco.formats.prompts import load_prompt_sources
from disco.formats.trace import COLUMNS as TRACE_COLUMNS
from disco.formats.trace import HIDDEN_COLUMN, read_manifest, read_trace_rows
from disco.jobs.collect import collect, oracle_windows, teacher_forced_trace
from disco.loop.decode import DecodeConfig, speculative_generate, target_generate
from disco.loop.pair import pair_from_models

ROOT = Path(__file__).resolve().parent.parent
TOKEN_INFO = ["gen_pos", "window_id", "oracle_drafted", "label", "draft_token", "target_token"]


# --- features and order ----------------------------------------------------------------------


def test_top_probs_equals_topk():
    g = torch.Generator().manual_seed(0)
    for vocab in (5000, 151936, 50257, 97, 10):  # multiple of the chunk, not, fewer chunks than k
        for scale in (0.1, 3.0, 30.0):
            probs = torch.softmax(torch.randn(vocab, generator=g) * scale, -1)
            assert torch.equal(top_probs(probs), probs.topk(10).values)
    ties = torch.zeros(1000)
    ties[[3, 500, 999]] = 0.25
    assert torch.equal(top_probs(ties), ties.topk(10).values)


def test_round_robin_takes_one_prompt_per_task_in_turn():
    tasks = ["code"] * 3 + ["explain"] * 2 + ["write"] * 4
    assert collect_mod.round_robin(range(9), tasks) == [0, 3, 5, 1, 4, 6, 2, 7, 8]
    assert collect_mod.round_robin([1, 2, 6, 8], tasks) == [1, 6, 2, 8]


# --- the oracle's windows, exactly ---------------------------------------------------------------


@pytest.mark.parametrize(
    "labels, max_new, window, expected",
    [
        # all accepted, cap 4: windows of 4, each followed by an undrafted bonus token (as the loop: [4, 4])
        ([1] * 10, 10, 4, [(0, 4), (5, 4)]),
        # mismatch at every third token: the rejected token is drafted, the next window starts after it
        ([1, 1, 0] * 3, 9, 20, [(0, 3), (3, 3), (6, 2)]),
        # the last position of a max-length y is a target-only round (k_max = 0)
        ([0, 0, 0], 3, 20, [(0, 1), (1, 1)]),
        # y ended on EOS before the budget: the window runs to the end of y
        ([1, 1, 1], 10, 20, [(0, 3)]),
        ([1], 1, 20, []),  # one token to generate: nothing to draft
        ([1, 1, 1, 1], 4, 0, []),  # max window 0: target-only decoding
    ],
)
def test_oracle_windows(labels, max_new, window, expected):
    assert oracle_windows(labels, max_new, window) == expected


# --- the teacher-forced trace equals the real oracle loop ------------------------------------------


PROMPTS = [[(7 * i + 3 * j) % 90 + 3 for j in range(1 + 2 * i)] for i in range(4)]


@pytest.fixture(scope="module")
def pairs():
    tok = char_tokenizer()
    # noise 0.05: long windows that hit the cap (bonus tokens); 0.3: frequent rejections
    return {noise: pair_from_models(*tiny_pair(noise=noise), tok) for noise in (0.05, 0.3)}


@pytest.mark.parametrize(
    "noise, max_new, window, eos_at",
    [
        (0.05, 30, 20, None),
        (0.3, 30, 20, None),  # the default window: long accepted runs, frequent rejections
        (0.05, 16, 3, None),
        (0.3, 16, 3, None),  # a small cap: bonus tokens after whole windows
        (0.3, 7, 6, None),
        (0.05, 2, 20, None),  # the budget shrinks the last windows; one drafted token at most
        (0.05, 24, 5, 6),
        (0.3, 24, 20, 11),
        (0.05, 24, 20, 11),  # EOS inside a window and as a correction
    ],
)
def test_trace_equals_live_oracle_loop(pairs, noise, max_new, window, eos_at):
    pair = pairs[noise]
    classes = token_class_table(pair.tokenizer, VOCAB)
    config = DecodeConfig(max_new_tokens=max_new, max_window=window)
    drafted = eos_windows = 0
    for prompt in PROMPTS:
        if eos_at is not None:  # pretend y's (eos_at+1)-th token ends generation: EOS inside a window
            y_full = target_generate(pair.target, prompt, config).tokens
            pair = dataclasses.replace(pair, eos_token_ids=frozenset({y_full[eos_at]}))
        y = target_generate(pair.target, prompt, config, pair.eos_token_ids).tokens
        policy = RecordingOracle(y, classes)
        live = speculative_generate(pair.target, pair.draft, prompt, policy, config, pair.eos_token_ids)
        assert live.tokens == y

        df = teacher_forced_trace(pair, prompt, y, config, classes, "p", "t").to_pandas()
        assert list(df.columns) == list(TRACE_COLUMNS) and len(df) == len(y)
        assert df["gen_pos"].tolist() == list(range(len(y))) and df["target_token"].tolist() == y
        rows = policy.rows
        assert all(r["gen_pos"] < len(y) for r in rows)  # the oracle never drafts past the end of y
        ours = df[df["oracle_drafted"]]
        assert ours["gen_pos"].tolist() == [r["gen_pos"] for r in rows]
        assert ours["window_id"].tolist() == [r["window_id"] for r in rows]
        assert ours["draft_token"].tolist() == [r["draft_token"] for r in rows]
        assert ours["label"].tolist() == [int(r["draft_token"] == y[r["gen_pos"]]) for r in rows]
        live_feats = np.stack([r["features"] for r in rows]) if rows else np.zeros((0, len(FEATURES)))
        np.testing.assert_allclose(ours[list(FEATURES)].to_numpy(np.float64), live_feats, rtol=1e-5, atol=1e-6)
        if rows:  # the target-side signals vary (a test that could not fail otherwise)
            assert len({tuple(r["features"][-4:]) for r in rows}) > 1 or len(set(ours["window_id"])) == 1
            # the draft's hidden state, as the loop's draft engine gives it, stored in float16
            stored = np.stack([np.frombuffer(b, np.float16) for b in ours[HIDDEN_COLUMN]]).astype(np.float32)
            np.testing.assert_allclose(stored, np.stack([r["hidden"] for r in rows]), rtol=2e-3, atol=2e-3)
        # the loop's own window statistics agree
        assert live.stats.windows == ours.groupby("window_id").size().tolist()
        eos_windows += int(y[-1] in pair.eos_token_ids and bool(rows) and rows[-1]["gen_pos"] == len(y) - 1)
        drafted += len(rows)

        # every other position is never drafted: the bonus tokens and target-only rounds
        rest = df[~df["oracle_drafted"]]
        assert (rest["window_id"] == -1).all() and (rest["window_pos"] == 1).all()
        # labels and probabilities agree with each other
        assert (df["label"] == (df["draft_token"] == df["target_token"])).all()
        np.testing.assert_allclose(df["draft_prob"], df["p_chosen"], rtol=1e-6)
        np.testing.assert_allclose(df["accept_prob"], np.minimum(1, df["target_prob"] / df["draft_prob"]), rtol=1e-5)
        assert ((df["overlap"] > 0) & (df["overlap"] <= 1 + 1e-6)).all()
        assert (df["target_top1"] >= df["target_prob"] - 1e-7).all()
        assert (df.loc[df["label"] == 1, "accept_prob"] > 0).all()
    assert drafted > 0
    assert eos_windows > 0 or eos_at is None  # the EOS-inside-a-window path did run


# --- the folder: Parquet + manifest, readable as is -------------------------------------------------


def test_collect_writes_parquet_and_manifest(pair32, tmp_path, monkeypatch):
    import datasets

    prompts = make_prompts(3) + make_prompts(2, "write")
    out = tmp_path / "traces"
    stats = collect(pair32, prompts, out, CONFIG, shard_prompts=2, progress=False, sources=["a.jsonl", "b.jsonl"])
    assert stats.prompts_traced == 5 and stats.rows == 5 * 12 and stats.tokens == 60
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["data", "manifest.json"]
    shards = sorted(p.name for p in (out / "data").iterdir())
    assert shards == ["part-r000-000000.parquet", "part-r000-000001.parquet", "part-r000-000002.parquet"]

    df = read_trace_rows(out)
    assert len(df) == 60 and list(df.columns) == list(TRACE_COLUMNS)
    assert sorted(set(df["prompt_id"])) == sorted(p.id for p in prompts)
    # each prompt is its own trace: identical to tracing it alone
    alone = collect_mod.trace_prompt(
        pair32,
        pair32.encode(prompts[0].prompt),
        CONFIG,
        token_class_table(pair32.tokenizer, VOCAB),
        prompts[0].id,
        "code",
    ).to_pandas()
    pd.testing.assert_frame_equal(df[df["prompt_id"] == prompts[0].id].reset_index(drop=True), alone)

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["features"] == list(FEATURES) and manifest["columns"] == list(TRACE_COLUMNS)
    assert manifest["pair"]["tokenizer_hash"] and manifest["pair"]["target"] == "in-memory:target"
    assert manifest["generation"] == {
        "max_new_tokens": 12,
        "max_window": 5,
        "temperature": 0.0,
        "chat": False,
        "eos_token_ids": [1],
    }
    assert manifest["prompts"]["sources"] == ["a.jsonl", "b.jsonl"] and manifest["prompts"]["count"] == 5
    assert {"torch", "transformers", "pyarrow", "disco"} <= set(manifest["versions"])
    status = manifest["status"]
    assert status["complete"] and status["rows"] == 60 and status["prompts"] == 5
    assert status["summary"]["by_task"]["write"]["prompts"] == 2
    assert status["summary"]["all"]["positive_rate"] == pytest.approx(df["label"].mean())

    # readable as is: pandas and datasets (its cache kept inside tmp_path)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    ds = datasets.load_dataset("parquet", data_files=str(out / "data" / "*.parquet"), split="train")
    assert ds.num_rows == 60 and ds.column_names == list(TRACE_COLUMNS)
    whole = pd.read_parquet(out / "data")
    assert len(whole) == 60 and list(whole.columns) == list(TRACE_COLUMNS) and whole.dtypes["label"] == np.int64


def test_sigterm_keeps_the_finished_prompts(pair32, tmp_path, monkeypatch):
    import signal

    prompts, out = make_prompts(5), tmp_path / "out"
    real_trace, calls = collect_mod.teacher_forced_trace, []

    def killed_at_4th_prompt(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            os.kill(os.getpid(), signal.SIGTERM)  # `kill PID`, as a scheduler ends a job
        return real_trace(*args, **kwargs)

    monkeypatch.setattr(collect_mod, "teacher_forced_trace", killed_at_4th_prompt)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        collect(pair32, prompts, out, CONFIG, shard_prompts=10, progress=False)
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is the collector's only while it runs
    assert set(read_trace_rows(out)["prompt_id"]) == {p.id for p in prompts[:3]}


def test_rerun_after_interruptions_gives_the_same_rows(pair32, tmp_path, monkeypatch):
    prompts = make_prompts(7)
    ref = tmp_path / "ref"
    collect(pair32, prompts, ref, CONFIG, shard_prompts=2, progress=False)
    expected = read_trace_rows(ref)

    out = tmp_path / "out"
    real_trace, calls = collect_mod.teacher_forced_trace, []

    def ctrl_c_at_4th_prompt(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real_trace(*args, **kwargs)

    # 1. Ctrl-C at the 4th prompt: the 3 finished prompts are kept (a hard kill: see the torchrun test).
    monkeypatch.setattr(collect_mod, "teacher_forced_trace", ctrl_c_at_4th_prompt)
    with pytest.raises(KeyboardInterrupt):
        collect(pair32, prompts, out, CONFIG, shard_prompts=2, progress=False)
    assert set(read_trace_rows(out)["prompt_id"]) == {p.id for p in prompts[:3]}
    assert not read_manifest(out)["status"]["complete"]

    # 2. Killed while writing a shard: a partial temporary file, never read as a shard.
    monkeypatch.setattr(collect_mod, "teacher_forced_trace", real_trace)
    import pyarrow.parquet as pq

    real_write = pq.write_table

    def torn_write(table, where, **kw):
        Path(where).write_bytes(b"PAR1 half a shard")
        raise SystemExit("killed mid-write")

    monkeypatch.setattr(pq, "write_table", torn_write)
    with pytest.raises(SystemExit):
        collect(pair32, prompts, out, CONFIG, shard_prompts=2, progress=False)
    monkeypatch.setattr(pq, "write_table", real_write)
    (out / "data" / ".part-r000-leftover.tmp").write_bytes(b"PAR1 torn")  # as a SIGKILL mid-write leaves it
    assert set(read_trace_rows(out)["prompt_id"]) == {p.id for p in prompts[:3]}

    # 3. The rerun finishes: exactly the rows of the uninterrupted run, no prompt twice.
    stats = collect(pair32, prompts, out, CONFIG, shard_prompts=2, progress=False)
    assert (stats.prompts_skipped, stats.prompts_traced) == (3, 4)
    assert not list((out / "data").glob(".part-*"))
    pd.testing.assert_frame_equal(read_trace_rows(out), expected)
    assert read_manifest(out)["status"]["complete"] and read_manifest(out)["status"]["rows"] == len(expected)
    # 4. A rerun of a finished folder does nothing.
    again = collect(pair32, prompts, out, CONFIG, progress=False)
    assert again.prompts_traced == 0 and again.manifest is not None
    pd.testing.assert_frame_equal(read_trace_rows(out), expected)


def test_other_pair_or_settings_are_refused_unless_overwrite(pair32, tmp_path):
    out = tmp_path / "t"
    collect(pair32, make_prompts(2), out, CONFIG, progress=False)
    before = sorted(out.iterdir())
    other_pair = pair_from_models(*tiny_pair(noise=0.1, dtype=torch.float32), char_tokenizer(), name="other")
    cases = [
        (other_pair, make_prompts(2), CONFIG, "pair.target, pair.draft"),
        (pair32, make_prompts(2), DecodeConfig(max_new_tokens=8, max_window=5), "generation"),
        (pair32, make_prompts(3), CONFIG, "prompts.count, prompts.sha256"),
    ]
    for pair, prompts, config, what in cases:
        with pytest.raises(DiscoError, match=f"another pair.*differs in {what}.*--overwrite"):
            collect(pair, prompts, out, config, progress=False)
        assert sorted(out.iterdir()) == before
    manifest = read_manifest(out)
    manifest["features"] = manifest["features"][:-1]  # traces of an older feature list
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DiscoError, match="differs in features"):
        collect(pair32, make_prompts(2), out, CONFIG, progress=False)

    stats = collect(
        pair32, make_prompts(3), out, DecodeConfig(max_new_tokens=8, max_window=5), overwrite=True, progress=False
    )
    assert stats.prompts_traced == 3
    df = read_trace_rows(out)
    assert len(df) == 3 * 8 and read_manifest(out)["generation"]["max_new_tokens"] == 8

    (tmp_path / "stray" / "data").mkdir(parents=True)  # shards without a manifest: not ours to extend
    (out / "data" / "part-r000-000000.parquet").rename(tmp_path / "stray" / "data" / "part-r000-000000.parquet")
    with pytest.raises(DiscoError, match="no manifest.json"):
        collect(pair32, make_prompts(3), tmp_path / "stray", CONFIG, progress=False)
    (out / "manifest.json").write_text("{")  # a torn manifest (not from us: we write it atomically)
    with pytest.raises(DiscoError, match="not valid JSON.*--overwrite"):
        collect(pair32, make_prompts(3), out, CONFIG, progress=False)
    assert collect(pair32, make_prompts(1), out, CONFIG, overwrite=True, progress=False).prompts_traced == 1
    assert len(read_trace_rows(out)) == 12


# --- prompts ---------------------------------------------------------------------------------------


def test_prompt_sources_shipped_names_and_comma_lists():
    prompts = load_prompt_sources(["code-train,explain-train", str(ROOT / "data" / "write-test.jsonl")], limit=2)
    assert [p.task for p in prompts] == ["code", "code", "explain", "explain", "write", "write"]
    with pytest.raises(DiscoError, match="in both"):
        load_prompt_sources(["code-train", str(ROOT / "data" / "code-train.jsonl")], limit=1)
    with pytest.raises(DiscoError, match="--limit must be at least 1"):
        load_prompt_sources(["code-train"], limit=0)


def test_hf_prompt_sets_from_local_copies(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    mbpp = datasets.Dataset.from_dict(
        {
            "task_id": [601, 602],
            "text": ["Write a function to add.", "Write a function to sub."],
            "code": ["", ""],
            "test_list": [["assert add(1, 2) == 3"], ["assert sub(3, 2) == 1", "assert sub(0, 0) == 0"]],
        }
    )
    mbpp.save_to_disk(str(tmp_path / "mbpp"))
    prompts = load_prompt_sources([f"hf:mbpp={tmp_path / 'mbpp'}"])
    assert [(p.id, p.task) for p in prompts] == [("mbpp-601", "code"), ("mbpp-602", "code")]
    assert prompts[1].prompt == (
        "Write a function to sub.\nYour code should pass these tests:\n\nassert sub(3, 2) == 1\nassert sub(0, 0) == 0"
    )

    humaneval = tmp_path / "he.jsonl"
    humaneval.write_text(json.dumps({"task_id": "HumanEval/0", "prompt": "def f():\n", "entry_point": "f"}) + "\n")
    (p,) = load_prompt_sources([f"hf:humaneval:test={humaneval}"], limit=1)
    assert p.id == "humaneval-0" and p.prompt.endswith("```python\ndef f():\n```")
    alpaca = tmp_path / "alpaca.parquet"
    datasets.Dataset.from_dict(
        {"instruction": ["Say hi.", "Translate."], "input": ["", "chat"], "output": ["hi", "cat"]}
    ).to_parquet(str(alpaca))
    assert [p.prompt for p in load_prompt_sources([f"hf:alpaca={alpaca}"])] == ["Say hi.", "Translate.\n\nchat"]

    with pytest.raises(DiscoError, match="unknown dataset 'hf:nope'"):
        load_prompt_sources(["hf:nope"])
    with pytest.raises(DiscoError, match="lacks the cnn_dailymail column"):
        load_prompt_sources([f"hf:cnn_dailymail={alpaca}"])
    with pytest.raises(DiscoError, match="no such file"):
        load_prompt_sources([f"hf:mbpp={tmp_path / 'missing'}"])


# --- the command line --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    target, draft = tiny_pair(noise=0.1, dtype=torch.float32)
    tok = char_tokenizer()
    prompts = root / "p.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "task": ["code", "write"][i % 2], "prompt": f"def f{i}(x):"}) + "\n"
            for i in range(5)
        )
    )
    return save_tiny(target, tok, root / "target"), save_tiny(draft, tok, root / "draft"), prompts


SETTINGS = {"max_new_tokens": 10, "device": "cpu", "dtype": "float32"}  # the command-line runs'


def test_cli_collect_and_bad_prompt_files(folders, tmp_path, capsys):
    code, out, err = cli(capsys, *collect_args(*folders, tmp_path / "t", **SETTINGS))
    assert code == 0, err
    assert "traced 5 prompts" in err and "positive rate" in out
    assert read_manifest(tmp_path / "t")["status"]["rows"] == 50

    code, _, err = cli(capsys, *collect_args(*folders, tmp_path / "t", **{**SETTINGS, "max_new_tokens": 4}))
    assert code == 2 and "--overwrite" in err and "Traceback" not in err

    t, d, _ = folders
    cases = {
        "missing.jsonl": None,
        "notjson.jsonl": "{nope\n",
        "nofield.jsonl": '{"id": "a"}\n',
        "empty.jsonl": "\n",
        "binary.jsonl": b"\xff\xfe\x00",
    }
    for name, text in cases.items():
        path = tmp_path / name
        if isinstance(text, bytes):
            path.write_bytes(text)
        elif text is not None:
            path.write_text(text)
        code, _, err = cli(capsys, *collect_args(t, d, path, tmp_path / f"out-{name}"))
        assert code == 2 and err.strip().startswith("error: ") and "Traceback" not in err, err
        assert not (tmp_path / f"out-{name}").exists()


def run_cli(*args, env=None, **kw):
    return subprocess.run(
        [sys.executable, "cli.py", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        **kw,
    )


def test_killed_run_resumed_by_two_processes_gives_the_rows_of_one(folders, tmp_path, capsys):
    code, _, err = cli(capsys, *collect_args(*folders, tmp_path / "one", **SETTINGS))
    assert code == 0, err
    # Killed at the 4th prompt: the shard of prompts 0-1 is on disk, prompt 2 was only in memory.
    two = collect_args(*folders, tmp_path / "two", **SETTINGS, shard_prompts=2)
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_AT_4TH_PROMPT, *map(str, two)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 9, proc.stderr[-3000:]
    assert set(read_trace_rows(tmp_path / "two")["prompt_id"]) == {"p0", "p1"}
    assert not read_manifest(tmp_path / "two")["status"]["complete"]
    # Two processes finish the folder: each takes its prompts (i % 2) that are not done yet.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            "cli.py",
            *map(str, two),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 0/2: traced 2 prompts (1 already done)" in proc.stderr
    assert "rank 1/2: traced 1 prompts (1 already done)" in proc.stderr
    data = tmp_path / "two" / "data"
    names = sorted(p.name for p in data.glob("*.parquet"))
    assert names == ["part-r000-000000.parquet", "part-r000-000001.parquet", "part-r001-000000.parquet"]
    # prompt i goes to rank i % 2; the first shard is the interrupted single process's
    assert [set(pd.read_parquet(data / n)["prompt_id"]) for n in names] == [{"p0", "p1"}, {"p2", "p4"}, {"p3"}]
    one, two = read_trace_rows(tmp_path / "one"), read_trace_rows(tmp_path / "two")
    pd.testing.assert_frame_equal(one[TOKEN_INFO], two[TOKEN_INFO])
    pd.testing.assert_frame_equal(one, two, check_exact=False, rtol=1e-4, atol=1e-5)
    m1, m2 = read_manifest(tmp_path / "one"), read_manifest(tmp_path / "two")
    assert m2["status"]["complete"] and m2["status"]["rows"] == m1["status"]["rows"] == 50
