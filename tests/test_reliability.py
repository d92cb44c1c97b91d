"""Issue 22: nothing lost, nothing silently wrong. One test per failure the issue lists, each
reproducing it, then asserting the one-line error, the exit code, and that the user's data (trace
shards, an existing artifact, a finished result) is intact."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers import CONFIG, cli, collect_args, make_prompts, one_error_line
from tiny import char_tokenizer, save_tiny, tiny_pair

from disco.base.errors import DiscoError
from disco.base.files import write_or_rescue
from disco.formats.trace import read_trace_rows, read_traces
from disco.jobs.collect import collect
from disco.jobs.launch import folder_lock
from disco.policies.artifact import load_artifact, rehash_artifact

ROOT = Path(__file__).resolve().parent.parent


def digest(folder: Path) -> str:
    """Every file of a folder, names and bytes (lock files aside: they hold no data)."""
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".lock")):
        h.update(str(f.relative_to(folder)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Tiny model folders, a prompt file, a trace folder of 6 prompts (3 shards) and an artifact."""
    root = tmp_path_factory.mktemp("world")
    target, draft = tiny_pair(noise=0.3, dtype=torch.float32)
    tok = char_tokenizer()
    t, d = save_tiny(target, tok, root / "target"), save_tiny(draft, tok, root / "draft")
    prompts = root / "p.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "task": ["code", "write"][i % 2], "prompt": f"def f{i}(x):"}) + "\n"
            for i in range(6)
        )
    )
    traces = root / "traces"
    code, _, err = _run(collect_args(t, d, prompts, traces, max_new_tokens=12, device="cpu", shard_prompts=2))
    assert code == 0, err
    model = root / "model"
    code, _, err = _run(["train", "--traces", traces, "--out", model, "--model", "logistic", "--no-head"])
    assert code == 0, err
    return {"root": root, "target": t, "draft": d, "prompts": prompts, "traces": traces, "model": model}


def _run(args):
    """The CLI in-process without pytest's capsys (module fixtures): (code, stdout, stderr)."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    argv, code = sys.argv, 0
    sys.argv = ["disco", *map(str, args)]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            from disco.cli.cli import main

            main()
    except SystemExit as e:
        code = e.code or 0
    finally:
        sys.argv = argv
    return code, out.getvalue(), err.getvalue()


def copy(world, what: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(world[what], tmp_path / what))


def pair_args(world) -> list:
    return ["--target", world["target"], "--draft", world["draft"], "--device", "cpu"]


def collect_world(world, out, **options) -> list:
    """`disco collect` of the world's pair (on the CPU) on its prompts into `out`."""
    return collect_args(world["target"], world["draft"], world["prompts"], out, device="cpu", **options)


# --- 1. train never destroys a trace folder; --out is checked before any work ---------------------------


def test_train_out_into_traces_is_refused_and_the_traces_stay(world, tmp_path, capsys):
    tr = copy(world, "traces", tmp_path)
    before = digest(tr)
    code, _, err = cli(capsys, "train", "--traces", tr, "--out", tr, "--model", "logistic")
    assert code == 2
    assert one_error_line(err) == (
        f"error: --out {tr} and --traces {tr} overlap: writing the artifact there would "
        "replace the traces; choose another --out, e.g. models/NAME"
    )
    code, _, err = cli(capsys, "train", "--traces", world["traces"], "--out", tr, "--overwrite")
    assert code == 2 and "holds traces (disco collect)" in one_error_line(err)
    assert digest(tr) == before
    # ... and the next collect still resumes into it (nothing to redo)
    code, _, err = cli(capsys, *collect_world(world, tr, max_new_tokens=12, shard_prompts=2))
    assert code == 0 and "traced 0 prompts (6 already done)" in err
    assert digest(tr) == before


def test_train_out_non_empty_needs_overwrite_which_replaces_it_whole(world, tmp_path, capsys):
    m = copy(world, "model", tmp_path)
    before = digest(m)
    code, _, err = cli(capsys, "train", "--traces", world["traces"], "--out", m, "--model", "lightgbm")
    assert code == 2
    assert one_error_line(err) == (
        f"error: --out {m} is not empty: choose another --out, or pass --overwrite to replace it whole"
    )
    assert digest(m) == before
    code, _, err = cli(
        capsys, "train", "--traces", world["traces"], "--out", m, "--model", "lightgbm", "--no-head", "--overwrite"
    )
    assert code == 0, err
    assert sorted(p.name for p in m.iterdir()) == [
        "manifest.json",
        "metrics.md",
        "model.txt",
        "reliability.png",
    ]  # no stale model.json
    assert load_artifact(m).kind == "lightgbm"


def test_collect_refuses_an_artifact_folder_even_with_overwrite(world, tmp_path, capsys):
    m = copy(world, "model", tmp_path)
    before = digest(m)
    code, _, err = cli(capsys, *collect_world(world, m, overwrite=True))
    assert code == 2
    assert one_error_line(err) == (
        f"error: --out {m} holds a manifest.json that is not a trace's (a classifier "
        "artifact?): choose another --out for the traces"
    )
    assert digest(m) == before


