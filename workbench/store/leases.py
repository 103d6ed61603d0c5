"""Readers' leases on generations: garbage collection keeps what a live reader still reads.

A DuckDB connection over a generation (`Store.connect`) reads its parts when a query runs,
perhaps hours later (the app keeps one per generation); meanwhile writers publish newer
generations, compact, and collect what the two newest no longer list. So each reader holds a
lease: a file `leases/<generation>.<random>.lease` it keeps open under an exclusive flock,
made under a temporary name and renamed once locked. Garbage collection keeps every
generation a held lease names, and removes the leases nobody holds any more (their reader
closed, or was killed: the kernel let go of the flock).

A lease counts for collections that start after it is in place; one already under way keeps
the two newest generations it saw, so a reader checks after taking its lease that the
generation is still one of those (`Store.connect` does).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import workbench.store.layout as layout

SUFFIX = ".lease"
UNFINISHED_S = 60.0  # a temporary lease file older than this was left by a killed reader


class Lease:
    """A held lease on one generation; `release()` (idempotent) lets it go."""

    def __init__(self, path: Path, fd: int):
        self.path, self._fd = path, fd

    def release(self) -> None:
        if self._fd < 0:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()
        os.close(self._fd)
        self._fd = -1


def take(root: Path, gen: Path) -> Lease | None:
    """A lease on generation `gen`; None where the store cannot be written (a read-only copy,
    a full disk): the reader then reads without one, as before leases."""
    folder = layout.leases_dir(root)
    token = secrets.token_hex(6)
    tmp = folder / f".{gen.name}.{token}.tmp"
    try:
        folder.mkdir(exist_ok=True)
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        final = folder / f"{gen.name}.{token}{SUFFIX}"
        os.rename(tmp, final)
    except OSError:
        os.close(fd)
        with contextlib.suppress(OSError):
            tmp.unlink()
        return None
    return Lease(final, fd)


@contextlib.contextmanager
def holding(root: Path, gen: Path) -> Iterator[None]:
    """A lease on `gen` for the block (a read of its parts outside DuckDB)."""
    lease = take(root, gen)
    try:
        yield
    finally:
        if lease is not None:
            lease.release()


def held(root: Path) -> set[str]:
    """The generations live leases name; leases nobody holds are removed on the way."""
    folder = layout.leases_dir(root)
    if not folder.is_dir():
        return set()
    names: set[str] = set()
    for path in folder.iterdir():
        if path.name.endswith(SUFFIX):
            if _in_use(path):
                names.add(path.name.split(".", 1)[0])
            else:
                path.unlink(missing_ok=True)
        elif path.name.endswith(".tmp"):  # between its creation and its rename, or killed there
            with contextlib.suppress(OSError):
                if time.time() - path.stat().st_mtime > UNFINISHED_S and not _in_use(path):
                    path.unlink()
    return names


def _in_use(path: Path) -> bool:
    """Whether some process holds the flock of this lease file."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False  # gone since it was listed
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return True  # cannot tell: keep what it names
    finally:
        os.close(fd)
    return False
