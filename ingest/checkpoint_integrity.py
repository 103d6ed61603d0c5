"""Whether the copies of one checkpoint agree: the file, the sha256 and size its metadata JSON
records, and the file inside an archive of it (`ckpt_100.tar.zst`). Checked when a checkpoint
is first seen or has changed (`ingest --hash` hashes; the sizes are compared always), so a
checkpoint that was overwritten after its metadata and archive were written is reported once,
naming the copy that disagrees.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path
from typing import IO

import pyarrow as pa

from ingest.checkpoints import ARCHIVES, WEIGHTS

BLOCK = 1 << 20


def sha256_of(path: Path) -> str:
    """Of a file, or of a folder's files (their relative paths and contents, in order)."""
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        if path.is_dir():
            h.update(f.relative_to(path).as_posix().encode() + b"\0")
        with open(f, "rb") as fh:
            _update(h, fh)
    return h.hexdigest()


def _update(h, stream: IO[bytes]) -> None:
    while block := stream.read(BLOCK):
        h.update(block)


def archived_sha256(archive: Path, member: str) -> str | None:
    """sha256 of the file named `member` inside a tar archive (plain, .gz or .zst), or of its
    only file; None when it holds no such file. Streamed: nothing is extracted."""
    raw: IO[bytes]
    if archive.name.endswith(".zst"):  # pyarrow decompresses zstd: no extra dependency
        raw = pa.CompressedInputStream(pa.OSFile(str(archive)), "zstd")
    else:
        raw = open(archive, "rb")  # noqa: SIM115 - closed below; tarfile opens .gz itself
    try:
        with tarfile.open(fileobj=raw, mode="r|*") as tar:
            files = 0
            for info in tar:
                if not info.isfile():
                    continue
                files += 1
                if Path(info.name).name == member or member == "":
                    h = hashlib.sha256()
                    fh = tar.extractfile(info)
                    if fh is not None:
                        _update(h, fh)
                    return h.hexdigest()
    finally:
        raw.close()
    return None


def verify(row: dict, hash_files: bool) -> str | None:
    """Check one checkpoint row against its copies: fills `sha256` (with `hash_files`), the
    archive's sha256 in `copies` and `verified`; returns why the copies disagree, or None."""
    path = Path(row["path"])
    meta = json.loads(row["metadata"] or "{}")
    copies = json.loads(row["copies"] or "[]")
    name = {c["kind"]: Path(c["path"]).name for c in copies}
    weights = path.is_file() and path.name.endswith(WEIGHTS)
    if weights and isinstance(meta.get("size"), int) and meta["size"] != row["size"]:
        sizes = f"{path.name} is {row['size']:,} bytes, {name.get('metadata', 'its metadata')} says {meta['size']:,}"
        row["verified"] = f"mismatch: {sizes}"
        return f"{sizes}: it is not the checkpoint its metadata describes"
    if not hash_files:
        return None
    row["sha256"] = sha256_of(path)
    if path.is_file() and path.name.endswith(ARCHIVES):  # no weights file beside: what it holds
        digests = {f"{path.name}'s file": archived_sha256(path, "") or "(empty archive)"}
    else:
        digests = {path.name: row["sha256"]}  # copy -> its sha256
    for c in copies:
        if c["kind"] == "archive" and weights:
            c["sha256"] = held = archived_sha256(Path(c["path"]), path.name)
            if held is None:
                row["copies"] = json.dumps(copies, sort_keys=True)
                row["verified"] = f"mismatch: {name['archive']} holds no {path.name}"
                return f"the archive {name['archive']} holds no {path.name}"
            digests[name["archive"]] = held
    row["copies"] = json.dumps(copies, sort_keys=True) if copies else None
    if isinstance(meta.get("sha256"), str):
        digests[name.get("metadata", "its metadata")] = meta["sha256"].lower()
    if len(digests) < 2 or not (weights or path.name.endswith(ARCHIVES)):
        return None
    why = _disagreement(digests, name.get("metadata", "its metadata"))
    row["verified"] = "ok: " + " = ".join(digests) if why is None else f"mismatch: {why}"
    return why


def _disagreement(digests: dict[str, str], metadata: str) -> str | None:
    """Which copy disagrees, in words (None when all agree): the one the others outvote, else
    the one that is not what the metadata (the record of the save) says."""
    values = list(digests.values())
    if len(set(values)) == 1:
        return None
    common = max(set(values), key=values.count)
    agree = [c for c, v in digests.items() if v == common]
    if len(agree) < 2 and metadata in digests:
        common, agree = digests[metadata], [metadata]
    odd = [c for c, v in digests.items() if v != common]
    if len(agree) >= 2 or agree == [metadata]:
        return (
            f"{', '.join(odd)} (sha256 {digests[odd[0]][:12]}...) disagrees with {' and '.join(agree)} "
            f"({common[:12]}...): it is not the checkpoint that was recorded"
        )
    shown = ", ".join(f"{c} {v[:12]}..." for c, v in digests.items())
    return f"the copies disagree (sha256 {shown}); which one is the checkpoint cannot be told"
