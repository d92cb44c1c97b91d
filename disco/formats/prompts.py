"""Prompt sets: JSONL files of {"id", "task", "prompt"} (or "messages" instead of "prompt"),
the sets shipped in data/ by name, Hugging Face datasets (`hf:mbpp`, …) mapped to the same schema, and
MT-Bench (`mt-bench[-2][:CATEGORY+…][:SPLIT+…]`, from its data wheel: mtbench.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from disco.base import shipped
from disco.base.errors import DiscoError
from disco.formats.mtbench import is_mt_bench, misplaced_word, select_questions

DATA_DIR = shipped.path(shipped.PROMPTS)  # the shipped prompt sets: the checkout's data/, or the wheel's copy


@dataclass(frozen=True)
class Prompt:
    id: str
    task: str
    prompt: str | list[dict]  # plain text, or chat messages [{"role", "content"}, ...]
    # A second turn still waiting for the first one's answer (`mt-bench-2`): `prompt` is then the first
    # turn, and this the question asked after the answer. The prompt sets cannot answer (that takes the
    # pair): answers.answer_first_turns does, once the pair is loaded, and returns the conversation.
    follow_up: str | None = None

    def answered(self, answer: str) -> Prompt:
        """The whole conversation: the first turn, `answer` to it as the assistant's, then the follow-up."""
        if self.follow_up is None:
            raise ValueError(f"prompt {self.id!r} has no follow-up question")
        first = [{"role": "user", "content": self.prompt}] if isinstance(self.prompt, str) else list(self.prompt)
        messages = [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": self.follow_up}]
        return Prompt(self.id, self.task, messages)


def load_prompts(path: str | Path, limit: int | None = None) -> list[Prompt]:
    """Read a JSONL prompt file; every problem is a DiscoError naming the file and line."""
    path = Path(path)
    if limit is not None and limit < 1:
        raise DiscoError(f"--limit must be at least 1 (got {limit})")
    if path.is_dir():
        raise DiscoError(f"--prompts {path} is a folder: give a JSONL file in it (one {{id, task, prompt}} per line)")
    if not path.is_file():
        names = shipped.prompt_set_names()
        hint = f" (shipped sets: {', '.join(names)}; also mt-bench, mt-bench-2, hf:NAME)" if names else ""
        raise DiscoError(f"prompt file not found: {path}{hint}")
    prompts: list[Prompt] = []
    seen: set[str] = set()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise DiscoError(f"{path} is not UTF-8 text: a prompt file is JSON Lines ({e.reason} at byte {e.start})") from e
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DiscoError(f"{path}:{n}: not valid JSON ({e.msg}); each line must be one JSON object") from e
        if not isinstance(row, dict):
            raise DiscoError(f'{path}:{n}: expected a JSON object with "id", "task" and "prompt"')
        text = row.get("prompt", row.get("messages"))
        missing = [k for k, v in (("id", row.get("id")), ("prompt", text)) if v in (None, "", [])]
        if missing:
            raise DiscoError(f'{path}:{n}: missing field {", ".join(missing)} (need "id" and "prompt" or "messages")')
        if not isinstance(text, (str, list)):
            raise DiscoError(f'{path}:{n}: "prompt" must be text (or "messages" a list of {{role, content}})')
        pid = str(row["id"])
        if isinstance(text, str) and not text.strip():
            raise DiscoError(
                f"{path}:{n}: prompt {pid!r} is empty (only whitespace): give it some text or drop the line"
            )
        if pid in seen:
            raise DiscoError(f"{path}:{n}: duplicate id {pid!r}: ids must be unique")
        seen.add(pid)
        prompts.append(Prompt(pid, str(row.get("task", "default")), text))
        if limit is not None and len(prompts) >= limit:
            break
    if not prompts:
        raise DiscoError(f"{path} holds no prompts: write one JSON object per line")
    return prompts


# --- several sources, shipped set names, Hugging Face datasets ------------------------------

HF_PREFIX = "hf:"


@dataclass(frozen=True)
class HFPromptSet:
    """How one Hugging Face dataset maps to {id, task, prompt}."""

    repo: str  # dataset id on the hub
    config: str | None  # dataset configuration (None: the default one)
    split: str  # split used when the spec names none
    task: str  # the task every prompt of the set gets
    id_field: str | None  # column with a stable id (None: the row index)
    template: Callable[[dict], str]  # a dataset row -> the prompt text


def _mbpp(row: dict) -> str:  # the MBPP paper's prompt: the problem, then the tests to pass
    return f"{row['text']}\nYour code should pass these tests:\n\n" + "\n".join(row["test_list"])


def _alpaca(row: dict) -> str:
    return f"{row['instruction']}\n\n{row['input']}" if row.get("input") else row["instruction"]


def _cnn_dailymail(row: dict) -> str:
    return f"Summarize the following news article in a few sentences.\n\n{row['article']}"


def _humaneval(row: dict) -> str:
    return f"Complete the following Python function.\n\n```python\n{row['prompt']}```"


# The DISCO paper's tasks: code (MBPP, HumanEval), summarisation (CNN/DailyMail), instructions (Alpaca).
HF_PROMPT_SETS: dict[str, HFPromptSet] = {
    "mbpp": HFPromptSet("google-research-datasets/mbpp", "full", "train", "code", "task_id", _mbpp),
    "alpaca": HFPromptSet("tatsu-lab/alpaca", None, "train", "instruct", None, _alpaca),
    "cnn_dailymail": HFPromptSet("abisee/cnn_dailymail", "3.0.0", "train", "summarize", "id", _cnn_dailymail),
    "humaneval": HFPromptSet("openai/openai_humaneval", None, "test", "code", "task_id", _humaneval),
}
_DATA_FILE_BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}


def load_hf_prompts(spec: str, limit: int | None = None) -> list[Prompt]:
    """Prompts from a Hugging Face dataset: `hf:NAME[:SPLIT][=PATH]`.

    NAME is one of HF_PROMPT_SETS; without PATH the dataset comes from the hub (or the HF cache
    when offline); PATH is a local copy instead: a `save_to_disk` folder, a folder of data files,
    or one .parquet/.jsonl/.csv file with the dataset's own columns."""
    body = spec.removeprefix(HF_PREFIX)
    body, _, path = body.partition("=")
    name, _, split = body.partition(":")
    if name not in HF_PROMPT_SETS:
        raise DiscoError(f"unknown dataset {spec!r}: choose hf:NAME with NAME one of {', '.join(HF_PROMPT_SETS)}")
    hps = HF_PROMPT_SETS[name]
    split = split or hps.split
    rows = _hf_rows(hps, split, Path(path).expanduser() if path else None, spec)
    prompts: list[Prompt] = []
    for i, row in enumerate(rows):
        if limit is not None and len(prompts) >= limit:
            break
        try:
            text = hps.template(row)
            key = i if hps.id_field is None else row[hps.id_field]
        except (KeyError, TypeError) as e:
            raise DiscoError(f"{spec}: row {i} lacks the {name} column {e}: is this the {hps.repo} dataset?") from e
        # "HumanEval/0" -> "humaneval-0": ids stay file-name and shell friendly
        prompts.append(Prompt(f"{name}-{str(key).rsplit('/', 1)[-1]}", hps.task, text))
    if not prompts:
        raise DiscoError(f"{spec} holds no rows in split {split!r}")
    return prompts


def _hf_rows(hps: HFPromptSet, split: str, path: Path | None, spec: str):
    """The rows of one split, from the hub or a local copy; every failure is one DiscoError."""
    try:
        import datasets
    except ImportError as e:  # a hard dependency; only a broken install gets here
        raise DiscoError("hf: prompt sets need the `datasets` package: pip install datasets") from e
    try:
        if path is None:
            return datasets.load_dataset(hps.repo, hps.config, split=split)
        if not path.exists():
            raise DiscoError(f"{spec}: no such file or folder {path}")
        if path.is_dir() and any((path / f).exists() for f in ("dataset_info.json", "dataset_dict.json")):
            ds = datasets.load_from_disk(str(path))
            return ds[split] if isinstance(ds, datasets.DatasetDict) else ds
        if path.is_dir():
            return datasets.load_dataset(str(path), split=split)
        if path.suffix not in _DATA_FILE_BUILDERS:
            raise DiscoError(f"{spec}: {path.name} is not a {', '.join(_DATA_FILE_BUILDERS)} file or a dataset folder")
        return datasets.load_dataset(_DATA_FILE_BUILDERS[path.suffix], data_files={split: str(path)}, split=split)
    except DiscoError:
        raise
    except Exception as e:  # network, hub, missing split, unreadable file: many exception types, one fix
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        where = str(path) if path is not None else f"the hub ({hps.repo}; needs the network once, then the HF cache)"
        raise DiscoError(f"could not load {spec} split {split!r} from {where}: {first}") from e


