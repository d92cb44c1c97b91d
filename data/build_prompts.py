#!/usr/bin/env python3
"""Build the prompt sets in data/ (code, explain, write; train and test).

Usage (from the repository root):

    .venv/bin/python data/build_prompts.py           # (re)write the six files
    .venv/bin/python data/build_prompts.py --check   # verify files are up to date

Hand-written prompts live in prompts_code.py, prompts_explain.py and
prompts_write.py next to this script. Some "explain" prompts are generated
from the Python standard library: the source of small, long-stable pure-Python
functions (read with ast from the module's .py file, docstring removed) and
passages from pydoc_data.topics. No randomness is involved: every choice is a
fixed list below, and the train/test split is by position (every 4th prompt
of a task, starting with the 2nd, goes to test), so running the script
twice gives byte-identical files.

The stdlib-derived prompts depend on the interpreter's stdlib text; the
committed files were built with CPython 3.11. Another minor version may
change a few of those prompts slightly (the script warns).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import re
import sys
import textwrap
from pathlib import Path

sys.dont_write_bytecode = True  # keep data/ free of __pycache__

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import prompts_code  # noqa: E402
import prompts_explain  # noqa: E402
import prompts_write  # noqa: E402

BUILT_WITH = (3, 11)
PUBLIC_NAME = {"_pydatetime": "datetime"}  # module name shown in prompts
MAX_SNIPPET_LINES = 40
TASKS = ("code", "explain", "write")
SIZE_LIMIT = 100_000  # bytes per file; validation fails above this

# ---------------------------------------------------------------------------
# Standard-library material
# ---------------------------------------------------------------------------

# (modules to try in order, qualified name, example call or None)
# Explanation prompts. Functions chosen for being small and long-stable.
STDLIB_EXPLAIN = [
    (("colorsys",), "rgb_to_hsv", "rgb_to_hsv(1.0, 0.5, 0.0)"),
    (("colorsys",), "hls_to_rgb", None),
    (("heapq",), "heappop", None),
    (("heapq",), "_siftdown", None),
    (("heapq",), "_siftup", None),
    (("heapq",), "heappushpop", "heappushpop([1, 3, 5], 4)"),
    (("bisect",), "bisect_right", "bisect_right([1, 2, 2, 3], 2)"),
    (("bisect",), "insort_left", None),
    (("textwrap",), "shorten", None),
    (("textwrap",), "TextWrapper._fix_sentence_endings", None),
    (("statistics",), "median", "median([3, 1, 4, 1])"),
    (("statistics",), "multimode", "multimode('aabbbbccddddeeffffgg')"),
    (("statistics",), "median_low", None),
    (("shlex",), "quote", 'quote("it\'s here")'),
    (("fnmatch",), "filter", None),
    (("posixpath",), "split", "split('/usr/local/lib/')"),
    (("posixpath",), "commonpath", None),
    (("genericpath",), "commonprefix", "commonprefix(['/usr/lib', '/usr/local/lib'])"),
    (("genericpath",), "_splitext", None),
    (("string",), "capwords", "capwords('  hello   wORLD  ')"),
    (("functools",), "cmp_to_key", None),
    (("functools",), "reduce", "reduce(lambda a, b: a * b, [1, 2, 3, 4], 10)"),
    (("calendar",), "monthrange", "monthrange(2024, 2)"),
    (("calendar",), "leapdays", "leapdays(1999, 2025)"),
    (("_pydatetime", "datetime"), "_ymd2ord", None),
    (("html",), "escape", "escape('<a href=\"x\">Tom & Jerry</a>')"),
    (("collections",), "Counter.most_common", None),
    (("copy",), "_deepcopy_tuple", None),
    (("json.encoder",), "py_encode_basestring_ascii", None),
    (("ipaddress",), "_count_righthand_zero_bits", "_count_righthand_zero_bits(40, 32)"),
    (("glob",), "escape", "escape('data/[draft]*.txt')"),
    (("operator",), "length_hint", None),
    (("reprlib",), "recursive_repr", None),
    (("difflib",), "_format_range_unified", "_format_range_unified(3, 3)"),
]

# Docstring-writing prompts (the existing docstring is removed).
STDLIB_DOCSTRING = [
    (("colorsys",), "hsv_to_rgb", None),
    (("colorsys",), "rgb_to_hls", None),
    (("heapq",), "heapreplace", None),
    (("bisect",), "insort_right", None),
    (("textwrap",), "indent", None),
    (("statistics",), "median_high", None),
    (("statistics",), "mode", None),
    (("heapq",), "heapify", None),
    (("fnmatch",), "fnmatch", None),
    (("posixpath",), "basename", None),
    (("posixpath",), "dirname", None),
    (("calendar",), "timegm", None),
    (("_pydatetime", "datetime"), "_days_in_month", None),
    (("html",), "unescape", None),
    (("glob",), "has_magic", None),
    (("quopri",), "unhex", None),
    (("operator",), "countOf", None),
    (("json.encoder",), "py_encode_basestring", None),
    (("ipaddress",), "v4_int_to_packed", None),
    (("copy",), "_deepcopy_list", None),
]

EXPLAIN_TEMPLATES = [
    "Explain what this Python function does, step by step:",
    "Describe in a short paragraph what the following function computes, and when you might use it:",
    "Summarise this function in one sentence, then list the edge cases it handles:",
    "This function comes from the Python standard library module `{module}`. Explain how it works and point out anything non-obvious:",
    "Explain the purpose of each part of this function to someone who is new to Python:",
]
EXPLAIN_CALL_TEMPLATE = (
    "Explain what this function from the `{module}` module returns for the call "
    "`{call}`, walking through how it gets there:"
)
DOCSTRING_TEMPLATES = [
    "Write a docstring for the following Python function, describing its parameters, return value and any exceptions it raises:",
    "Write a Google-style docstring for this function:",
    "Write a concise one-line summary docstring, followed by a short explanatory paragraph, for this function:",
    "Write a NumPy-style docstring for the following function:",
]

# pydoc_data.topics keys whose first substantial prose passage is summarised.
TOPIC_KEYS = [
    "break",
    "continue",
    "while",
    "global",
    "nonlocal",
    "naming",
    "exceptions",
    "context-managers",
    "integers",
    "numbers",
    "comparisons",
    "booleans",
    "del",
    "return",
    "raise",
    "try",
    "typesmapping",
    "execmodel",
    "dynamic-features",
    "function",
    "formatstrings",
    "typesmodules",
    "typesmethods",
    "augassign",
    "specialnames",
    "in",
    "objects",
    "compound",
    "lists",
    "unary",
    "exprlists",
    "attribute-references",
    "bitwise",
    "atom-literals",
]
TOPIC_TEMPLATES = [
    "Summarise the following passage from the Python documentation in two sentences:",
    "Explain the following passage from the Python language reference in plain language, for someone who has used Python for about a month:",
    "Summarise the following documentation text as three bullet points:",
    "Read the following passage and state its main rule in one sentence, then give a short code example that illustrates it:",
]
TOPIC_MIN_WORDS = 60
TOPIC_MAX_WORDS = 220


def _find_def(tree: ast.Module, qualname: str):
    body = tree.body
    node = None
    for part in qualname.split("."):
        node = next(
            (
                n
                for n in body
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == part
            ),
            None,
        )
        if node is None:
            return None
        body = node.body
    return node


def stdlib_source(modules, qualname):
    """Return (module name, source without docstring) or None if unavailable."""
    for modname in modules:
        try:
            module = importlib.import_module(modname)
        except ImportError:
            continue
        # (frozen modules such as posixpath still have __file__ on CPython)
        path = getattr(module, "__file__", None)
        if not path or not path.endswith(".py") or not Path(path).exists():
            continue
        text = Path(path).read_text(encoding="utf-8")
        node = _find_def(ast.parse(text), qualname)
        if node is None:
            continue
        lines = text.splitlines()
        start = min([node.lineno] + [d.lineno for d in node.decorator_list])
        drop = set()
        first = node.body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            if len(node.body) == 1 or first.lineno == node.lineno:
                print(f"warning: {modname}.{qualname} has no body besides its docstring, skipped", file=sys.stderr)
                return None
            drop = set(range(first.lineno, first.end_lineno + 1))
            # also drop blank lines directly after the docstring
            nxt = first.end_lineno + 1
            while nxt <= node.end_lineno and not lines[nxt - 1].strip():
                drop.add(nxt)
                nxt += 1
        kept = [lines[i - 1] for i in range(start, node.end_lineno + 1) if i not in drop]
        src = textwrap.dedent("\n".join(kept)).rstrip()
        if len(src.splitlines()) > MAX_SNIPPET_LINES:
            print(f"warning: {modname}.{qualname} longer than {MAX_SNIPPET_LINES} lines, skipped", file=sys.stderr)
            return None
        return PUBLIC_NAME.get(modname, modname), src
    print(f"warning: {'/'.join(modules)}.{qualname} not found, skipped", file=sys.stderr)
    return None


def code_block(src: str, lang: str = "python") -> str:
    return f"```{lang}\n{src}\n```"


def stdlib_explain_prompts():
    out, k = [], 0
    for modules, qualname, call in STDLIB_EXPLAIN:
        found = stdlib_source(modules, qualname)
        if found is None:
            continue
        module, src = found
        if call:
            head = EXPLAIN_CALL_TEMPLATE.format(module=module, call=call)
        else:
            head = EXPLAIN_TEMPLATES[k % len(EXPLAIN_TEMPLATES)].format(module=module)
            k += 1
        out.append(f"{head}\n\n{code_block(src)}")
    return out


def stdlib_docstring_prompts():
    out = []
    for i, (modules, qualname, _) in enumerate(STDLIB_DOCSTRING):
        found = stdlib_source(modules, qualname)
        if found is None:
            continue
        _, src = found
        head = DOCSTRING_TEMPLATES[i % len(DOCSTRING_TEMPLATES)]
        out.append(f"{head}\n\n{code_block(src)}")
    return out


def _is_heading(block_lines):
    return len(block_lines) >= 2 and block_lines[-1].strip() != "" and set(block_lines[-1].strip()) <= set("*=-~^")


_SENTENCE_END = re.compile(r"[.!?][)\"\u201d\u2019]*$")


def _unwrap(block_lines):
    """Join wrapped lines into one paragraph, mending words split at hyphens."""
    para = ""
    for line in block_lines:
        line = line.strip()
        if para.endswith("-") and para[-2:-1].isalpha():
            para += line
        else:
            para = f"{para} {line}" if para else line
    para = re.sub(r"\s*\[\d+\]", "", para)  # footnote markers
    return re.sub(r"\s{2,}", " ", para).strip()


def topic_passage(text: str):
    """Heading plus the first run of plain prose paragraphs with enough words.

    A prose paragraph is an unindented block that is not a heading, list,
    grammar rule or doctest and that ends a sentence (so paragraphs that lead
    into an example, such as "For example:", end the run).
    """
    blocks = [b.split("\n") for b in re.split(r"\n\s*\n", text.strip())]
    heading = None
    if blocks and _is_heading(blocks[0]):
        heading = " ".join(line.strip() for line in blocks[0][:-1])
    run, words = [], 0
    for block in blocks:
        first = block[0]
        prose = (
            first.strip() != ""
            and not first.startswith((" ", "\t", "*", "-", "+", "|", ">>>", "("))
            and not _is_heading(block)
            and not re.match(r"\d+\.\s", first)  # numbered list item
        )
        para = _unwrap(block) if prose else ""
        if para.startswith(("New in version", "Changed in version", "Deprecated")):
            continue  # version notes: leave out, but keep the run going
        if not para or not _SENTENCE_END.search(para):
            if words >= TOPIC_MIN_WORDS:
                break
            run, words = [], 0
            continue
        n = len(para.split())
        if run and words + n > TOPIC_MAX_WORDS:
            break
        run.append(para)
        words += n
    if words < TOPIC_MIN_WORDS:
        return None
    body = "\n\n".join(run)
    return f"{heading}\n\n{body}" if heading else body


def topic_prompts():
    try:
        from pydoc_data.topics import topics
    except ImportError:  # pragma: no cover - stripped-down Python installs
        print("warning: pydoc_data.topics unavailable, topic prompts skipped", file=sys.stderr)
        return []
    out, seen, k = [], set(), 0
    for key in TOPIC_KEYS:
        if key not in topics:
            print(f"warning: topic {key!r} missing, skipped", file=sys.stderr)
            continue
        passage = topic_passage(topics[key])
        if passage is None or passage in seen:
            print(f"warning: topic {key!r} has no usable passage, skipped", file=sys.stderr)
            continue
        seen.add(passage)
        out.append(f"{TOPIC_TEMPLATES[k % len(TOPIC_TEMPLATES)]}\n\n{passage}")
        k += 1
    return out


# ---------------------------------------------------------------------------
# Assembly
# ---------------------------------------------------------------------------


def categories():
    """task -> list of (category name, list of prompt strings), in fixed order."""
    paragraphs = [f"{instr}\n\n{para}" for instr, para in prompts_explain.PARAGRAPHS]
    return {
        "code": list(prompts_code.CATEGORIES),
        "explain": list(prompts_explain.CATEGORIES)
        + [
            ("paragraph", paragraphs),
            ("stdlib_explain", stdlib_explain_prompts()),
            ("stdlib_docstring", stdlib_docstring_prompts()),
            ("pydoc_topic", topic_prompts()),
        ],
        "write": list(prompts_write.CATEGORIES),
    }


def is_test(position: int) -> bool:
    """Deterministic 25% split: every 4th prompt of a task (2nd, 6th, 10th, ...).

    Positions run over the task's categories in order, so each category
    contributes roughly a quarter of its prompts to test.
    """
    return position % 4 == 2


def build():
    """Return {filename: [records]} for all six files."""
    files = {}
    for task, cats in categories().items():
        train, test = [], []
        n = 0
        for _cat, prompts in cats:
            for prompt in prompts:
                n += 1
                rec = {"id": f"{task}-{n:03d}", "task": task, "prompt": prompt.strip()}
                (test if is_test(n) else train).append(rec)
        files[f"{task}-train.jsonl"] = train
        files[f"{task}-test.jsonl"] = test
    return files


def serialise(records) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def validate(texts: dict[str, str]) -> list[str]:
    """Check the serialised files; return a list of problems (empty if fine)."""
    problems = []
    ids, prompts_by_split = set(), {}
    per_task = {t: 0 for t in TASKS}
    for name, text in texts.items():
        task, split = name[: -len(".jsonl")].rsplit("-", 1)
        if len(text.encode("utf-8")) > SIZE_LIMIT:
            problems.append(f"{name}: larger than {SIZE_LIMIT} bytes")
        for lineno, line in enumerate(text.splitlines(), 1):
            where = f"{name}:{lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                problems.append(f"{where}: invalid JSON ({exc})")
                continue
            if not isinstance(rec, dict) or set(rec) != {"id", "task", "prompt"}:
                problems.append(f"{where}: expected exactly the keys id, task, prompt")
                continue
            if not all(isinstance(rec[k], str) for k in rec):
                problems.append(f"{where}: non-string field")
                continue
            if not rec["prompt"].strip():
                problems.append(f"{where}: empty prompt")
            if rec["task"] != task or not rec["id"].startswith(task + "-"):
                problems.append(f"{where}: task/id does not match file")
            if rec["id"] in ids:
                problems.append(f"{where}: duplicate id {rec['id']}")
            ids.add(rec["id"])
            key = (task, split)
            bucket = prompts_by_split.setdefault(key, set())
            if rec["prompt"] in bucket:
                problems.append(f"{where}: duplicate prompt within {name}")
            bucket.add(rec["prompt"])
            per_task[task] += 1
    for task in TASKS:
        overlap = prompts_by_split.get((task, "train"), set()) & prompts_by_split.get((task, "test"), set())
        if overlap:
            problems.append(f"{task}: {len(overlap)} prompt(s) in both train and test")
        if per_task[task] < 80:
            problems.append(f"{task}: only {per_task[task]} prompts (want >= 80)")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--check", action="store_true", help="do not write; exit 1 if the files on disk differ from a fresh build"
    )
    ap.add_argument("--out", type=Path, default=HERE, help="output directory (default: data/)")
    args = ap.parse_args(argv)

    if sys.version_info[:2] != BUILT_WITH:
        print(
            f"note: committed files were built with Python {BUILT_WITH[0]}.{BUILT_WITH[1]}; "
            f"stdlib-derived explain prompts may differ on {sys.version_info[0]}.{sys.version_info[1]}",
            file=sys.stderr,
        )

    texts = {name: serialise(recs) for name, recs in build().items()}
    problems = validate(texts)
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    if problems:
        return 1

    status = 0
    for name, text in texts.items():
        path = args.out / name
        if args.check:
            current = path.read_text(encoding="utf-8") if path.exists() else None
            if current != text:
                print(f"out of date: {path}", file=sys.stderr)
                status = 1
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8", newline="\n")
        print(f"{name:22s} {text.count(chr(10)):4d} prompts {len(text.encode('utf-8')):7d} bytes")
    return status


if __name__ == "__main__":
    sys.exit(main())
