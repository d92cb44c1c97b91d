"""What disco ships beside its code, found wherever disco runs: the prompt sets and the MT-Bench split
(data/), the trained classifiers (models/), the pair files (configs/pairs/) and the GPU probe's shapes
(configs/shapes/).

In a checkout they stay where they are, at its top, where the README, the tests and the bench scripts
name them. A wheel carries them inside the package, under disco/_shipped/ at the same relative paths
(setup.py copies there, at build time, the files SHIPPED names), found through importlib.resources.
So `models/embedded-qwen2.5-coder` names the same artifact in both, from any working directory; a path
of the user's own that exists always wins, and a shipped one is also found by its bare name
(`--prompts code-test`, `--classifier embedded-qwen2.5-coder`, `--pair opt`).

Stdlib only, importing nothing of disco: setup.py loads this file alone to learn what to ship."""

from __future__ import annotations

import fnmatch
from importlib import resources
from pathlib import Path

PACKAGED = "_shipped"  # the folder inside the installed package (a wheel); absent in a checkout
PROMPTS = "data"  # prompt sets (*.jsonl) and the MT-Bench split
CLASSIFIERS = "models"
PAIRS = "configs/pairs"
SHAPES = "configs/shapes"
MT_BENCH_SPLIT = "data/mt-bench-split.json"

# The classifiers the project ships (models/NAME, every file in it): named, so that what a user trains
# under models/ in a checkout never enters a wheel built there. tests/test_packaging.py checks that
# every classifier git tracks is here.
SHIPPED_CLASSIFIERS = (
    "embedded-qwen2.5-coder",
    "embedded-qwen2.5-coder-t0.7",
    "embedded-qwen2.5-coder-llamacpp",
    "embedded-qwen2.5-coder-llamacpp-t0.7",
    "embedded-qwen2.5-coder-vllm",
)
# What a wheel carries, as globs relative to the checkout's top (one folder level each).
SHIPPED = (
    f"{PROMPTS}/*.jsonl",
    MT_BENCH_SPLIT,
    f"{PROMPTS}/README.md",
    f"{PAIRS}/*.yaml",
    f"{SHAPES}/*.json",
    f"{SHAPES}/README.md",
    *(f"{CLASSIFIERS}/{name}/*" for name in SHIPPED_CLASSIFIERS),
)
# Weights never ship: a file over this is refused at build time (the largest shipped file, a LightGBM
# model.txt, is 0.7 MB). Models belong on a hub or in a data wheel (the embedded pair's).
MAX_FILE_BYTES = 4 * 1024 * 1024
NEVER = ("*.gguf", "*.bin", "*.pt", "*.pyc")


def shipped_files(top: Path) -> list[str]:
    """The files a wheel carries, as paths relative to the checkout's top `top`; ValueError on a file over
    MAX_FILE_BYTES or a shipped classifier that is missing."""
    out: set[str] = set()
    for pattern in SHIPPED:
        for f in top.glob(pattern):
            rel = f.relative_to(top).as_posix()
            if not f.is_file() or any(fnmatch.fnmatch(f.name, n) for n in NEVER):
                continue
            if f.stat().st_size > MAX_FILE_BYTES:
                raise ValueError(
                    f"{rel} is {f.stat().st_size / 2**20:.1f} MB: over the {MAX_FILE_BYTES // 2**20} MB a shipped file may be"
                )
            out.add(rel)
    missing = [n for n in SHIPPED_CLASSIFIERS if not (top / CLASSIFIERS / n / "manifest.json").is_file()]
    if missing:
        raise ValueError(f"shipped classifier(s) missing under {top / CLASSIFIERS}: {', '.join(missing)}")
    return sorted(out)


def root() -> Path:
    """The folder holding data/, models/ and configs/: the installed package's _shipped/ (a wheel), else
    the checkout disco is imported from (an editable install, `python cli.py`). disco is installed as
    plain files (pip never zips a package), so its resources are a folder on disk."""
    package = Path(str(resources.files("disco")))
    packaged = package / PACKAGED
    return packaged if packaged.is_dir() else package.parent


def path(relative: str) -> Path:
    """A shipped file or folder by its path relative to the checkout's top, e.g. "data/mt-bench-split.json"."""
    return root() / relative


def find(given: str | Path, folder: str, suffix: str = "") -> Path:
    """`given` as it is where it exists; else the shipped file or folder it names, from any working
    directory: by its checkout path (models/embedded-qwen2.5-coder, data/code-test.jsonl) or by its
    name in `folder` (embedded-qwen2.5-coder; code-test with suffix ".jsonl"). Unchanged when none
    exists, so the caller's own error names what was given."""
    p = Path(given)
    if str(given) == "" or p.exists() or p.is_absolute():
        return p
    base = root()
    home = (base / folder).resolve()
    candidates = [base / p]
    if p.name == str(given):  # a bare name
        candidates += [base / folder / p, base / folder / f"{p}{suffix}"] if suffix else [base / folder / p]
    for c in candidates:
        if c.exists() and c.resolve().is_relative_to(home):
            return c
    return p


def find_prompt_set(given: str | Path) -> Path:
    return find(given, PROMPTS, ".jsonl")


def find_classifier(given: str | Path) -> Path:
    return find(given, CLASSIFIERS)


def find_pair_file(given: str | Path) -> Path:
    return find(given, PAIRS, ".yaml")


def prompt_set_names() -> list[str]:
    """The shipped prompt sets' names (code-train, …): what `--prompts NAME` takes."""
    folder = root() / PROMPTS
    return sorted(p.stem for p in folder.glob("*.jsonl")) if folder.is_dir() else []


def classifier_names() -> list[str]:
    folder = root() / CLASSIFIERS
    return sorted(n for n in SHIPPED_CLASSIFIERS if (folder / n / "manifest.json").is_file())


def pair_file_names() -> list[str]:
    folder = root() / PAIRS
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []
