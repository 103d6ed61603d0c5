"""A file's manifest row, and the content signature that tells a grown file from a rewritten one.

The manifest (the store's `files` table) records per file its size, mtime, the bytes consumed,
a hash of those bytes (sampled for big files) and the reader's state, so that the next ingest
reads only what is new.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from ingest.discover import Found

SIG_BYTES = 4096
FULL_HASH_BYTES = 8 << 20  # the content signature hashes smaller prefixes whole ...
SAMPLES = 65  # ... and samples this many SIG_BYTES windows of bigger ones (first, middle, last too)


def content_sig(path: Path, end: int, whole: bool) -> str:
    """A hash of the file's first `end` bytes: all of them for a file that is re-read whole
    anyway (`whole`) or up to FULL_HASH_BYTES, else SAMPLES windows spread evenly over them,
    so that a rewrite of the same size is not taken for the same file."""
    h = hashlib.sha1(str(end).encode())
    with open(path, "rb") as f:
        if whole or end <= FULL_HASH_BYTES:
            h.update(f.read(end))
        else:
            for i in range(SAMPLES):
                f.seek(i * (end - SIG_BYTES) // (SAMPLES - 1))
                h.update(f.read(SIG_BYTES))
    return h.hexdigest()


def file_row(f: Found, run_id: str, status: str, **kw) -> dict:
    size: int | None
    mtime_ns: int | None
    try:
        st = f.path.stat()
        size, mtime_ns = st.st_size, st.st_mtime_ns
    except OSError:
        size = mtime_ns = None
    row = {
        "path": str(f.path),
        "run_id": run_id,
        "format": f.format,
        "status": status,
        "size": size,
        "mtime_ns": mtime_ns,
        "consumed": 0,
        "content_sig": None,
        "first_wall_time": None,
        "last_wall_time": None,
        "records": 0,
        "points": 0,
        "problems": 0,
        "note": None,
        "contents": None,
        "state": None,
        "config_used": None,
        "ingested_at": time.time(),
    }
    row.update(kw)
    return row
