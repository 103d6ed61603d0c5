"""A real small file system to fill: a tmpfs mounted for one test (mounting needs root; without
it the test is skipped), and `fill`, which takes its free space away."""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def mounted_tmpfs(folder: Path, size: str = "8m") -> Iterator[Path]:
    folder.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(mount: Path, leave: int = 0) -> Path:
    """Fill the file system to the last byte, then give `leave` bytes back; the filler file."""
    filler = mount / "filler"
    with open(filler, "ab", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * (64 << 10))
        except OSError as e:
            assert e.errno == errno.ENOSPC
        f.truncate(max(0, f.tell() - leave))
    return filler
