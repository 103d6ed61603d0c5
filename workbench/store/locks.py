"""A store's exclusive locks, and who holds them: the one writer (`lock`) and the one watch
(`watch.lock`).

Each is an flock held for as long as its holder works (the kernel lets go of it when the
process ends, killed or not, so a lock is never stale); the file says who holds it (pid,
host, since when, what) so that the next process can name it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from workbench.errors import StoreError


@dataclass(frozen=True)
class Holder:
    """Who holds a lock, as its file says (unknown fields: None)."""

    pid: int | None = None
    host: str | None = None
    since: float | None = None
    what: str | None = None

    def describe(self) -> str:
        """'pid 4242 on gpu-node-3, workbench watch, since 2025-01-31 12:00:03'."""
        parts = [
            f"pid {self.pid if self.pid is not None else '?'}" + (f" on {self.host}" if self.host else "")
        ]
        if self.what:
            parts.append(self.what)
        if self.since is not None:
            parts.append("since " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since)))
        return ", ".join(parts)


def this_process(what: str | None = None) -> Holder:
    return Holder(os.getpid(), socket.gethostname(), time.time(), what or process_name())


def process_name() -> str:
    """The command this process runs, e.g. 'workbench ingest' (argv[0]'s name and subcommand)."""
    argv = sys.argv or [""]
    first = Path(argv[0])
    name = first.parent.name if first.name == "__main__.py" else first.name
    sub = argv[1] if len(argv) > 1 and not argv[1].startswith("-") and "/" not in argv[1] else ""
    return f"{name} {sub}".strip()[:80] or "python"


def read_holder(path: Path) -> Holder:
    """Who the lock file names; a file from before holders were recorded holds only a pid."""
    for _ in range(3):  # the holder may be writing it this instant
        try:
            text = path.read_text(errors="replace").strip()
        except OSError:
            return Holder()
        if text.isdigit():
            return Holder(pid=int(text))
        try:
            data = json.loads(text)
            return Holder(data.get("pid"), data.get("host"), data.get("since"), data.get("what"))
        except (ValueError, AttributeError):
            time.sleep(0.05)
    return Holder()


@contextlib.contextmanager
def hold(
    path: Path,
    who: Holder,
    wait_s: float,
    busy: Callable[[Holder], str],
    waiting: Callable[[Holder], str] | None = None,
) -> Iterator[None]:
    """Hold the lock at `path` for the block, as `who`. While another process holds it, wait up
    to `wait_s` seconds (saying `waiting(holder)` once on stderr), then StoreError(`busy(holder)`)."""
    lock = open(path, "a+")  # noqa: SIM115 - held for the whole block
    try:
        _acquire(lock, path, wait_s, busy, waiting)
        with contextlib.suppress(OSError):  # a full disk: held all the same, named by no one
            lock.seek(0)
            lock.truncate()
            lock.write(json.dumps({"pid": who.pid, "host": who.host, "since": who.since, "what": who.what}))
            lock.flush()
        yield
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()


def _acquire(lock, path: Path, wait_s: float, busy, waiting) -> None:
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise StoreError(busy(read_holder(path))) from None
            if not said and waiting is not None:
                print(waiting(read_holder(path)), file=sys.stderr)
                said = True
            time.sleep(0.2)
