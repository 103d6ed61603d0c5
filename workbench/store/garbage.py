"""Garbage collection: what no live generation refers to goes, when a writer opens the store.

Unpublished generations (killed writers), generations older than the two newest kept (a reader
may lag one behind), the one catalog.duckdb reads and those a live reader holds a lease on
(`leases.py`), and parts no kept generation lists. Only
what is proven unreferenced goes: a kept generation that cannot be read keeps every part, a
file not named like a part stays.
"""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import cast

import polars as pl

import workbench.store.integrity as integrity
import workbench.store.layout as layout
import workbench.store.leases as leases
import workbench.store.schema as schema

UNLINKERS = 16  # unlinks in flight: the kernel does the work, threads only wait on it


def collect(root: Path, current: Path | None) -> int:
    """Remove what no live generation refers to: unpublished generations (killed writers),
    old ones, and parts no kept generation lists. Only what is proven unreferenced goes: a
    kept generation that cannot be read keeps every part, a file not named like a part stays.
    `current`: the store's current generation (None: nothing was ever published, all is a
    killed writer's). Returns the highest chunk id a kept generation lists (0 for none)."""
    meta = root / "meta"
    if meta.is_dir():
        for p in meta.iterdir():
            if p.name.endswith(".tmp"):
                shutil.rmtree(p, ignore_errors=True)
    gens = layout.generations(root)
    keep = [g for g in gens if current is not None and g <= current][-2:]  # readers may lag one
    catalog = layout.catalog_generation(root)  # catalog.duckdb's views read it
    if current is not None and (root / "catalog.duckdb").exists() and catalog in gens and catalog not in keep:
        keep.append(catalog)
    leased = leases.held(root)  # a connection kept across commits still reads its generation
    keep += [g for g in gens if g.name in leased and g not in keep and current is not None and g <= current]
    for g in gens:
        if g not in keep:
            shutil.rmtree(g, ignore_errors=True)
    live: set[Path] = set()
    highest = 0
    for g in keep:
        try:
            tables = {t: layout.read_meta(t, g) for t in ("chunks", "parts")}
        except Exception:  # noqa: BLE001 - unreadable: which parts it lists is unknown
            return highest
        highest = max(highest, int(cast("int | None", tables["chunks"]["chunk_id"].max()) or 0))
        live.update(map(Path, integrity.expected_parts(root, tables)["file"]))
        chunks = tables["chunks"].filter(~pl.col("chunk_id").is_in(tables["parts"]["chunk_id"].implode()))
        for kind in schema.PART_KINDS:  # chunks written before `parts`: their parts by name
            n = chunks.height
            live.update(map(Path, layout.part_files(root, [kind] * n, chunks["run_id"], chunks["chunk_id"])))
    dead = [
        part
        for kind in schema.PART_KINDS
        if (root / kind).is_dir()
        for part in (root / kind).glob("*/*")
        if layout.PART_NAME[kind].fullmatch(part.name) and part not in live
    ]
    _unlink_all(dead)
    return highest


def _unlink_all(paths: list[Path]) -> None:
    """Remove files many at a time: after a compaction of thousands of small parts, one unlink
    after another (each waiting on the file system's journal) would take minutes."""
    if len(paths) < 64:
        for p in paths:
            p.unlink(missing_ok=True)
        return
    with ThreadPoolExecutor(UNLINKERS, thread_name_prefix="gc") as pool:
        list(pool.map(lambda p: p.unlink(missing_ok=True), paths))
