"""Writes data/long-prompts.jsonl (10 "explain this stdlib module" prompts of 1,000-3,000 tokens); rerun: .venv/bin/python bench/long_prompts.py [--check]

Issue 30, item 2: exact verification must stay exact on long contexts, so this set gives prompts of
1,000-3,000 tokens (by the embedded pair's tokenizer, chat template applied, as `disco` encodes them),
spread over that range. Each is a short instruction followed by a Python standard-library module
(PSF license) from this interpreter's Lib folder, cut after a whole top-level statement or class member
so that it stays under its token cap. Modules are ones the shipped explain sets do not quote (see
data/README.md). No randomness: the same interpreter (CPython 3.11; the committed file was made with
3.11.7) and tokenizer give a byte-identical file. Prints each prompt's token count; `--check` writes
nothing and exits 1 when the file on disk differs from a fresh build.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "data" / "long-prompts.jsonl"
LOW, HIGH = 1_000, 3_000  # every prompt's token count lies in [LOW, HIGH]
# (module file under Lib, token cap): caps spread over the range; the text is cut below its cap.
MODULES = [
    ("rlcompleter.py", 1150),
    ("sched.py", 1350),
    ("netrc.py", 1550),
    ("getopt.py", 1750),
    ("shelve.py", 1950),
    ("filecmp.py", 2150),
    ("graphlib.py", 2350),
    ("tabnanny.py", 2550),
    ("queue.py", 2750),
    ("cmd.py", 2950),
]
INSTRUCTION = (
    "Explain what this Python module does: its purpose, its main functions and classes, and how they "
    "work together. It is `{name}` from the Python standard library{cut}."
)


def cut_points(source: str) -> list[int]:
    """Line numbers after which the module may be cut: the end of every top-level statement and of
    every statement directly inside a top-level class (methods, class attributes)."""
    ends: list[int] = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef):
            ends += [sub.end_lineno for sub in node.body if sub.end_lineno is not None]
        elif node.end_lineno is not None:
            ends.append(node.end_lineno)
    return sorted(set(ends))


def prompt_text(name: str, code: str, cut: bool) -> str:
    instruction = INSTRUCTION.format(name=name, cut=" (its first part, cut after a whole definition)" if cut else "")
    return f"{instruction}\n\n```python\n{code}\n```"


def build(tokenizer) -> list[tuple[dict, int, int]]:
    """The rows, each with its token counts (chat template applied, then plain)."""
    from disco.sources.hub import encode_prompt

    lib = Path(sysconfig.get_paths()["stdlib"])
    rows = []
    for n, (filename, cap) in enumerate(MODULES, 1):
        lines = (lib / filename).read_text(encoding="utf-8").splitlines()
        points = cut_points("\n".join(lines))
        best = None
        for end in points:  # the longest prefix ending at a cut point that fits the cap
            text = prompt_text(filename.removesuffix(".py"), "\n".join(lines[:end]).rstrip(), end < points[-1])
            chat = len(encode_prompt(tokenizer, text, chat=True))
            if chat > cap:
                break
            best = (text, chat, len(encode_prompt(tokenizer, text, chat=False)))
        if best is None:
            raise SystemExit(f"{filename}: even its first definition is over {cap} tokens")
        text, chat, plain = best
        if not LOW <= plain <= chat <= HIGH:
            raise SystemExit(f"{filename}: {plain}/{chat} tokens, outside {LOW}-{HIGH}")
        rows.append(({"id": f"long-explain-{n:03d}", "task": "explain", "prompt": text}, chat, plain))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the file is out of date")
    args = parser.parse_args()
    if sys.version_info[:2] != (3, 11):
        print(
            f"note: the committed file was built with CPython 3.11; this is {sys.version.split()[0]}", file=sys.stderr
        )
    from transformers import AutoTokenizer

    from disco.sources import embedded

    folder = embedded.tokenizer_folder(embedded.EMBEDDED_TARGET, install=False)
    rows = build(AutoTokenizer.from_pretrained(folder))
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row, _, _ in rows)
    print(f"{'id':<18} {'tokens (chat)':>13} {'tokens (plain)':>14} {'chars':>6}")
    for row, chat, plain in rows:
        print(f"{row['id']:<18} {chat:>13,} {plain:>14,} {len(row['prompt']):>6,}")
    print(f"{len(rows)} prompts, {len(text.encode()):,} bytes")
    if args.check:
        same = OUT.is_file() and OUT.read_text(encoding="utf-8") == text
        print(f"{OUT.relative_to(ROOT)} is {'up to date' if same else 'OUT OF DATE: rerun without --check'}")
        return 0 if same else 1
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