# --- 2. a set-aside shard is never read, and goes once its prompts are traced again ------------------------


def test_set_aside_shard_is_not_read_and_disappears_after_the_next_collect(world, tmp_path, capsys):
    tr = copy(world, "traces", tmp_path)
    whole = read_trace_rows(tr)
    shards = sorted((tr / "data").glob("part-*.parquet"))
    lost = set(pd.read_parquet(shards[1])["prompt_id"])
    shards[1].write_bytes(shards[1].read_bytes()[:200])  # a copy cut short (the repro)
    code, _, err = cli(capsys, "train", "--traces", tr, "--out", tmp_path / "m0", "--model", "logistic")
    assert code == 2 and "is damaged or truncated" in one_error_line(err) and str(shards[1]) in err

    # A set-aside shard, as a collect killed right after setting it aside leaves it: train skips it.
    aside = tr / "data" / f".damaged-{shards[1].name}"
    shards[1].rename(aside)
    assert set(read_trace_rows(tr)["prompt_id"]) == set(whole["prompt_id"]) - lost
    code, _, err = cli(capsys, "train", "--traces", tr, "--out", tmp_path / "m1", "--model", "logistic", "--no-head")
    assert code == 0, err

    # The next collect traces its prompts again and removes it: the rows are those of the whole run.
    code, _, err = cli(capsys, *collect_world(world, tr, max_new_tokens=12, shard_prompts=2))
    assert code == 0 and "traced 2 prompts (4 already done)" in err, err
    assert not aside.exists() and not list((tr / "data").glob(".*"))
    pd.testing.assert_frame_equal(read_trace_rows(tr), whole)
    code, _, err = cli(capsys, "train", "--traces", tr, "--out", tmp_path / "m2", "--model", "logistic", "--no-head")
    assert code == 0, err


def test_overwrite_removes_a_set_aside_shard(world, tmp_path, capsys):
    tr = copy(world, "traces", tmp_path)
    (tr / "data" / ".damaged-part-r000-000007.parquet").write_bytes(b"PAR1 torn")
    code, _, err = cli(capsys, *collect_world(world, tr, max_new_tokens=8, overwrite=True))
    assert code == 0, err
    assert not list((tr / "data").glob(".damaged-*")) and len(read_trace_rows(tr)) == 6 * 8


# --- 3. one writer per trace folder; duplicates refused by every reader ------------------------------


def test_collect_into_a_locked_folder_says_busy(pair32, tmp_path):  # noqa: F811
    out = tmp_path / "t"
    with folder_lock(out):  # another run holds it
        with pytest.raises(DiscoError) as e:
            collect(pair32, make_prompts(2), out, CONFIG, progress=False)
    assert str(e.value).startswith(f"--out {out} is busy: another disco collect (pid {os.getpid()} on ")
    assert str(e.value).endswith(
        "is writing into it; wait for it to end (then rerun to resume), or choose another --out"
    )
    assert not (out / "data").exists() or not list((out / "data").iterdir())
    assert collect(pair32, make_prompts(2), out, CONFIG, progress=False).prompts_traced == 2  # free again


SLOW_COLLECT = """
import sys, time
import disco.jobs.collect as c
real = c.teacher_forced_trace
def slow(*args, **kwargs):  # a big model's pace: the second collect surely starts while this one runs
    time.sleep(2)
    return real(*args, **kwargs)
c.teacher_forced_trace = slow
sys.argv = ["disco", *sys.argv[1:]]
from disco.cli.cli import main
main()
"""


def test_two_collects_into_one_folder_at_once(world, tmp_path):
    """The issue's repro as two real processes: the first writes shards of 1 prompt (the issue: 3);
    once one exists the same command with another --shard-prompts starts. It says busy, and the
    folder ends with each (prompt, position) once."""
    out = tmp_path / "t"

    def args(shard_prompts: int) -> list[str]:
        return [str(a) for a in collect_world(world, out, max_new_tokens=12, shard_prompts=shard_prompts)]

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen(
        [sys.executable, "-c", SLOW_COLLECT, *args(1)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list((out / "data").glob("part-*.parquet")):
        time.sleep(0.1)
    second = subprocess.run(
        [sys.executable, "cli.py", *args(4)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert first.wait(timeout=300) == 0, first.stderr.read()[-2000:]
    assert second.returncode == 2, second.stderr[-2000:]
    assert one_error_line(second.stderr).startswith(
        f"error: --out {out} is busy: another disco collect (pid {first.pid} on "
    )
    df = read_trace_rows(out)
    assert len(df) == 6 * 12 and not df.duplicated(["prompt_id", "gen_pos"]).any()


def test_a_prompt_in_two_shards_is_refused_by_train_and_collect(world, tmp_path, capsys):
    tr = copy(world, "traces", tmp_path)
    shards = sorted((tr / "data").glob("part-*.parquet"))
    dup = tr / "data" / "part-r000-000009.parquet"
    shutil.copy(shards[0], dup)  # what two collects at once left behind
    before = digest(tr)
    expected = (
        f"error: {tr}: prompt 'p0' is in 2 shards ({shards[0].name}, {dup.name}), as when two disco collect "
        f"ran into one folder at once: delete {dup} and rerun the same disco collect (it traces that shard's "
        "other prompts again)"
    )
    code, _, err = cli(capsys, "train", "--traces", tr, "--out", tmp_path / "m", "--model", "logistic")
    assert code == 2 and one_error_line(err) == expected
    code, _, err = cli(capsys, *collect_world(world, tr, max_new_tokens=12, shard_prompts=2))
    assert code == 2 and one_error_line(err) == expected.replace(f"{tr}: prompt", f"{tr}: prompt")
    assert digest(tr) == before
    with pytest.raises(DiscoError, match="prompt 'p0' is in 2 shards"):
        read_traces([tr])
    dup.unlink()  # the fix the message gives
    code, _, err = cli(capsys, "train", "--traces", tr, "--out", tmp_path / "m", "--model", "logistic", "--no-head")
    assert code == 0, err


# --- 4. compare --policies selecting nothing that can run -----------------------------------------------


@pytest.mark.parametrize(
    "more, why",
    [
        (["--policies", "classifier"], "classifier needs --classifier models/NAME"),
        (["--policies", "transformers", "--no-anchor"], "transformers is an anchor, which --no-anchor leaves out"),
        (
            ["--policies", "oracle", "--temperature", "0.7"],
            "oracle is defined for greedy decoding only (--temperature 0)",
        ),
    ],
)
def test_compare_policies_without_a_runnable_row(world, tmp_path, capsys, more, why):
    code, _, err = cli(
        capsys, "compare", *pair_args(world), "--prompts", world["prompts"], "--out", tmp_path / "c", *more
    )
    assert code == 2
    assert one_error_line(err) == (
        f"error: --policies {more[1]} selects no row to run beside target-only ({why}): "
        "choose other rows, or drop --policies for all of them"
    )
    assert "loading the pair" not in err and not (tmp_path / "c").exists()


# --- 5. file-system errors: one line, before the work where possible, the finished result kept ---------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="tmpfs mounts need root")


@pytest.fixture()
def mount(tmp_path):
    """A small tmpfs (root only): mount(readonly=…, leave=free bytes) -> its path."""
    made = []

    def make(readonly: bool = False, leave: int | None = None) -> Path:
        path = tmp_path / f"mnt{len(made)}"
        path.mkdir()
        if subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)], capture_output=True
        ).returncode:
            pytest.skip("mount -t tmpfs is not allowed here")
        made.append(path)
        if leave is not None:
            (path / "filler").write_bytes(b"\0" * (shutil.disk_usage(path).free - leave))
        if readonly:
            subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)
        return path

    yield make
    for path in made:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@needs_root
def test_read_only_outputs_fail_before_any_work(world, mount, capsys):
    ro = mount(readonly=True)
    cases = [
        (collect_world(world, ro / "t"), "--out", ro / "t"),
        (["train", "--traces", world["traces"], "--out", ro / "m"], "--out", ro / "m"),
        (["compare", *pair_args(world), "--prompts", world["prompts"], "--out", ro / "c"], "--out", ro / "c"),
        (["generate", *pair_args(world), "--prompt", "x", "--json", ro / "o.json"], "--json", ro / "o.json"),
    ]
    for args, flag, path in cases:
        code, _, err = cli(capsys, *args)
        assert code == 2
        assert one_error_line(err) == (
            f"error: {flag} {path} cannot be written: the file system is read-only ({ro}): choose another {flag}"
        )
        assert "loading the pair" not in err


@needs_root
def test_a_full_disk_keeps_what_was_finished(world, mount, capsys):
    full = mount(leave=3000)  # room for the early checks, not for an artifact
    code, _, err = cli(
        capsys, "train", "--traces", world["traces"], "--out", full / "m", "--model", "logistic", "--no-head"
    )
    assert code == 2
    line = one_error_line(err)
    assert line.startswith(f"error: could not write {full / 'm'}") and ": no space left on the device; " in line
    rescued = Path(line.split("saved in ", 1)[1].split(" instead")[0])
    assert load_artifact(rescued).kind == "logistic"  # the finished artifact, whole
    assert not (full / "m").exists() and not [p for p in full.iterdir() if p.name != "filler"]

    full = mount(leave=40_000)  # a few shards' worth
    out = full / "t"
    code, _, err = cli(capsys, *collect_world(world, out, max_new_tokens=12, shard_prompts=1))
    assert code == 2
    line = one_error_line(err)
    assert line.startswith(f"error: could not write {out}") and "no space left on the device" in line
    assert "traced so far are kept there: fix it and rerun the same command to resume" in line
    done = read_trace_rows(out)  # every shard it left is whole
    assert len(done) == 12 * done["prompt_id"].nunique() and not done.duplicated(["prompt_id", "gen_pos"]).any()


