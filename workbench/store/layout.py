"""Where things live inside a store folder: the one module that builds store paths.

WORKBENCH_STORE                marks the folder as a store (so ingest never reads its files); from
                               the first publish on, names its format version
                               ("training-log-workbench store, format 1")
CURRENT                        name of the live metadata generation (replaced atomically)
meta/gNNNNNNNN/*.parquet       one immutable generation: files, chunks, chunk_tags, parts, ...
meta/gNNNNNNNN/MANIFEST.json   size and sha256 of each of its tables
scalars/<run-key>/cN.parquet   points of one chunk (a batch of one source file), zstd
events/<run-key>/eN.parquet    events of one chunk
scalars/_compacted/kN_M.parquet  the points of many chunks, sorted by run so that DuckDB skips
                               the row groups of other runs: merged by compaction (also sorted by
                               tag and step), or the small chunks of many runs that one ingest
                               wrote together (a file per few million points instead of one per run)
catalog.duckdb                 views for the duckdb CLI, rebuilt (temp + rename) on each commit
CATALOG                        the generation catalog.duckdb reads (kept while it does)
lock                           held by the one process that may write (who: pid, host, since, what)
watch.lock                     held by the one `workbench watch` of the store (who, as `lock`)
leases/<gen>.<id>.lease        a reader's lease on a generation: kept while its flock is held
lake/files/<scheme>/<bucket>/  the mirror of object-storage prefixes ingested by URL (ingest/source.py)
lake/manifest/<url-hash>.json  each object's ETag, size and mtime at its last sync

An empty marker (a store written before format versions, or one not yet published) is format 1.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import re
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING

import workbench.store.schema as schema
from workbench.errors import StoreError

if TYPE_CHECKING:
    import polars as pl

DEFAULT_STORE = ".workbench"
CATALOG_GENERATION = "CATALOG"
MARKER = "WORKBENCH_STORE"
FORMAT_VERSION = 1
MARKER_TEXT = f"training-log-workbench store, format {FORMAT_VERSION}\n"
MANIFEST = "MANIFEST.json"
GENERATION = re.compile(r"g\d{8}")
PART_NAME = {
    "scalars": re.compile(r"[ck](\d+)(_\d+)?\.parquet(\.tmp)?"),
    "events": re.compile(r"e(\d+)\.parquet(\.tmp)?"),
}
WRITER_LOCK = "lock"
WATCH_LOCK = "watch.lock"
LEASES = "leases"
COMPACTED = "_compacted"  # run keys always end in -<hash>, so no run's folder has this name


def store_path(explicit: str | os.PathLike | None = None) -> Path:
    """The store folder: `explicit`, else $WORKBENCH_STORE, else `.workbench/`."""
    return Path(explicit or os.environ.get("WORKBENCH_STORE") or DEFAULT_STORE)


def is_store(folder: Path) -> bool:
    """Whether `folder` holds a store's marker (a folder that cannot be looked into holds none
    that counts)."""
    try:
        return (folder / MARKER).is_file()
    except OSError:  # EACCES: Path.is_file raises it
        return False


def writer_lock(root: Path) -> Path:
    return root / WRITER_LOCK


def watch_lock(root: Path) -> Path:
    return root / WATCH_LOCK


def leases_dir(root: Path) -> Path:
    """Where readers keep their leases on generations (`workbench.store.leases`)."""
    return root / LEASES


def lake_dir(root: Path) -> Path:
    """Where ingests of object-storage URLs keep their mirror and its manifest."""
    return root / "lake"


def run_key(run_id: str) -> str:
    """A file-system-safe, collision-free folder name for a run."""
    slug = urllib.parse.quote(run_id, safe="")[:80]
    return f"{slug}-{hashlib.sha1(run_id.encode()).hexdigest()[:10]}"


def scalar_part(root: Path, run_id: str, chunk_id: int) -> Path:
    return root / "scalars" / run_key(run_id) / f"c{chunk_id}.parquet"


def event_part(root: Path, run_id: str, chunk_id: int) -> Path:
    return root / "events" / run_key(run_id) / f"e{chunk_id}.parquet"


def compacted_part(root: Path, number: int, seq: int) -> Path:
    """The `seq`th file of many chunks that generation `number` is the first to list."""
    return root / "scalars" / COMPACTED / f"k{number}_{seq}.parquet"


def part_files(root: Path, kinds, run_ids, chunk_ids, files=None) -> list[str]:
    """The paths of many parts as strings, as `scalar_part` and `event_part` name them (one run
    key per run); `files`: the store-relative file of parts compacted into a shared one."""
    folders: dict[tuple[str, str], str] = {}
    out = []
    files = files if files is not None else [None] * len(chunk_ids)
    for kind, run_id, chunk_id, file in zip(kinds, run_ids, chunk_ids, files, strict=True):
        if file is not None:
            out.append(f"{root}/{file}")
            continue
        folder = folders.get((kind, run_id))
        if folder is None:
            folder = folders[kind, run_id] = str(root / kind / run_key(run_id))
        out.append(f"{folder}/{'c' if kind == 'scalars' else 'e'}{chunk_id}.parquet")
    return out


def repair_hint(root: Path) -> str:
    return f"see what is damaged with: workbench check --store {root} (and repair it with --repair)"


def read_format(root: Path) -> int | None:
    """The format version the marker names (1 for a marker written before versions), or None
    for a folder that is no store yet; ValueError for a marker that names none."""
    try:
        text = (root / MARKER).read_text(errors="replace")
    except FileNotFoundError:
        return None
    if not text.strip():
        return 1
    m = re.fullmatch(r"training-log-workbench store, format (\d+)\s*", text)
    if m is None:
        raise ValueError(f"names no store format ({text[:60]!r})")
    return int(m[1])


def newer_format_message(root: Path, version: int) -> str:
    return (
        f"the store at {root} has format {version}, newer than this workbench reads "
        f"(format {FORMAT_VERSION}): upgrade training-log-workbench, or use another --store"
    )


def store_format(root: Path) -> int | None:
    """`read_format`, raising StoreError for a marker that is damaged or names a newer format."""
    try:
        version = read_format(root)
    except ValueError as e:
        raise StoreError(f"{root / MARKER} {e}; {repair_hint(root)}") from None
    if version is not None and version > FORMAT_VERSION:
        raise StoreError(newer_format_message(root, version))
    return version


def published(root: Path) -> bool:
    """Whether a generation was ever published here: the marker names a format (it is written
    at the first publish) or catalog.duckdb (rebuilt after every publish, also by stores from
    before format versions) is there. Without either, what lies in the folder are leftovers of
    a first ingest that was killed: nothing refers to them."""
    marker = root / MARKER
    return (root / "catalog.duckdb").exists() or (marker.is_file() and marker.stat().st_size > 0)


def write_marker(root: Path) -> None:
    """Name this format in the marker (after a publish; a marker from before versions is rewritten)."""
    marker = root / MARKER
    if marker.is_file() and marker.read_text(errors="replace") == MARKER_TEXT:
        return
    tmp = root / (MARKER + ".tmp")
    tmp.write_text(MARKER_TEXT)
    os.replace(tmp, marker)


def generations(root: Path) -> list[Path]:
    """Every published-looking generation folder, oldest first."""
    meta = root / "meta"
    if not meta.is_dir():
        return []
    return sorted(p for p in meta.iterdir() if GENERATION.fullmatch(p.name) and p.is_dir())


def current_generation(root: Path) -> Path | None:
    """The live metadata generation named by CURRENT, or None for a store not yet written.

    A store that has published and holds generations or parts but no valid CURRENT is damaged,
    not empty: StoreError, so that nothing answers from it (or collects its garbage) as if it
    were empty.
    """
    try:
        text = (root / "CURRENT").read_text(errors="replace")
    except FileNotFoundError:
        if not published(root):
            return None
        gens = generations(root)
        parts = any(next((root / k).glob("*/*"), None) for k in schema.PART_KINDS if (root / k).is_dir())
        if gens or parts:
            held = f"{len(gens)} metadata generations" if gens else "Parquet parts and no metadata"
            raise StoreError(
                f"the store at {root} is damaged: CURRENT is missing, and it holds {held}; {repair_hint(root)}"
            ) from None
        return None
    name = text.strip()
    gen = root / "meta" / name
    if not GENERATION.fullmatch(name) or not gen.is_dir():
        raise StoreError(
            f"the store at {root} is damaged: CURRENT names {name[:40]!r}, which is no generation in meta/; "
            + repair_hint(root)
        )
    return gen


def catalog_generation(root: Path) -> Path | None:
    """The generation catalog.duckdb was written for, or None."""
    try:
        return root / "meta" / (root / CATALOG_GENERATION).read_text().strip()
    except FileNotFoundError:
        return None


def read_meta(table: str, generation: Path | None) -> pl.DataFrame:
    """One metadata table of a generation, in today's columns: tables or columns newer than the
    store read as empty/null, columns no longer kept are left out. A table that cannot be read is
    damage: StoreError."""
    import polars as pl  # here: a reader of the store (`workbench sql`) loads no polars

    path = generation / f"{table}.parquet" if generation is not None else None
    if path is None or not path.exists():
        return schema.empty(schema.META_TABLES[table])
    try:
        df = pl.read_parquet(path, glob=False)
    except Exception as e:  # noqa: BLE001 - whatever the reader says, the file is damaged
        assert generation is not None  # path lies in it
        root = generation.parent.parent
        raise StoreError(
            f"the store at {root} is damaged: {path.relative_to(root)} cannot be read ({str(e).splitlines()[0]}); "
            + repair_hint(root)
        ) from None
    sch = schema.META_TABLES[table]
    return df.select([pl.col(c) if c in df.columns else pl.lit(None, t).alias(c) for c, t in sch.items()])


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def write_manifest(gen: Path) -> None:
    """Size and sha256 of every table file of a generation being written."""
    tables = {
        p.name: {"size": p.stat().st_size, "sha256": sha256_file(p)} for p in sorted(gen.glob("*.parquet"))
    }
    path = gen / MANIFEST
    path.write_text(json.dumps({"format": FORMAT_VERSION, "tables": tables}, indent=1, sort_keys=True))
    fsync_file(path)


def read_manifest(gen: Path) -> dict | None:
    """The generation's manifest (None for one written before manifests). Raises ValueError or
    OSError for a damaged one."""
    path = gen / MANIFEST
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("tables"), dict):
        raise ValueError("not a generation manifest")
    return data


def read_derived(table: str, generation: Path | None) -> pl.DataFrame:
    """A derived table of a generation (empty when it has none yet), in today's columns."""
    import polars as pl

    path = generation / f"{table}.parquet" if generation is not None else None
    sch = schema.DERIVED_TABLES[table]
    if path is None or not path.exists():
        return schema.empty(sch)
    df = pl.read_parquet(path, glob=False)  # a store folder may be named `runs[1]`
    return df.select([pl.col(c) if c in df.columns else pl.lit(None, t).alias(c) for c, t in sch.items()])


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_filesystem(root: Path) -> None:
    """Flush every file written under `root` to disk at once (Linux `syncfs`; `sync` elsewhere):
    parts are written without an fsync each (10k small runs would pay 10k of them), and this
    runs before a generation that lists them is published."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(root, os.O_RDONLY)
        try:
            if libc.syncfs(fd) == 0:
                return
        finally:
            os.close(fd)
    except (OSError, AttributeError):
        pass
    os.sync()


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fsync_file(path)
