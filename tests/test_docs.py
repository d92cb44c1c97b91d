"""The documents agree with the tree: the Layout names every module and subpackage of disco/ and nothing that is
not there, and every citation of a results section names a topic file and a heading that exist."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYOUT_DOC = ROOT / "docs" / "architecture.md"  # its "## Layout" section lists every module of disco/
RESULTS = ROOT / "bench" / "results"
# `bench/results/<topic>.md, "<title>"`: the title is a heading of that file, or the start of one, on one line
CITATION = re.compile(r'bench/results/([\w.-]+\.md),\s*"([^"\n]+)"')
CITATION_START = re.compile(r'bench/results/[\w.-]+\.md,\s*"[^"\n]*$', re.MULTILINE)
# the sections that left bench/RESULTS.md (now an index): a citation of them must name the topic file
OLD_CITATION = re.compile(r'bench/RESULTS\.md`?,?\s*"')


def section(text: str, heading: str) -> str:
    """The body of the section `heading` (a `## ` line) up to the next heading of its level or above."""
    lines = text.split("\n")
    start = lines.index(heading) + 1
    end = next((i for i in range(start, len(lines)) if re.match(r"#{1,2} ", lines[i])), len(lines))
    return "\n".join(lines[start:end])


def tree_paths() -> set[str]:
    """disco/'s modules (`disco/x.py`) and subpackages (`disco/sub/`), from the tree."""
    paths: set[str] = set()
    for path in (ROOT / "disco").rglob("*"):
        rel = path.relative_to(ROOT)
        if "__pycache__" in rel.parts or any(part.startswith(".") for part in rel.parts):
            continue
        if path.is_dir() and (path / "__init__.py").exists():
            paths.add(f"{rel.as_posix()}/")
        elif path.suffix == ".py" and path.name != "__init__.py" and (path.parent / "__init__.py").exists():
            paths.add(rel.as_posix())
    return paths


def layout_paths() -> set[str]:
    """The paths the Layout section names: the first word of each line of its code block."""
    body = section(LAYOUT_DOC.read_text(encoding="utf-8"), "## Layout")
    block = body.split("```")[1]
    return {line.split()[0] for line in block.split("\n") if line.strip()}


def test_the_layout_names_every_module_and_subpackage_of_disco() -> None:
    missing = sorted(tree_paths() - layout_paths())
    assert not missing, f"docs/architecture.md, 'Layout' lacks {missing}: add a line for each"


def test_the_layout_names_no_path_that_does_not_exist() -> None:
    stale = sorted(p for p in layout_paths() if not (ROOT / p).exists())
    assert not stale, f"docs/architecture.md, 'Layout' names {stale}, which do not exist: move or drop those lines"


def test_the_readme_layout_names_folders_that_exist() -> None:
    body = section((ROOT / "README.md").read_text(encoding="utf-8"), "## Layout")
    folders = re.findall(r"^(\w[\w.-]*/)", body.split("```")[1], re.MULTILINE)
    assert "disco/" in folders
    assert [f for f in folders if not (ROOT / f).is_dir()] == []


def cited_files() -> list[Path]:
    """Where sections of the results are cited: code, tests, bench scripts, documents, models' READMEs."""
    files = [ROOT / "README.md", ROOT / "Makefile", ROOT / "bench" / "RESULTS.md"]
    for folder, patterns in (
        ("disco", ["**/*.py"]),
        ("tests", ["**/*.py"]),
        ("bench", ["*.py", "*.sh", "results/*.md"]),
        ("docs", ["**/*.md"]),
        ("models", ["*/README.md"]),
        (".ci", ["*"]),
    ):
        for pattern in patterns:
            files += [p for p in (ROOT / folder).glob(pattern) if p.is_file() and "__pycache__" not in p.parts]
    return [f for f in files if f.exists() and f.resolve() != Path(__file__).resolve()]


def headings(path: Path) -> list[str]:
    return [line.lstrip("#").strip() for line in path.read_text(encoding="utf-8").split("\n") if line.startswith("#")]


def test_every_citation_of_a_results_section_names_a_file_and_heading_that_exist() -> None:
    found, bad = 0, []
    for path in cited_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        where = path.relative_to(ROOT)
        for name, title in CITATION.findall(text):
            found += 1
            topic = RESULTS / name
            if not topic.exists():
                bad.append(f"{where}: bench/results/{name} does not exist")
            elif not any(h.startswith(title) for h in headings(topic)):
                bad.append(f'{where}: bench/results/{name} has no heading "{title}"')
        bad += [
            f"{where}: a citation split over lines: {m!r} (keep it on one line)" for m in CITATION_START.findall(text)
        ]
        bad += [
            f'{where}: cites a section of bench/RESULTS.md, now an index: cite bench/results/<topic>.md, "<title>"'
            for _ in OLD_CITATION.findall(text)
        ]
    assert found > 20  # the check reads the citations (it would pass on none)
    assert not bad, "\n".join(bad)


def test_every_topic_file_is_in_the_index() -> None:
    index = (ROOT / "bench" / "RESULTS.md").read_text(encoding="utf-8")
    topics = sorted(p.name for p in RESULTS.glob("*.md"))
    assert topics and [t for t in topics if f"(results/{t})" not in index] == []