def load_mt_bench_prompts(source: str, limit: int | None = None) -> list[Prompt]:
    """MT-Bench's questions as prompts: `mt-bench…` asks the first turn (id mt-bench-QID, task the
    category); `mt-bench-2…` the second (id mt-bench-2-QID, task CATEGORY-2, so that a run of both turns
    reports them apart), waiting for the target's answer to the first (Prompt.follow_up)."""
    selection, questions = select_questions(source)
    if selection.turn == 1:
        prompts = [Prompt(f"mt-bench-{q.id}", q.category, q.turns[0]) for q in questions]
    else:
        prompts = [Prompt(f"mt-bench-2-{q.id}", f"{q.category}-2", q.turns[0], follow_up=q.turns[1]) for q in questions]
    return prompts[:limit] if limit is not None else prompts


def load_prompt_source(source: str, limit: int | None = None) -> list[Prompt]:
    """One prompt source: `hf:NAME…`, `mt-bench…`, a JSONL file, or the name of a shipped set (`code-train`)."""
    if source.startswith(HF_PREFIX):
        return load_hf_prompts(source, limit)
    path = Path(source)
    if is_mt_bench(source) and not path.exists():
        return load_mt_bench_prompts(source, limit)
    # a shipped set by name (code-train) or by its checkout path (data/code-train.jsonl), from any folder
    found = shipped.find_prompt_set(source)
    if found.is_file():
        path = found
    hint = misplaced_word(source) if not path.exists() else None
    if hint:
        raise DiscoError(hint)
    return load_prompts(path, limit)


def load_prompt_sources(sources: Sequence[str], limit: int | None = None) -> list[Prompt]:
    """Prompts of several sources in order (each may be a comma list); `limit` applies per source.

    Ids must be unique across sources: traces and resumption key on them."""
    if limit is not None and limit < 1:
        raise DiscoError(f"--limit must be at least 1 (got {limit})")
    names = [s.strip() for item in sources for s in item.split(",") if s.strip()]
    if not names:
        raise DiscoError("no prompt source given: pass --prompts FILE.jsonl, a shipped set name, mt-bench or hf:NAME")
    prompts: list[Prompt] = []
    origin: dict[str, str] = {}
    for name in names:
        for p in load_prompt_source(name, limit):
            if p.id in origin:
                raise DiscoError(f"prompt id {p.id!r} is in both {origin[p.id]} and {name}: ids must be unique")
            origin[p.id] = name
            prompts.append(p)
    return prompts


# `disco profile`'s context: ordinary code, repeated until it has enough tokens (profile.py, vllm/engine.py).
_CONTEXT_TEXT = (
    "def merge_sorted(a: list[int], b: list[int]) -> list[int]:\n"
    '    """Merge two sorted lists into one sorted list in linear time."""\n'
    "    out, i, j = [], 0, 0\n"
    "    while i < len(a) and j < len(b):\n"
    "        if a[i] <= b[j]:\n"
    "            out.append(a[i]); i += 1\n"
    "        else:\n"
    "            out.append(b[j]); j += 1\n"
    "    return out + a[i:] + b[j:]\n\n"
)


def context_ids(tokenizer, n: int) -> list[int]:
    """The first n tokens of the profiling context."""
    ids = list(tokenizer(_CONTEXT_TEXT)["input_ids"])
    if not ids:
        raise DiscoError("the tokenizer returned no tokens for the profiling context")
    return (ids * (n // len(ids) + 1))[:n]
