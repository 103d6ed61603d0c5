"""What a store generation promises, and whether the files on disk keep the promise.

A generation lists its chunks (`chunks`) and the Parquet parts they wrote, with the size and
sha256 of each (`parts`), and its own table files with theirs (`MANIFEST.json`). Generations
written before these records are checked as far as they allow: a chunk with points must have a
readable scalar part with as many rows, a table must be readable.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import workbench.store.layout as layout

if TYPE_CHECKING:
    import polars as pl

SHOWN = 5  # damaged files named in a message; the rest are counted


@dataclass(frozen=True)
class Damage:
    """One thing in the store that is not as its metadata says."""

    path: str  # relative to the store folder
    kind: str  # missing | size | checksum | rows | unreadable | marker | current | generation
    message: str
    chunk_id: int | None = None
    source: str | None = None  # the log file whose points or events the part held
    part: str | None = None  # scalars | events


def expected_parts(root: Path, tables: dict[str, pl.DataFrame]) -> pl.DataFrame:
    """One row per part the generation refers to: chunk_id, kind, run_id, source (log file),
    rows, size and sha256 (null when written before they were recorded), file (absolute path).
    Readers list the same rows with DuckDB (`workbench.store.views.listed_parts`)."""
    import polars as pl

    chunks = tables["chunks"].select("chunk_id", "run_id", pl.col("path").alias("source"), "rows")
    recorded = tables["parts"].join(chunks.drop("rows"), on="chunk_id", how="inner")
    legacy = (
        chunks.filter((pl.col("rows") > 0) & ~pl.col("chunk_id").is_in(tables["parts"]["chunk_id"].implode()))
        .with_columns(
            kind=pl.lit("scalars"),
            size=pl.lit(None, pl.Int64),
            sha256=pl.lit(None, pl.String),
            file=pl.lit(None, pl.String),
            mtime_ns=pl.lit(None, pl.Int64),
        )
        .select(recorded.columns)
    )
    parts = pl.concat([recorded, legacy]).sort("chunk_id", "kind")
    files = layout.part_files(root, parts["kind"], parts["run_id"], parts["chunk_id"], parts["file"])
    return parts.with_columns(file=pl.Series(files, dtype=pl.String))


def quick_check(
    root: Path,
    gen: Path,
    tables: dict[str, pl.DataFrame] | None = None,
    parts: list[dict] | None = None,
) -> list[Damage]:
    """What a stat can tell: the generation's tables and every part present, of the size
    recorded when it was written; a part whose modification time moved since is hashed against
    its recorded sha256 (its bytes may have changed). Cheap enough for every connection and
    every writer (`tables`: the generation's, when already read; `parts`: the rows of
    `expected_parts`, when already listed)."""
    out = verify_generation(root, gen, sizes_only=True)
    if out:
        return out
    rows = parts if parts is not None else expected_parts(root, tables or read_tables(gen)).to_dicts()
    stats: dict[str, os.stat_result | None] = {}  # a compacted file holds many chunks: one stat
    hashed: dict[str, bool] = {}  # file -> its bytes are as written
    for row in rows:
        file, want, mtime, sha = row["file"], row["size"], row["mtime_ns"], row["sha256"]
        if file not in stats:
            try:
                stats[file] = os.stat(file)
            except FileNotFoundError:
                stats[file] = None
        st = stats[file]
        if st is None:
            out.append(_damage(root, row, "missing", "is missing"))
            continue
        if want is not None and st.st_size != want:
            out.append(_damage(root, row, "size", f"has {st.st_size:,} bytes, {want:,} were written"))
        elif mtime is not None and st.st_mtime_ns != mtime and sha is not None:
            if file not in hashed:
                hashed[file] = layout.sha256_file(Path(file)) == sha
            if not hashed[file]:
                what = "was changed since it was written (its sha256 differs)"
                out.append(_damage(root, row, "checksum", what))
    return out


def verify_parts(root: Path, parts: pl.DataFrame) -> list[Damage]:
    """Every part present, of its recorded size and sha256 (or, for parts written before those
    were recorded, a readable Parquet file with as many rows as its chunk)."""
    import pyarrow.parquet as pq

    out = []
    sums: dict[Path, str] = {}  # a compacted file holds many chunks: hashed once
    for row in parts.iter_rows(named=True):
        path = Path(row["file"])
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            out.append(_damage(root, row, "missing", "is missing"))
            continue
        if row["size"] is not None:
            if size != row["size"]:
                out.append(_damage(root, row, "size", f"has {size:,} bytes, {row['size']:,} were written"))
            elif (sums.get(path) or sums.setdefault(path, layout.sha256_file(path))) != row["sha256"]:
                out.append(_damage(root, row, "checksum", "does not match its sha256 (its bytes changed)"))
            continue
        try:
            rows = pq.read_metadata(path).num_rows
        except Exception as e:  # noqa: BLE001 - whatever the reader says, the part is damaged
            out.append(_damage(root, row, "unreadable", f"cannot be read ({str(e).splitlines()[0]})"))
            continue
        if rows != row["rows"]:
            out.append(_damage(root, row, "rows", f"holds {rows:,} rows, its chunk {row['rows']:,}"))
    return out


def verify_generation(root: Path, gen: Path, sizes_only: bool = False) -> list[Damage]:
    """The generation's table files against its manifest (or readable, for one without)."""
    rel = gen.relative_to(root)
    try:
        manifest = layout.read_manifest(gen)
    except (OSError, ValueError) as e:
        return [Damage(f"{rel}/{layout.MANIFEST}", "generation", f"cannot be read ({e})")]
    if manifest is None:
        if sizes_only:
            return []
        import pyarrow.parquet as pq

        out = []
        for path in sorted(gen.glob("*.parquet")):
            try:
                pq.read_metadata(path)
            except Exception as e:  # noqa: BLE001
                out.append(
                    Damage(f"{rel}/{path.name}", "generation", f"cannot be read ({str(e).splitlines()[0]})")
                )
        return out
    out = []
    for name, want in sorted(manifest["tables"].items()):
        path = gen / name
        if not path.exists():
            out.append(Damage(f"{rel}/{name}", "generation", "is missing"))
        elif path.stat().st_size != want["size"]:
            out.append(
                Damage(
                    f"{rel}/{name}",
                    "generation",
                    f"has {path.stat().st_size:,} bytes, {want['size']:,} were written",
                )
            )
        elif not sizes_only and layout.sha256_file(path) != want["sha256"]:
            out.append(Damage(f"{rel}/{name}", "generation", "does not match its sha256 (its bytes changed)"))
    return out


def read_tables(gen: Path | None, names=("chunks", "parts")) -> dict[str, pl.DataFrame]:
    return {t: layout.read_meta(t, gen) for t in names}


def damage_message(root: Path, damage: list[Damage]) -> str:
    """One message for a command that refuses to answer from a damaged store."""
    shown = "; ".join(f"{d.path} {d.message}" for d in damage[:SHOWN])
    more = f" (and {len(damage) - SHOWN} more)" if len(damage) > SHOWN else ""
    return f"the store at {root} is damaged: {shown}{more}; {layout.repair_hint(root)}"


def _damage(root: Path, row: dict, kind: str, what: str) -> Damage:
    rel = os.path.relpath(row["file"], root)
    held = "points" if row["kind"] == "scalars" else "events"
    of = f"{held} of chunk {row['chunk_id']}, from {row['source']}"
    return Damage(rel, kind, f"{what} ({of})", row["chunk_id"], row["source"], row["kind"])
