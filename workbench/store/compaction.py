"""Compaction: many chunks' small scalar parts merged into one file sorted by run, tag and step,
so that a query for one run reads a few row groups instead of opening thousands of files.

Only the `parts` rows change (`Merged.apply`, staged by the writer: readers see them at commit);
the old files become garbage for a later writer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import duckdb
import polars as pl

import workbench.store.layout as layout
import workbench.store.parts as parts_mod
from workbench.store.sql import duckdb_config, glob_literal

COMPACT_AT = 256  # small scalar parts of their own in a generation past which a commit merges them
# rows: a part below this is small (a watch's poll, a grown log's new lines, a file's last block);
# a larger one (a block of an event file) gains nothing from a merge but the cost of rewriting it
SMALL_PART = 1 << 16


def _small_own() -> pl.Expr:
    small = pl.col("rows").fill_null(0) < SMALL_PART
    return (pl.col("kind") == "scalars") & pl.col("file").is_null() & small


def due(parts: pl.DataFrame) -> bool:
    """Whether a commit should compact first: COMPACT_AT small scalar parts or more in files of
    their own."""
    return parts.filter(_small_own()).height >= COMPACT_AT


def candidates(
    root: Path, parts: pl.DataFrame, chunks: pl.DataFrame, everything: bool
) -> tuple[pl.DataFrame, list[str]]:
    """The scalar parts to merge (the chunks' own small ones; `everything`: every scalar part),
    with their chunks' run ids, and the files they are in."""
    mine = (pl.col("kind") == "scalars") if everything else _small_own()
    todo = parts.filter(mine).join(chunks.select("chunk_id", "run_id"), on="chunk_id")
    files = sorted(set(layout.part_files(root, todo["kind"], todo["run_id"], todo["chunk_id"], todo["file"])))
    return todo, files


@dataclass(frozen=True)
class Merged:
    """The file `todo`'s chunks were merged into, as the parts rows that now point at it."""

    chunk_ids: pl.Series
    update: dict[str, pl.Expr]  # file, size, sha256, mtime_ns

    def apply(self, parts: pl.DataFrame) -> pl.DataFrame:
        merged = pl.col("chunk_id").is_in(self.chunk_ids.implode()) & (pl.col("kind") == "scalars")
        return parts.with_columns(
            **{c: pl.when(merged).then(v).otherwise(pl.col(c)) for c, v in self.update.items()}
        )


def merge(root: Path, todo: pl.DataFrame, files: list[str], out: Path) -> Merged:
    """Write the rows of `todo`'s chunks held in `files` (less the rows of chunks dropped since)
    to `out`, sorted by run, tag and step; published by rename, with its size and sha256."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    con = duckdb.connect(":memory:", config=duckdb_config())
    try:
        live = todo.select("chunk_id").to_arrow()  # noqa: F841 - read by the SQL below
        listed = ", ".join(glob_literal(f) for f in files)
        batches = con.sql(
            f"SELECT p.* FROM read_parquet([{listed}]) p SEMI JOIN live USING (chunk_id) "
            "ORDER BY run_id, tag, step, chunk_id"
        ).to_arrow_reader(parts_mod.SHARED_ROW_GROUP)
        parts_mod.write_batches(batches, tmp, parts_mod.SHARED_ROW_GROUP)
    finally:
        con.close()
    row = parts_mod.publish("scalars", 0, 0, tmp, out)
    rel = str(out.relative_to(root))
    update = {
        "file": pl.lit(rel),
        "size": pl.lit(row["size"]),
        "sha256": pl.lit(row["sha256"]),
        "mtime_ns": pl.lit(row["mtime_ns"]),
    }
    return Merged(todo["chunk_id"], update)
