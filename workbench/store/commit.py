"""Publishing a new metadata generation: the tables, the derived tables, the manifest, CURRENT.

Every generation is written to a temporary folder with a manifest of its tables and renamed
before CURRENT names it; each file is fsynced, and the parts it lists are on disk before it is.
Until CURRENT is replaced, the previous generation stays in force; a failed commit gives its
space back. A derived table (lineage, source agreement) is computed from the new generation's
views by a hook from above; when the hook fails, the previous one is carried over.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import cast

import duckdb
import polars as pl

import workbench.store.layout as layout
import workbench.store.schema as schema
import workbench.store.table_cache as table_cache
from workbench.errors import StoreError
from workbench.store.sql import duckdb_config
from workbench.store.views import (
    TABLED,
    TABLED_BEFORE_DERIVED,
    needed,
    statement_graph,
    table_view,
    tabled,
    unbound,
    view_statements,
)

# a table computed from a generation before it is published (lineage, source agreement), given
# the views of the new generation, the table's rows in the previous one and the runs whose
# files changed in this commit
Derive = Callable[[duckdb.DuckDBPyConnection, pl.DataFrame, set[str]], pl.DataFrame]


def is_disk_full(e: BaseException) -> bool:
    """ENOSPC or a quota, from the OS or as polars/pyarrow/DuckDB report it (a ComputeError
    "... No space left on device (os error 28)")."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(e)
    return "No space left on device" in text or "Disk quota exceeded" in text


def publish(
    root: Path,
    name: str,
    table: Callable[[str], pl.DataFrame],
    derive: dict[str, Derive],
    previous: Path | None,
    changed: set[str],
    derive_errors: dict[str, str],
) -> Path:
    """Write generation `name` of the store at `root` from `table(t)` for every table and make
    it current; returns its folder. `derive_errors` gets why a derived table was carried over."""
    meta = root / "meta"
    tmp = meta / (name + ".tmp")
    cur_tmp = root / "CURRENT.tmp"
    final, published = meta / name, False
    try:
        layout.sync_filesystem(root)  # the parts it lists are on disk before it is
        meta.mkdir(exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for t, sch in schema.META_TABLES.items():
            df = schema.conform(table(t), sch, t)
            df.write_parquet(tmp / f"{t}.parquet", compression="zstd")
            layout.fsync_file(tmp / f"{t}.parquet")
        _derive(root, tmp, derive, previous, changed, derive_errors)
        layout.write_manifest(tmp)
        os.replace(tmp, final)
        layout.fsync_dir(meta)
        cur_tmp.write_text(name + "\n")
        layout.fsync_file(cur_tmp)
        os.replace(cur_tmp, root / "CURRENT")
        published = True
        layout.fsync_dir(root)
        layout.write_marker(root)
    except BaseException:
        if not published:  # give the space back; CURRENT still names the last generation
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(final, ignore_errors=True)
            cur_tmp.unlink(missing_ok=True)
        raise
    return final


def _derive(
    root: Path,
    gen: Path,
    derive: dict[str, Derive],
    previous: Path | None,
    changed: set[str],
    errors: dict[str, str],
) -> None:
    """The derived tables, in order, each hook on one connection with the new generation's
    views (made as the hooks' queries name them: a hook reads a few of them, and making all
    was most of a small ingest's commit), the view of each table made again once it is
    written, so that a later hook reads it."""
    if previous is not None and _same_tables(gen, previous):
        derive = {}  # nothing they are derived from changed (an unchanged tree ingested again)
    con = duckdb.connect(":memory:", config=duckdb_config())
    views_on = None  # the generation's views on `con`, made as they are asked for
    try:
        for table in schema.DERIVED_TABLES:
            out = gen / f"{table}.parquet"
            frame = None
            if table in derive:
                try:
                    views_on = views_on or _ViewsOnDemand(con, view_statements(root, gen, con))
                    # (it answers `sql`, all a hook asks of a connection)
                    con_views = cast(duckdb.DuckDBPyConnection, views_on)
                    frame = _derived(con_views, table, derive[table], previous, changed)
                except Exception as e:  # noqa: BLE001 - a derived table never costs the ingested data
                    if is_disk_full(e):
                        raise
                    errors[table] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            if frame is not None:
                frame.write_parquet(out, compression="zstd")
            elif previous is not None and (previous / f"{table}.parquet").exists():
                shutil.copyfile(previous / f"{table}.parquet", out)
            else:
                continue
            layout.fsync_file(out)
            if views_on is not None:
                views_on.remade("_" + table, table_view(con, gen, table))
    finally:
        con.close()


class _ViewsOnDemand:
    """A connection that makes the views a query names (and those they read) before it runs
    it; those in TABLED_BEFORE_DERIVED as tables, as on any reading connection."""

    def __init__(self, con: duckdb.DuckDBPyConnection, stmts: list[str]):
        self.con, self.graph = con, statement_graph(stmts)
        self.made: set[str] = set()

    def sql(self, query: str, **kw) -> duckdb.DuckDBPyRelation:
        for name in needed(self.graph, query):
            if name not in self.made:
                self.con.execute(unbound(tabled([self.graph[name][1]], TABLED_BEFORE_DERIVED)[0]))
                self.made.add(name)
        return self.con.sql(query, **kw)

    def remade(self, name: str, stmt: str) -> None:
        """`stmt` (a derived table's view, written anew) in place of the view called `name`."""
        self.con.execute(unbound(stmt))
        self.made.add(name)


def _same_tables(gen: Path, previous: Path) -> bool:
    """Whether every table of `gen` holds the same bytes as `previous`'s (by its manifest)."""
    try:
        listed = (layout.read_manifest(previous) or {}).get("tables", {})
        return all(
            (listed.get(f"{t}.parquet") or {}).get("sha256") == layout.sha256_file(gen / f"{t}.parquet")
            for t in schema.META_TABLES
        )
    except (OSError, ValueError):
        return False


def _derived(
    con: duckdb.DuckDBPyConnection, table: str, hook: Derive, previous: Path | None, changed: set[str]
) -> pl.DataFrame:
    """The hook's table, from the views on `con`."""
    before = layout.read_derived(table, previous)
    return schema.conform(hook(con, before, changed), schema.DERIVED_TABLES[table], table)


def write_catalog(root: Path, gen: Path) -> None:
    """A DuckDB file with the same views, for people who open the store with the duckdb CLI.
    Without space for it, the old one goes (it would show a generation being collected)."""
    tmp = root / "catalog.duckdb.tmp"
    tmp.unlink(missing_ok=True)
    try:
        con = duckdb.connect(str(tmp), config=duckdb_config())
        try:
            con.execute("BEGIN")  # one commit to the file, not one per view
            made = table_cache.plan(con, view_statements(root, gen, con), None, TABLED, gen)
            for stmt in made.statements:
                con.execute(unbound(stmt))
            con.execute("COMMIT")
            table_cache.save(con, made.saves)  # kept for the generation's first reader too
        finally:
            con.close()
        os.replace(tmp, root / "catalog.duckdb")
        (root / layout.CATALOG_GENERATION).write_text(gen.name + "\n")
    except (OSError, duckdb.Error) as e:  # a full disk: IOException, or a failed commit of its WAL
        for stale in (tmp, tmp.with_name(tmp.name + ".wal"), root / "catalog.duckdb"):
            stale.unlink(missing_ok=True)
        why = "disk full; free some space" if is_disk_full(e) else str(e).splitlines()[0]
        raise StoreError(
            f"the new generation of {root} is published, but catalog.duckdb (the duckdb CLI's "
            f"view of it) could not be written ({why}); the next ingest writes it again"
        ) from None
