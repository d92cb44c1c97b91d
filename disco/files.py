"""Writing files so that an interrupted run never leaves a half-written one behind."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any, Iterator

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
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
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
