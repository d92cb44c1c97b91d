"""A collection's processes (docs/architecture.md, "Data flow"): its share of a launch (`Dist`: torchrun or
`accelerate launch` set RANK / WORLD_SIZE; prompt i belongs to rank i % world), the lock that keeps a second
run out of a trace folder (`folder_lock`: flock on OUT/.lock, so a second `disco collect` into it says it is
busy), and SIGTERM taken as Ctrl-C. collect.py's oracle and trace.py's format know none of this.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import platform
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

import torch

from disco.base.errors import DiscoError
from disco.formats.trace import LOCK

T = TypeVar("T")


@dataclass(frozen=True)
class Dist:
    """This process's share of the prompts: prompt i belongs to rank i % world."""

    rank: int = 0
    world: int = 1

    def mine(self, n: int) -> list[int]:
        return list(range(self.rank, n, self.world))

    def main_first(self, main: Callable[[], T], other: Callable[[], T] | None = None) -> T:
        """Rank 0 runs `main` while the others wait, then the others run `other` (default `main`).

        The barrier is passed even when rank 0 fails, so the others never hang: they then run
        `other` themselves and fail with their own message, or carry on."""
        if self.world == 1:
            return main()
        if self.rank == 0:
            try:
                return main()
            finally:
                torch.distributed.barrier()
        torch.distributed.barrier()
        return (other or main)()

    def release(self) -> None:
        """End the launch's group once the ranks are past their start-up barriers (they never synchronise
        after that): a serving engine started in this process (vLLM, each rank its own instance) takes
        torch.distributed's default group for its own world, and would take a live launch group for it."""
        if self.world > 1 and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


@contextlib.contextmanager
def distributed() -> Iterator[Dist]:
    """This process's rank and world size, from RANK / WORLD_SIZE as torchrun and `accelerate launch` set them.

    With several processes: each uses GPU LOCAL_RANK (when there are GPUs), and a gloo group
    serves the barriers at start-up (model loading, preparing the folder); `Dist.release` ends it
    then. Nothing is synchronised after that, so a slow or killed rank never stalls or kills the others."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        yield Dist()
        return
    rank = int(os.environ["RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    # Rank 0 may first prepare the embedded pair (minutes): a generous timeout for the first barrier.
    torch.distributed.init_process_group("gloo", timeout=timedelta(hours=2))
    group = torch.distributed.group.WORLD
    try:
        yield Dist(rank, world)
    finally:  # unless Dist.release ended it (a group there now is vLLM's: it ends it itself)
        if torch.distributed.is_initialized() and torch.distributed.group.WORLD is group:
            torch.distributed.destroy_process_group()


def _lock_token(dist: Dist) -> str:
    """Who holds the folder: this process, or (torchrun, accelerate launch) this launch, whose ranks
    share the launcher's run id (or parent process)."""
    if dist.world == 1:
        return f"pid {os.getpid()} on {platform.node()}"
    return f"launch {os.environ.get('TORCHELASTIC_RUN_ID') or os.getppid()} on {platform.node()}"


def _busy(out_dir: Path, holder: str) -> DiscoError:
    return DiscoError(
        f"--out {out_dir} is busy: another disco collect ({holder or 'another process'}) is writing "
        "into it; wait for it to end (then rerun to resume), or choose another --out"
    )


def _try_flock(fh) -> bool:
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


@contextlib.contextmanager
def folder_lock(out_dir: Path, dist: Dist = Dist()) -> Iterator[None]:
    """One run writes a trace folder at a time. Rank 0 holds an exclusive flock on OUT/.lock for the
    whole run (released if the process dies) with its launch's token inside; every other rank checks
    that token (so the ranks of a second launch stop too) and holds OUT/.lock-rNNN, which rank 0 of a
    later run must find free (a rank may still be writing after rank 0 ended)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    token = _lock_token(dist)
    with contextlib.ExitStack() as stack:
        if dist.rank == 0:
            fh = stack.enter_context(open(out_dir / LOCK, "a+"))
            if not _try_flock(fh):
                fh.seek(0)
                raise _busy(out_dir, fh.read().strip())
            for other in out_dir.glob(f"{LOCK}-r*"):
                with open(other, "a+") as oh:
                    if not _try_flock(oh):
                        raise _busy(
                            out_dir, f"rank {other.name.rsplit('-r', 1)[-1].lstrip('0') or '0'} of an earlier launch"
                        )
                    fcntl.flock(oh, fcntl.LOCK_UN)
            fh.seek(0)
            fh.truncate()
            fh.write(token + "\n")
            fh.flush()
        else:
            holder = (out_dir / LOCK).read_text().strip() if (out_dir / LOCK).is_file() else ""
            if holder != token:
                raise _busy(out_dir, holder)
            fh = stack.enter_context(open(out_dir / f"{LOCK}-r{dist.rank:03d}", "a+"))
            if not _try_flock(fh):
                raise _busy(out_dir, f"rank {dist.rank} of another launch")
        yield


def probe_lock(out_dir: Path) -> None:
    """Before the models load: refuse a folder another run holds now (collect takes the lock itself later)."""
    lock = out_dir / LOCK
    if not lock.is_file():
        return
    with open(lock, "a+") as fh:
        if not _try_flock(fh):
            fh.seek(0)
            raise _busy(out_dir, fh.read().strip())
        fcntl.flock(fh, fcntl.LOCK_UN)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """A `kill` (SIGTERM, as job schedulers send) ends the run like Ctrl-C, so the finished prompts are
    flushed (only the main thread can set a handler; elsewhere nothing changes)."""
    old = signal.signal(signal.SIGTERM, _interrupt) if threading.current_thread() is threading.main_thread() else None
    try:
        yield
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)