def test_write_or_rescue_saves_the_result_elsewhere(tmp_path):
    def write(path: Path) -> None:
        if path.parent == tmp_path:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        path.write_text("finished")

    with pytest.raises(DiscoError) as e:
        write_or_rescue(tmp_path / "o.json", write, "results file")
    msg = str(e.value)
    assert msg.startswith(
        f"could not write {tmp_path / 'o.json'}: no space left on the device; the finished results file is saved in "
    )
    assert Path(msg.split("saved in ", 1)[1].split(" instead")[0]).read_text() == "finished"


def test_outputs_of_the_wrong_kind(world, tmp_path, capsys):
    code, _, err = cli(capsys, "generate", *pair_args(world), "--prompt", "x", "--json", tmp_path)
    assert code == 2 and one_error_line(err) == (
        f"error: --json {tmp_path} is a folder: give a file name, e.g. {tmp_path / 'out.json'}"
    )
    code, _, err = cli(capsys, *collect_world(world, world["prompts"]))
    assert (
        code == 2 and one_error_line(err) == f"error: --out {world['prompts']} is a file: give a folder for the trace"
    )
    code, _, err = cli(capsys, "compare", *pair_args(world), "--prompts", world["prompts"], "--out", world["prompts"])
    assert (
        code == 2
        and one_error_line(err) == f"error: --out {world['prompts']} is a file: give a folder for the comparison"
    )


# --- 6. train on too few prompts ---------------------------------------------------------------------------


def test_train_on_two_prompts_says_how_many_it_needs(world, tmp_path, capsys):
    tr = copy(world, "traces", tmp_path)
    df = read_trace_rows(tr)
    for shard in (tr / "data").glob("*.parquet"):
        shard.unlink()
    df[df["prompt_id"].isin(["p0", "p1"])].to_parquet(tr / "data" / "part-r000-000000.parquet", index=False)
    code, _, err = cli(capsys, "train", "--traces", tr, "--out", tmp_path / "m", "--model", "logistic")
    assert code == 2
    assert one_error_line(err) == (
        "error: the traces hold too few prompts to split by prompt (1 of task code, 1 of "
        "task write): training needs at least 2 prompts of one task with drafted tokens (one "
        "to fit, one to validate), and more for useful metrics: collect more prompts"
    )
    assert not (tmp_path / "m").exists()


# --- 7. artifacts checked whole ----------------------------------------------------------------------------


def _edited(world, tmp_path, edit) -> Path:
    m = copy(world, "model", tmp_path)
    manifest = json.loads((m / "manifest.json").read_text())
    edit(manifest)
    (m / "manifest.json").write_text(json.dumps(manifest))
    return m


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m.update(columns=m["columns"][::-1]),  # reversed: ran silently with other decisions
        lambda m: m.update(columns=m["columns"][:-1]),  # one dropped: a traceback at the first prediction
        lambda m: m.update(setting=0.01),  # the rule's setting ("threshold" in manifests before format 3)
        lambda m: m.update(calibration={"a": 4.0, "b": 1.0}),
        lambda m: m.update(cost_model={"c_d": 0.0, "c_t": [1.0] * 22}),
    ],
)
def test_an_edited_manifest_is_refused_like_an_edited_model(world, tmp_path, capsys, edit):
    m = _edited(world, tmp_path, edit)
    code, _, err = cli(
        capsys, "generate", *pair_args(world), "--prompt", "x", "--policy", "classifier", "--classifier", m
    )
    assert code == 2
    assert one_error_line(err) == (
        f"error: {m / 'manifest.json'} does not match the sha256 in its manifest: the "
        "artifact was modified after training; retrain it or restore the original files"
    )
    assert "loading the pair" not in err
    model = m / "model.json"
    model.write_text(model.read_text().replace("0.", "0.1", 1))
    with pytest.raises(DiscoError) as e:
        load_artifact(m)
    assert str(e.value) == (
        f"{model} does not match the sha256 in its manifest: the artifact was modified after "
        "training; retrain it or restore the original files"
    )


def test_columns_must_match_the_model_width(world, tmp_path):
    # an older (format 1) artifact has no manifest hash: its columns are still checked against the model
    def older(m: dict) -> None:  # (format 1 names the rule's setting "threshold")
        m.update(columns=m["columns"][:-1], format=1, threshold=m.pop("setting"))
        m.pop("integrity_sha256")

    m = _edited(world, tmp_path, older)
    n = len(json.loads((world["model"] / "manifest.json").read_text())["columns"])
    with pytest.raises(DiscoError) as e:
        load_artifact(m)
    assert str(e.value) == (
        f"{m / 'manifest.json'}: its {n - 1} columns do not match the model's {n} inputs: the "
        "artifact is inconsistent; retrain it or restore the original files"
    )


