"""Where things live inside a store folder: the one module that builds store paths.

CURRENT                        name of the live metadata generation (replaced atomically)
meta/gNNNNNNNN/*.parquet       one immutable generation: files, chunks, chunk_tags, ...
scalars/<run-key>/cN.parquet   points of one chunk (a batch of one source file), zstd
events/<run-key>/eN.parquet    events of one chunk
catalog.duckdb                 views for the duckdb CLI, rebuilt (temp + rename) on each commit
CATALOG                        the generation catalog.duckdb reads (kept while it does)
lock                           held by the one process that may write
WORKBENCH_STORE                marks the folder as a store, so ingest never reads its files
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import urllib.parse
from pathlib import Path

import polars as pl

import workbench.store.schema as schema

DEFAULT_STORE = ".workbench"
CATALOG_GENERATION = "CATALOG"
MARKER = "WORKBENCH_STORE"


def store_path(explicit: str | os.PathLike | None = None) -> Path:
    """The store folder: `explicit`, else $WORKBENCH_STORE, else `.workbench/`."""
    return Path(explicit or os.environ.get("WORKBENCH_STORE") or DEFAULT_STORE)


def is_store(folder: Path) -> bool:
    return (folder / MARKER).is_file()


def run_key(run_id: str) -> str:
    """A file-system-safe, collision-free folder name for a run."""
    slug = urllib.parse.quote(run_id, safe="")[:80]
    return f"{slug}-{hashlib.sha1(run_id.encode()).hexdigest()[:10]}"


def scalar_part(root: Path, run_id: str, chunk_id: int) -> Path:
    return root / "scalars" / run_key(run_id) / f"c{chunk_id}.parquet"


def event_part(root: Path, run_id: str, chunk_id: int) -> Path:
    return root / "events" / run_key(run_id) / f"e{chunk_id}.parquet"


def current_generation(root: Path) -> Path | None:
    """The live metadata generation named by CURRENT, or None for a store not yet written."""
    try:
        name = (root / "CURRENT").read_text().strip()
    except FileNotFoundError:
        return None
    return root / "meta" / name


def catalog_generation(root: Path) -> Path | None:
    """The generation catalog.duckdb was written for, or None."""
    try:
        return root / "meta" / (root / CATALOG_GENERATION).read_text().strip()
    except FileNotFoundError:
        return None


def read_meta(table: str, generation: Path | None) -> pl.DataFrame:
    """One metadata table of a generation; tables or columns newer than the store read as empty/null."""
    path = generation / f"{table}.parquet" if generation is not None else None
    if path is None or not path.exists():
        return schema.empty(schema.META_TABLES[table])
    df = pl.read_parquet(path)
    return df.with_columns(
        [pl.lit(None, t).alias(c) for c, t in schema.META_TABLES[table].items() if c not in df.columns]
    )


def read_derived(table: str, generation: Path | None) -> pl.DataFrame:
    """A derived table of a generation (empty when it has none yet)."""
    path = generation / f"{table}.parquet" if generation is not None else None
    if path is None or not path.exists():
        return schema.empty(schema.DERIVED_TABLES[table])
    return pl.read_parquet(path)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fsync_file(path)
