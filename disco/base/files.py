"""Writing files so that an interrupted run never leaves a half-written one behind."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

from disco.base.errors import DiscoError

try:  # POSIX only; elsewhere work goes on without a cross-process lock.
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write to a temporary file in the same folder, then rename it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask_mode(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def umask_mode(path: str | Path) -> None:
    """Give a file the mode a plain open() would have (0666 less the umask): mkstemp makes it 0600,
    which would hide shared traces, artifacts and results from the rest of a group."""
    os.chmod(path, 0o666 & ~current_umask())


def current_umask() -> int:
    mask = os.umask(0o022)  # the only way to read it is to set it; put it back at once
    os.umask(mask)
    return mask


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Fill a temporary sibling folder, then rename it to `path` (replacing an older one):
    readers see the whole folder or none of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # mkdir, not mkdtemp: mkdtemp's 0700 would make a shared cache folder unreadable to others
    tmp = path.parent / f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
    tmp.mkdir()
    try:
        yield tmp
        # The older folder is moved aside, not deleted, until the new one is in place: a failed
        # rename then puts it back, and nothing the user had is lost.
        aside = path.parent / f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.old"
        had = path.exists()
        if had:
            os.replace(path, aside)
        try:
            os.replace(tmp, path)
        except BaseException:
            if had:
                os.replace(aside, path)
            raise
        if had:
            shutil.rmtree(aside, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def file_lock(path: str | Path, waiting: str = "", progress: bool = True) -> Iterator[None]:
    """Exclusive cross-process lock on `path` (flock: released if the process dies). `waiting`:
    what to print while another process holds it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        if fcntl is not None:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if progress and waiting:
                    print(f"disco: {waiting}", file=sys.stderr)
                fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(fh, fcntl.LOCK_UN)


def file_key(path: str | Path) -> str:
    """A short key for a file as it is now (its resolved path, size and modification time): names a
    cache entry derived from it, which a changed or replaced file then no longer matches."""
    path = Path(path).resolve()
    st = path.stat()
    return hashlib.sha256(f"{path}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]


# --- output discipline: check before the work, write atomically, one line on failure -------------

_CAUSES = {
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EISDIR: "it is a directory",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.ENAMETOOLONG: "the name is too long",
    errno.EEXIST: "it already exists",
}


def cause(e: OSError) -> str:
    """An OSError's cause in words (read-only, no space, is a directory, …)."""
    return _CAUSES.get(e.errno or 0, e.strerror or str(e))


def os_error(e: OSError, path: str | Path, kept: str = "") -> DiscoError:
    """One line naming the path and the cause of a failed write (kept: where finished work is)."""
    cause = _CAUSES.get(e.errno or 0, e.strerror or str(e))
    where = e.filename if e.filename and str(e.filename) != str(path) else None
    line = f"could not write {path}" + (f" ({where})" if where else "") + f": {cause}"
    return DiscoError(line + (f"; {kept}" if kept else ": choose another location or free it"))


def probe_writable(folder: Path, flag: str, path: Path) -> None:
    """Create and remove a file in the nearest existing folder above `path`: the only reliable test
    (os.access says yes to root on a read-only mount's files, and nothing about free inodes)."""
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise DiscoError(f"{flag} {path}: {folder} is a file, not a folder: choose another {flag}")
    try:
        fd, probe = tempfile.mkstemp(prefix=".disco-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise DiscoError(
            f"{flag} {path} cannot be written: {_CAUSES.get(e.errno or 0, e.strerror)} "
            f"({folder}): choose another {flag}"
        ) from None


def check_out_file(path: str | Path, flag: str) -> None:
    """Before any work: `path` can be written as a file (not a folder, its folder writable)."""
    path = Path(path)
    if path.is_dir():
        raise DiscoError(f"{flag} {path} is a folder: give a file name, e.g. {path / 'out.json'}")
    probe_writable(path.parent, flag, path)


def is_trace_folder(path: Path) -> bool:
    """A folder `disco collect` wrote (its manifest says disco-trace, or it holds data/ shards)."""
    manifest = path / "manifest.json"
    if manifest.is_file():
        with contextlib.suppress(OSError, ValueError):
            return str(json.loads(manifest.read_text(encoding="utf-8")).get("format", "")).startswith("disco-trace")
    return (path / "data").is_dir() and any((path / "data").glob("*.parquet"))


def check_out_dir(path: str | Path, flag: str, overwrite: bool, what: str = "results") -> None:
    """Before any work: `path` is a folder we may fill. Not a file; never a trace folder (one
    output replacing another's data); not a non-empty folder unless overwrite, which then
    replaces it whole (atomic_dir); and its parent can be written (the temporary sibling lives there)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise DiscoError(f"{flag} {path} is a file: give a folder for the {what}")
    if path.is_dir():
        if is_trace_folder(path):
            raise DiscoError(
                f"{flag} {path} holds traces (disco collect): writing the {what} there would replace "
                "them; choose another folder"
            )
        if any(path.iterdir()) and not overwrite:
            raise DiscoError(
                f"{flag} {path} is not empty: choose another {flag}, or pass --overwrite to replace it whole"
            )
    probe_writable(path.parent, flag, path)


def rescue_path(name: str) -> Path:
    """Where a finished result goes when its destination cannot take it: a new name in the temp folder."""
    return Path(tempfile.mkdtemp(prefix=f"disco-{name}-"))


def write_or_rescue(path: str | Path, write: Callable[[Path], None], what: str) -> None:
    """write(path); when that fails with an OSError (disk full, read-only, …), write(a path in the
    temp folder) instead and raise one line saying where the finished `what` is."""
    path = Path(path)
    try:
        write(path)
        return
    except OSError as e:
        err = e
    try:
        spare = rescue_path(path.stem) / path.name
        write(spare)
    except OSError:
        raise os_error(err, path, f"the {what} could not be saved elsewhere either") from None
    raise os_error(err, path, f"the finished {what} is saved in {spare} instead: move it where you want it") from None


def write_dir(path: str | Path, fill: Callable[[Path], None], what: str) -> None:
    """Fill a new folder at `path` atomically (atomic_dir: it replaces an older one whole), with the
    rescue of write_or_rescue when the destination fails."""

    def one(dest: Path) -> None:
        with atomic_dir(dest) as tmp:
            fill(tmp)

    write_or_rescue(path, one, what)
