"""Files written whole or not at all: what the workbench writes outside the store's generations
(`backtest --out`'s results, the mirror's manifests), made in memory first, goes to a
temporary file in the same folder, is flushed to disk, and is renamed over the old one. A kill or a full disk meanwhile
leaves the previous file as it was (and no temporary file behind, but for a kill)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.store.commit import is_disk_full
from workbench.store.layout import fsync_dir


def write_files(files: dict[Path, bytes]) -> None:
    """Write each file's new content to a temporary file beside it; only when all of them are
    written and flushed are the files replaced (one rename each), so a failure leaves every old
    file in place. A full disk is a WorkbenchError that says so."""
    done: list[tuple[Path, Path]] = []
    try:
        for path, data in files.items():
            tmp = _temporary(Path(path))
            done.append((tmp, Path(path)))
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        for tmp, path in done:
            os.replace(tmp, path)
    except BaseException as e:
        for tmp, _ in done:
            with contextlib.suppress(OSError):
                tmp.unlink()
        if isinstance(e, Exception) and is_disk_full(e):
            where = ", ".join(str(p) for p in files)
            raise WorkbenchError(
                f"disk full while writing {where}: the files there are as they were before; free "
                "some space and run the command again"
            ) from None
        raise
    for folder in {p.parent for _, p in done}:
        fsync_dir(folder)


def write_text(path: Path, text: str) -> None:
    """`path.write_text(text)`, whole or not at all."""
    write_files({Path(path): text.encode()})


def _temporary(path: Path) -> Path:
    """An empty file beside `path` with the mode `path` has (or a new file would get)."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, _mode(path))
    finally:
        os.close(fd)
    return Path(name)


def _mode(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask
