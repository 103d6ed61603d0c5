"""Where logs are read from: local paths in place, object storage through a synced mirror.

`workbench ingest s3://bucket/prefix` (or gs://, az://, any fsspec URL) lists the prefix and
brings the store's mirror of it (`layout.lake_dir`) up to date, fetching only what changed by
each object's ETag and size:
- an object whose ETag and size are as recorded is not fetched at all;
- a grown appendable log (event files, JSON lines, CSV, console logs) gets only its new bytes,
  by a ranged read from its old end, once its old first and last bytes are checked unchanged;
- anything else new or changed is fetched whole; a vanished object's copy is removed (its
  stored points stay, as for a deleted local file);
- checkpoint folders are left out (no logs, and often terabytes): a URL ingest records no
  checkpoints.
Each copy carries its object's modification time, so the pipeline's own manifest (size, mtime,
consumed bytes, content signature) then reads exactly the new bytes of the mirror. Every reader
thus reads local bytes (the TFRecord decoder wants them contiguous), discovery and run ids work
as for the same folder on disk, and per-run tasks on a Ray cluster read the mirror wherever the
store is (a shared file system). Local paths and file:// URLs are read in place: no fsspec.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import time
import urllib.parse
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from ingest.discover import CHECKPOINT_DIR
from workbench.errors import NotFoundError, WorkbenchError
from workbench.store import atomic
from workbench.store.layout import lake_dir

APPENDABLE_SUFFIXES = (".jsonl", ".ndjson", ".csv", ".log", ".txt", ".out", ".err")
CHECK_BYTES = 4096  # the old first and last bytes of a grown object compared before an append
MAX_INFLIGHT = 64  # objects fetched concurrently in one call


@dataclass
class SyncReport:
    url: str
    mirror: Path  # the mirror of the prefix (of the object's folder for a URL naming one object)
    path: Path  # what to ingest: the mirror, or the one object's copy in it
    objects: int = 0
    unchanged: int = 0
    fetched: int = 0  # whole
    appended: int = 0  # ranged reads of the new bytes only
    removed: int = 0
    bytes: int = 0
    seconds: float = 0.0

    def url_of(self, path: str) -> str:
        """The object URL of a path in the mirror (other paths as they are)."""
        base = str(self.mirror)
        if path == base or path.startswith(base + "/"):
            prefix = self.url.rstrip("/") if self.path == self.mirror else self.url.rsplit("/", 1)[0]
            return prefix + path[len(base) :]
        return path

    def line(self) -> str:
        return (
            f"{self.url}: {self.objects} objects, {self.unchanged} unchanged, {self.fetched} fetched, "
            f"{self.appended} appended (new bytes only), {self.removed} removed; "
            f"{self.bytes / 1e6:,.1f} MB in {self.seconds:.2f}s"
        )


def is_url(arg: str) -> bool:
    """An object-storage URL (file:// is a local path)."""
    scheme = urllib.parse.urlsplit(arg).scheme
    return len(scheme) > 1 and scheme != "file"  # "C:" is a drive, not a scheme


def local_path(arg: str | os.PathLike) -> Path:
    arg = os.fspath(arg)
    if arg.startswith("file://"):
        return Path(urllib.parse.unquote(urllib.parse.urlsplit(arg).path))
    return Path(arg)


def resolve(args: list[str], store_root: Path, storage_options: dict | None = None):
    """Local paths for `args`: URLs become their synced mirror. Returns (paths, sync reports)."""
    paths, reports = [], []
    for arg in args:
        if is_url(arg):
            report = sync(arg, store_root, storage_options)
            reports.append(report)
            paths.append(report.path)
        else:
            paths.append(local_path(arg))
    return paths, reports


def as_urls(report, synced: list[SyncReport]) -> None:
    """Name the mirrored files of an ingest report's problems and notes by their object URLs."""
    for s in synced:
        report.problems = [(s.url_of(p), x) for p, x in report.problems]
        report.notes = [(s.url_of(p), n) for p, n in report.notes]


def appendable(key: str) -> bool:
    name = key.rsplit("/", 1)[-1]
    return "tfevents" in name or name.endswith(APPENDABLE_SUFFIXES)


def sync(url: str, store_root: Path, storage_options: dict | None = None) -> SyncReport:
    """Bring the mirror of `url` in the store up to date (see the module docstring)."""
    t0 = time.perf_counter()
    fs, root = _filesystem(url, storage_options)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    base = lake_dir(store_root)
    mirror = base / "files" / protocol / root.strip("/")
    manifest_path = base / "manifest" / f"{hashlib.sha1(url.rstrip('/').encode()).hexdigest()[:16]}.json"
    try:
        listing = fs.find(root, detail=True)
    except FileNotFoundError:
        listing = {}
    except OSError as e:
        raise WorkbenchError(f"cannot list {url}: {e}") from None
    path = mirror
    single = listing.get(root.rstrip("/"))
    if single is not None and single.get("type") == "file":  # the URL names one object
        root, name = root.rstrip("/").rsplit("/", 1)
        listing = {f"{root}/{name}": single}
        mirror = mirror.parent
    report = SyncReport(url, mirror, path)
    objects = {
        k[len(root.rstrip("/")) + 1 :]: info
        for k, info in listing.items()
        if info.get("type") != "directory"
        and not k.endswith("/")
        and k != root.rstrip("/")
        # checkpoints are no logs and can weigh terabytes: not mirrored (nor in `checkpoints`)
        and not any(CHECKPOINT_DIR.fullmatch(part) for part in k.split("/")[:-1])
    }
    if not objects and not fs.exists(root):
        raise NotFoundError(f"{url}: no such bucket or prefix (or nothing under it)")
    report.objects = len(objects)
    base.mkdir(parents=True, exist_ok=True)
    with _locked(base / "lock"):
        prev = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
        whole, grown, now = [], [], {}
        for rel, info in sorted(objects.items()):
            entry = {"etag": _version(info), "size": int(info.get("size") or 0), "mtime": _mtime(info)}
            now[rel] = entry
            old, local = prev.get(rel), mirror / rel
            same = old is not None and (old["etag"], old["size"]) == (entry["etag"], entry["size"])
            if same and _size(local) == entry["size"]:
                report.unchanged += 1
                continue
            if (
                old is not None
                and appendable(rel)
                and not rel.endswith(".gz")
                and 0 < old["size"] < entry["size"]
                and _size(local) == old["size"]
            ):
                grown.append((rel, old["size"]))
            else:
                whole.append(rel)
        _append(fs, root, mirror, grown, whole, report)
        _fetch(fs, root, mirror, base / "incoming", whole, report)
        for rel in set(prev) - set(now):
            with contextlib.suppress(FileNotFoundError):
                (mirror / rel).unlink()
                report.removed += 1
        for rel in whole + [rel for rel, _ in grown]:
            if (mirror / rel).exists():  # what the pipeline's manifest and is_settled see
                ns = _mtime_ns(now[rel])
                os.utime(mirror / rel, ns=(ns, ns))
        manifest_path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_text(manifest_path, json.dumps(now, sort_keys=True))
    mirror.mkdir(parents=True, exist_ok=True)
    report.seconds = time.perf_counter() - t0
    return report


def _filesystem(url: str, storage_options: dict | None):
    try:
        import fsspec  # only for object storage: local ingests never pay its import
    except ImportError:
        raise WorkbenchError("reading object storage needs fsspec: pip install -e '.[s3]'") from None
    try:
        return fsspec.url_to_fs(url, **(storage_options or {}))
    except (ImportError, ValueError) as e:
        scheme = urllib.parse.urlsplit(url).scheme
        raise WorkbenchError(
            f"cannot read {scheme}:// URLs ({e}); for s3:// pip install -e '.[s3]', "
            "for gs:// gcsfs, for az:// adlfs"
        ) from None


def _append(fs, root: str, mirror: Path, grown: list[tuple[str, int]], whole: list[str], report) -> None:
    """Ranged reads of the new bytes of grown appendable objects; one whose old first or last
    bytes changed (rewritten, not appended to) joins `whole`."""
    if not grown:
        return
    paths, starts, ends = [], [], []
    for rel, old in grown:
        n = min(CHECK_BYTES, old)
        paths += [f"{root}/{rel}", f"{root}/{rel}"]
        starts += [0, old - n]
        ends += [n, old]
    remote = fs.cat_ranges(paths, starts, ends, max_gap=None)
    fresh = []
    for i, (rel, old) in enumerate(grown):
        with open(mirror / rel, "rb") as f:
            head = f.read(ends[2 * i])
            f.seek(starts[2 * i + 1])
            tail = f.read()
        if (head, tail) == (remote[2 * i], remote[2 * i + 1]):
            fresh.append((rel, old))
        else:
            whole.append(rel)
    for k in range(0, len(fresh), MAX_INFLIGHT):
        part = fresh[k : k + MAX_INFLIGHT]
        data = fs.cat_ranges([f"{root}/{rel}" for rel, _ in part], [old for _, old in part], None)
        for (rel, _), new in zip(part, data, strict=True):
            if isinstance(new, Exception):
                raise WorkbenchError(f"cannot read {root}/{rel}: {new}")
            with open(mirror / rel, "ab") as f:
                f.write(new)
            report.appended += 1
            report.bytes += len(new)


def _fetch(fs, root: str, mirror: Path, incoming: Path, rels: list[str], report) -> None:
    """Whole objects, concurrently, each written outside the mirror (never half a file in it)
    and renamed over its copy."""
    incoming.mkdir(parents=True, exist_ok=True)
    for k in range(0, len(rels), MAX_INFLIGHT):
        part = sorted(rels[k : k + MAX_INFLIGHT])
        tmps = [incoming / f"{i}" for i in range(len(part))]
        for rel in part:
            (mirror / rel).parent.mkdir(parents=True, exist_ok=True)
        try:
            fs.get([f"{root}/{rel}" for rel in part], [str(t) for t in tmps])
        except OSError as e:
            raise WorkbenchError(f"cannot fetch from {root}: {e}") from None
        for rel, tmp in zip(part, tmps, strict=True):
            report.bytes += tmp.stat().st_size
            os.replace(tmp, mirror / rel)
            report.fetched += 1


def _version(info: dict) -> str | None:
    """What changes when an object is written again: its ETag (S3, Azure), else its
    generation or checksum (GCS), else its modification time."""
    for k in ("ETag", "etag", "generation", "md5Hash", "crc32c"):
        if info.get(k):
            return str(info[k]).strip('"')
    m = _mtime(info)
    return None if m is None else repr(m)


def _mtime(info: dict) -> float | None:
    for k in ("LastModified", "last_modified", "updated", "mtime", "created"):
        v = info.get(k)
        if isinstance(v, datetime):
            return v.timestamp()
        if isinstance(v, int | float):
            return float(v)
        if isinstance(v, str):
            with contextlib.suppress(ValueError):
                return datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
    return None


def _mtime_ns(entry: dict) -> int:
    """The copy's mtime: the object's. Stores that keep whole seconds (S3) get a fraction from
    the ETag, so that an object rewritten at the same size within the same second still looks
    changed to the pipeline's size-and-mtime manifest."""
    if entry["mtime"] is None:
        return time.time_ns()
    ns = int(entry["mtime"] * 1e9)
    if ns % 1_000_000_000 == 0 and entry["etag"]:
        ns += int(hashlib.sha1(entry["etag"].encode()).hexdigest()[:8], 16) % 1_000_000_000
    return ns


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


@contextlib.contextmanager
def _locked(path: Path):
    """One sync of a store's mirror at a time (two ingests of the same bucket)."""
    with open(path, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