def test_lightgbm_columns_reordered_are_refused(world, tmp_path, capsys):
    m = tmp_path / "lgb"
    code, _, err = cli(capsys, "train", "--traces", world["traces"], "--out", m, "--model", "lightgbm", "--no-head")
    assert code == 0, err
    manifest = json.loads((m / "manifest.json").read_text())
    manifest["columns"] = manifest["columns"][::-1]
    (m / "manifest.json").write_text(json.dumps(manifest))
    rehash_artifact(m)  # even re-hashed on purpose: the model file names its inputs
    with pytest.raises(
        DiscoError, match=r"columns do not match the model's \d+ inputs \(.*\): the artifact is inconsistent"
    ):
        load_artifact(m)


def test_every_shipped_artifact_loads():
    shipped = sorted(p for p in (ROOT / "models").iterdir() if (p / "manifest.json").is_file())
    assert [p.name for p in shipped] == [
        "embedded-qwen2.5-coder",
        "embedded-qwen2.5-coder-llamacpp",
        "embedded-qwen2.5-coder-llamacpp-t0.7",
        "embedded-qwen2.5-coder-t0.7",
        "embedded-qwen2.5-coder-vllm",
    ]
    for folder in shipped:
        art = load_artifact(folder)
        assert art.manifest["format"] == 2 and art.manifest["integrity_sha256"]


# --- 8. options that do not apply are refused, in both directions ----------------------------------------


def test_options_of_the_other_engine_or_of_sampling_are_refused(world, capsys, tmp_path):
    from tiny_gguf import write_tiny_gguf

    base = ["generate", *pair_args(world), "--prompt", "x"]
    for more, line in [
        (
            ["--verify", "fast"],
            "--verify fast applies to the llama.cpp engine only, and this run uses torch: drop "
            "--verify, or add --engine llama.cpp with GGUF files",
        ),
        (
            ["--draft-quant", "q8_0"],
            "--draft-quant q8_0 applies to the llama.cpp engine only, and this run uses torch: "
            "drop --draft-quant, or add --engine llama.cpp with GGUF files",
        ),
        (
            ["--top-p", "0.9"],
            "--top-p 0.9 applies to sampling only and this run decodes greedily: drop --top-p, or add "
            "--temperature above 0",
        ),
    ]:
        code, _, err = cli(capsys, *base, *more)
        assert code == 2 and one_error_line(err) == f"error: {line}" and "loading the pair" not in err
    target, draft = tiny_pair(noise=0.3, dtype=torch.float32)
    g = write_tiny_gguf(target, char_tokenizer(), tmp_path / "t.gguf")
    code, _, err = cli(capsys, "generate", "--target", g, "--draft", g, "--prompt", "x", "--cache", "static")
    assert code == 2 and one_error_line(err) == (
        "error: --cache static applies to the torch engine only, and this run "
        "uses llama.cpp: drop --cache, or add --engine torch"
    )


# --- 9. the smaller ones ---------------------------------------------------------------------------------


def test_compare_overwrite_replaces_the_old_folder_whole(world, tmp_path, capsys):
    out = tmp_path / "c"
    out.mkdir()
    (out / "old-plot.png").write_bytes(b"a plot of an older run")
    args = [
        "compare",
        *pair_args(world),
        "--prompts",
        world["prompts"],
        "--limit",
        1,
        "--max-new-tokens",
        6,
        "--policies",
        "constant",
        "--out",
        out,
    ]
    code, _, err = cli(capsys, *args)
    assert code == 2 and "is not empty" in one_error_line(err)
    old = os.umask(0o022)
    try:
        code, _, err = cli(capsys, *args, "--overwrite")
    finally:
        os.umask(old)
    assert code == 0, err
    assert (out / "compare.json").is_file() and not (out / "old-plot.png").exists()
    assert (out / "compare.json").stat().st_mode & 0o777 == 0o644  # the umask's mode, not mkstemp's 0600


def test_outputs_keep_the_umask_mode(world, tmp_path, capsys):
    old = os.umask(0o002)
    try:
        code, _, err = cli(
            capsys, "generate", *pair_args(world), "--prompt", "x", "--max-new-tokens", 4, "--json", tmp_path / "o.json"
        )
    finally:
        os.umask(old)
    assert code == 0, err
    assert (tmp_path / "o.json").stat().st_mode & 0o777 == 0o664
    assert all(f.stat().st_mode & 0o777 == 0o644 for f in (world["traces"] / "data").glob("*.parquet"))


def test_smaller_input_errors_are_named(world, tmp_path, capsys):
    base = ["generate", *pair_args(world)]
    code, _, err = cli(capsys, *base, "--prompts", tmp_path)
    assert code == 2 and one_error_line(err) == (
        f"error: --prompts {tmp_path} is a folder: give a JSONL file in it (one {{id, task, prompt}} per line)"
    )
    blank = tmp_path / "b.jsonl"
    blank.write_text('{"id": "a", "prompt": "x"}\n{"id": "blank-7", "prompt": "  \\t"}\n')
    for command in ("generate", "compare"):
        args = [command, *pair_args(world), "--prompts", blank] + (
            ["--out", tmp_path / "c"] if command == "compare" else []
        )
        code, _, err = cli(capsys, *args)
        assert code == 2 and one_error_line(err) == (
            f"error: {blank}:2: prompt 'blank-7' is empty (only whitespace): give it some text or drop the line"
        )
    # ranges before the models load: the model paths do not even exist
    for more, line in [
        (["--threshold", "1.5"], "--threshold must be within [0, 1] (got 1.5)"),
        (["--policy", "constant", "--k", "0"], "--k must be at least 1 (got 0)"),
    ]:
        code, _, err = cli(
            capsys, "generate", "--target", tmp_path / "no-t", "--draft", tmp_path / "no-d", "--prompt", "x", *more
        )
        assert code == 2 and one_error_line(err) == f"error: {line}"
    code, _, err = cli(
        capsys, *collect_args(tmp_path / "no-t", tmp_path / "no-d", world["prompts"], tmp_path / "t", shard_prompts=0)
    )
    assert code == 2 and one_error_line(err) == "error: --shard-prompts must be at least 1 (got 0)"


def test_a_truncated_gguf_is_named_as_such(tmp_path, capsys):
    from tiny_gguf import write_tiny_gguf

    target, draft = tiny_pair(noise=0.3, dtype=torch.float32)
    whole = write_tiny_gguf(target, char_tokenizer(), tmp_path / "t.gguf")
    cut = tmp_path / "cut.gguf"
    data = whole.read_bytes()
    cut.write_bytes(data[: len(data) * 2 // 3])
    code, _, err = cli(capsys, "generate", "--target", cut, "--draft", whole, "--prompt", "x")
    assert code == 2
    line = one_error_line(err)
    assert line.startswith(f"error: the target {cut} is ") and "truncated" in line
    assert line.endswith(": copy or download it again")


# --- 10. the rest of the reliability battery (bench/battery.py, retired: its cases live here now) ----------


@pytest.fixture(scope="module")
def gguf_pair(tmp_path_factory):
    """A tiny target and draft as GGUF files (the llama.cpp engine's inputs)."""
    from tiny_gguf import write_tiny_gguf

    root = tmp_path_factory.mktemp("gguf-pair")
    target, draft = tiny_pair(noise=0.3, dtype=torch.float32)
    tok = char_tokenizer()
    return write_tiny_gguf(target, tok, root / "t.gguf"), write_tiny_gguf(draft, tok, root / "d.gguf")


def _written(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


# (case, the command line from (world, gguf pair, tmp_path), what the one error line says)
REFUSED = [
    (
        "train --out a file",
        lambda w, g, tmp: ["train", "--traces", w["traces"], "--out", w["prompts"], "--model", "logistic"],
        lambda w, g, tmp: f"--out {w['prompts']} is a file: give a folder for the artifact",
    ),
    (
        "collect --out someone's non-empty folder",
        lambda w, g, tmp: collect_world(w, w["target"]),
        lambda w, g, tmp: f"--out {w['target']} is not empty and holds no traces (",
    ),
    (
        "compare --policies llama-server on torch",
        lambda w, g, tmp: [
            "compare",
            *pair_args(w),
            "--prompts",
            w["prompts"],
            "--policies",
            "llama-server",
            "--out",
            tmp / "c",
        ],
        lambda w, g, tmp: (
            "--policies llama-server selects no row to run beside target-only (llama-server runs on "
            "the llama.cpp engine, this run on torch)"
        ),
    ),
    (
        "compare --policies nope",
        lambda w, g, tmp: [
            "compare",
            *pair_args(w),
            "--prompts",
            w["prompts"],
            "--policies",
            "nope",
            "--out",
            tmp / "c",
        ],
        lambda w, g, tmp: (
            "--policies: unknown nope; choose from target, constant, heuristic, threshold, adaedl, svip, "
            "oracle, classifier, adaptive-verification, learned-budget, rules, llama-server, transformers, vllm"
        ),
    ),
    (
        "artifact: no such folder",
        lambda w, g, tmp: [
            "generate",
            *pair_args(w),
            "--prompt",
            "x",
            "--policy",
            "classifier",
            "--classifier",
            tmp / "no",
        ],
        lambda w, g, tmp: f"{tmp / 'no'} is not a classifier artifact (no manifest.json): train one with disco train",
    ),
    (
        "classifier policy without --classifier",
        lambda w, g, tmp: ["generate", *pair_args(w), "--prompt", "x", "--policy", "classifier"],
        lambda w, g, tmp: "the classifier policy needs a trained artifact: pass --classifier models/NAME",
    ),
    (
        "shipped artifact on another pair",
        lambda w, g, tmp: [
            "generate",
            *pair_args(w),
            "--prompt",
            "x",
            "--policy",
            "classifier",
            "--classifier",
            ROOT / "models" / "embedded-qwen2.5-coder",
        ],
        lambda w, g, tmp: (
            f"{ROOT / 'models' / 'embedded-qwen2.5-coder'} was trained for a pair with another tokenizer ("
        ),
    ),
    (
        "--threads 2 on torch",
        lambda w, g, tmp: ["generate", *pair_args(w), "--prompt", "x", "--threads", "2"],
        lambda w, g, tmp: (
            "--threads 2 applies to the llama.cpp engine only, and this run uses torch: drop --threads, "
            "or add --engine llama.cpp with GGUF files"
        ),
    ),
    *[
        (
            f"{flag} on llama.cpp",
            lambda w, g, tmp, more=more: ["generate", "--target", g[0], "--draft", g[1], "--prompt", "x", *more],
            lambda w, g, tmp, more=more, flag=flag: (
                f"{' '.join(more)} applies to the torch engine only, and this run "
                f"uses llama.cpp: drop {flag}, or add --engine torch"
            ),
        )
        for flag, more in [
            ("--compile", ["--compile"]),
            ("--cpu-backend", ["--cpu-backend", "eager"]),
            ("--dtype", ["--dtype", "float16"]),
        ]
    ],
    (
        "--engine llama.cpp --device cuda",
        lambda w, g, tmp: [
            "generate",
            "--target",
            g[0],
            "--draft",
            g[1],
            "--prompt",
            "x",
            "--engine",
            "llama.cpp",
            "--device",
            "cuda",
        ],
        lambda w, g, tmp: (
            "--engine llama.cpp runs on the CPU (llama-cpp-python is built for it here): use --engine "
            "torch for --device cuda"
        ),
    ),
    *[
        (
            f"generate {' '.join(more)}",
            lambda w, g, tmp, more=more: ["generate", *pair_args(w), "--prompt", "x", *more],
            lambda w, g, tmp, line=line: line,
        )
        for more, line in [
            (["--temperature", "-1"], "--temperature must be at least 0 (got -1.0)"),
            (["--temperature", "0.7", "--top-p", "0"], "--top-p must be within (0, 1] (got 0.0)"),
            (["--max-window", "-1"], "--max-window must be at least 0 (got -1)"),
            (["--lambda", "2"], "--lambda must be within [0, 1] (got 2.0)"),
            (["--svip-h", "-1"], "--svip-h must be at least 0 (got -1.0)"),
        ]
    ],
    (
        "generate --threads 0 on llama.cpp",
        lambda w, g, tmp: ["generate", "--target", g[0], "--draft", g[1], "--threads", "0", "--prompt", "x"],
        lambda w, g, tmp: "--threads must be at least 1 (got 0)",
    ),
    (
        "compare --seeds 0",
        lambda w, g, tmp: ["compare", *pair_args(w), "--prompts", w["prompts"], "--seeds", "0", "--out", tmp / "c"],
        lambda w, g, tmp: "--seeds must be at least 1 (got 0)",
    ),
    (
        "train --val-fraction 1.5",
        lambda w, g, tmp: ["train", "--traces", w["traces"], "--out", tmp / "m", "--val-fraction", "1.5"],
        lambda w, g, tmp: "--val-fraction must be within (0, 1) (got 1.5)",
    ),
    (
        "train --max-window 0",
        lambda w, g, tmp: ["train", "--traces", w["traces"], "--out", tmp / "m", "--max-window", "0"],
        lambda w, g, tmp: "--max-window must be at least 1 (got 0)",
    ),
    (
        "profile --repeats 0",
        lambda w, g, tmp: ["profile", *pair_args(w), "--repeats", "0"],
        lambda w, g, tmp: "--repeats must be at least 1 (got 0)",
    ),
    (
        "--prompts bad JSONL",
        lambda w, g, tmp: ["generate", *pair_args(w), "--prompts", _written(tmp, "bad.jsonl", b'{"id": 1,\n')],
        lambda w, g, tmp: (
            f"{tmp / 'bad.jsonl'}:1: not valid JSON (Expecting property name enclosed in double quotes); "
            "each line must be one JSON object"
        ),
    ),
    (
        "--prompts not UTF-8",
        lambda w, g, tmp: ["generate", *pair_args(w), "--prompts", _written(tmp, "bin.jsonl", b"\xff\xfe\x00\x81")],
        lambda w, g, tmp: f"{tmp / 'bin.jsonl'} is not UTF-8 text: a prompt file is JSON Lines (",
    ),
    (
        "--target missing folder",
        lambda w, g, tmp: ["generate", "--target", tmp / "none", "--draft", w["draft"], "--prompt", "x"],
        lambda w, g, tmp: f"no such model folder or GGUF file: {tmp / 'none'} (check the path)",
    ),
    (
        "--target a .gguf that is not GGUF",
        lambda w, g, tmp: [
            "generate",
            "--target",
            _written(tmp, "fake.gguf", b"not a gguf" * 100),
            "--draft",
            g[1],
            "--prompt",
            "x",
        ],
        lambda w, g, tmp: (
            f"the target {tmp / 'fake.gguf'} is not a GGUF file (no GGUF header): give a GGUF file, or a "
            "transformers model folder"
        ),
    ),
    (
        "--pair bad YAML",
        lambda w, g, tmp: ["generate", "--pair", _written(tmp, "bad.yaml", b"target: [\n"), "--prompt", "x"],
        lambda w, g, tmp: f"{tmp / 'bad.yaml'} is not valid YAML: ",
    ),
    (
        "train --traces missing",
        lambda w, g, tmp: ["train", "--traces", tmp / "no-traces", "--out", tmp / "m"],
        lambda w, g, tmp: f"no trace folder or .parquet file at {tmp / 'no-traces'} (make traces with: disco collect)",
    ),
    (
        "train --profile not JSON",
        lambda w, g, tmp: [
            "train",
            "--traces",
            w["traces"],
            "--out",
            tmp / "m",
            "--profile",
            _written(tmp, "p.json", b"{"),
        ],
        lambda w, g, tmp: f"{tmp / 'p.json'} is not a disco profile (need numbers c_d and a list c_t): ",
    ),
]


@pytest.mark.parametrize("case, argv, line", REFUSED, ids=[c[0] for c in REFUSED])
def test_refused_in_one_line(world, gguf_pair, tmp_path, capsys, case, argv, line):
    code, _, err = cli(capsys, *argv(world, gguf_pair, tmp_path))
    assert code == 2
    assert one_error_line(err).startswith(f"error: {line(world, gguf_pair, tmp_path)}")


def test_a_damaged_target_config_is_named(world, tmp_path, capsys):
    bad = copy(world, "target", tmp_path)
    (bad / "config.json").write_text("{nope")
    code, _, err = cli(
        capsys, "generate", "--target", bad, "--draft", world["draft"], "--prompt", "x", "--device", "cpu"
    )
    assert code == 2 and one_error_line(err).startswith(f"error: could not load the tokenizer of '{bad}': ")


def test_train_on_one_prompt_says_it_needs_two(world, tmp_path, capsys):
    tr = copy(world, "traces", tmp_path)
    df = read_trace_rows(tr)
    for shard in (tr / "data").glob("*.parquet"):
        shard.unlink()
    df[df["prompt_id"] == "p0"].to_parquet(tr / "data" / "part-r000-000000.parquet", index=False)
    code, _, err = cli(capsys, "train", "--traces", tr, "--out", tmp_path / "m", "--model", "logistic")
    assert code == 2
    assert one_error_line(err) == (
        "error: the traces hold a single prompt: training needs at least two (split by prompt)"
    )
    assert not (tmp_path / "m").exists()


def test_train_overwrite_with_another_model_kind_leaves_no_stale_file(world, tmp_path, capsys):
    m = copy(world, "model", tmp_path)
    code, _, err = cli(
        capsys, "train", "--traces", world["traces"], "--out", m, "--model", "lightgbm", "--no-head", "--overwrite"
    )
    assert code == 0, err
    assert not (m / "model.json").exists() and (m / "model.txt").is_file()


@pytest.mark.parametrize("damage", ["model file missing", "manifest not JSON"])
@pytest.mark.parametrize("command", ["generate", "compare"])
def test_a_damaged_artifact_is_named(world, tmp_path, capsys, damage, command):
    m = copy(world, "model", tmp_path)
    if damage == "model file missing":
        (m / "model.json").unlink()
        line = f"error: {m}: the model file model.json is missing"
    else:
        (m / "manifest.json").write_text("{")
        line = f"error: {m / 'manifest.json'} is not valid JSON ("
    args = (
        ["generate", *pair_args(world), "--prompt", "x", "--policy", "classifier", "--classifier", m]
        if command == "generate"
        else ["compare", *pair_args(world), "--prompts", world["prompts"], "--classifier", m, "--out", tmp_path / "c"]
    )
    code, _, err = cli(capsys, *args)
    assert code == 2 and one_error_line(err).startswith(line)


@needs_root
def test_a_full_disk_keeps_the_profile(world, mount, capsys):
    full = mount(leave=100)
    args = ["--max-window", 2, "--repeats", 1, "--warmup", 0, "--context", 8]
    code, _, err = cli(capsys, "profile", *pair_args(world), "--out", full / "p.json", *args)
    assert code == 2
    line = one_error_line(err)
    assert line.startswith(
        f"error: could not write {full / 'p.json'}: no space left on the device; the finished profile"
    )
    assert Path(line.split("saved in ", 1)[1].split(" instead")[0]).is_file()
