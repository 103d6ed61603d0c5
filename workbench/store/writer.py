"""Staging changes to a store; `commit()` publishes them as one new metadata generation.

Every part is written to a temporary name and renamed, with its size and sha256 recorded in the
generation (`parts`). The writer stages rows and parts and calls the modules that do the rest:
`commit.py` publishes a generation, `garbage.py` removes what no kept generation refers to (when
a writer opens the store), `compaction.py` merges small parts. A full disk stops the writer with
a StoreError and leaves the previous generation in force.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import cast

import numpy as np
import polars as pl
import pyarrow as pa

import workbench.store.commit as commit_mod
import workbench.store.compaction as compaction
import workbench.store.garbage as garbage
import workbench.store.integrity as integrity
import workbench.store.layout as layout
import workbench.store.parts as parts_mod
import workbench.store.schema as schema
from workbench.errors import StoreError
from workbench.store.commit import Derive
from workbench.store.points import Points

CLI_LABEL_ORIGIN = "workbench label"


@contextlib.contextmanager
def disk_full_is_a_store_error(root: Path):
    """ENOSPC (and quota) from any writer below becomes one message that says what to do."""
    try:
        yield
    except Exception as e:
        if not commit_mod.is_disk_full(e):
            raise
        raise StoreError(
            f"disk full while writing the store at {root}: nothing of this run was published and the "
            "store still holds what it held before; free some space and run the command again"
        ) from None


def deep_merge(base: dict, new: dict) -> dict:
    """`new` over `base`; nested objects merge key by key (results.train beside results.all)."""
    out = dict(base)
    for k, v in new.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def chunk_row(chunk_id: int, run_id: str, path: str, source: str, start: int, end: int, rows: int) -> dict:
    return {
        "chunk_id": chunk_id,
        "run_id": run_id,
        "path": path,
        "source": source,
        "start_offset": start,
        "end_offset": end,
        "rows": rows,
    }


SHARED_ROWS = 1 << 22  # points of small chunks in one file (it ends with the chunk that passes this)


KEYED = {"files": "path", "run_config": "run_id"}  # tables with one row per key


def _inside(folder: str) -> pl.Expr:
    return pl.col("path").str.starts_with(folder.rstrip("/") + "/") | (pl.col("path") == folder)


class StoreWriter:
    """Stages changes to the store; nothing is visible until `commit()`."""

    def __init__(self, root: Path, verify: bool = True):
        """`verify`: refuse a store whose tables or parts are missing or cut short (`workbench
        check --repair` opens it without, to repair it)."""
        self.root = root
        gen = layout.current_generation(root)
        self.previous = gen
        # above every generation folder, published or not, so that a new one never lands on one
        self.generation = max([int(g.name[1:]) for g in layout.generations(root)] + [0])
        self.tables = {t: layout.read_meta(t, gen) for t in schema.META_TABLES}
        if verify and gen is not None and (damage := integrity.quick_check(root, gen, self.tables)):
            raise StoreError(integrity.damage_message(root, damage))
        self.next_chunk_id = int(cast("int | None", self.tables["chunks"]["chunk_id"].max()) or 0) + 1
        self._new: dict[str, list[pl.DataFrame]] = {t: [] for t in schema.META_TABLES}
        # staged cheaply, made frames once when the table is next read (thousands of small runs
        # would otherwise pay a polars frame per row): raw rows, and upserts by key
        self._rows: dict[str, list] = {t: [] for t in schema.META_TABLES}
        self._cols: dict[str, list[dict]] = {t: [] for t in schema.META_TABLES}  # dicts of columns
        self._upserts: dict[str, dict[str, dict]] = {t: {} for t in KEYED}
        self._index: dict[str, dict] = {}  # table -> {key: row(s)}, built on first lookup
        self.changed_runs: set[str] = set()  # runs whose files were read, dropped or rewritten
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="parquet")
        self._pending: list = []
        # small chunks' points, written together (parts_mod.SharedFile): the tables not yet
        # handed to the file, their rows, the file being written and its chunks (id, rows)
        self._shared: list[pa.Table] = []
        self._shared_rows = 0
        self._shared_file: parts_mod.SharedFile | None = None
        self._shared_chunks: list[tuple[int, int]] = []
        self._shared_file_rows = 0
        self._shared_files = 0
        self.derive_errors: dict[str, str] = {}  # derived table -> why the last one was kept
        # above every chunk a kept generation lists (a reader may still be on the previous one,
        # whose dropped chunks' parts must not be overwritten by new ones of the same name)
        self.next_chunk_id = max(self.next_chunk_id, garbage.collect(root, self.previous) + 1)

    # Everything is keyed by source path: a rewritten or moved file is dropped whole, then re-read.
    def drop_file(self, path: str) -> None:
        self._flush_parts()
        self.changed_runs.update(self.table("files").filter(pl.col("path") == path)["run_id"].to_list())
        ids = self.table("chunks").filter(pl.col("path") == path)["chunk_id"]
        self.drop_chunks(ids.to_list())
        for t in ("files", "problems", "evidence"):
            self._replace(t, pl.col("path") != path)

    def drop_parts(self, chunk_ids: list[int], kind: str) -> None:
        """Forget one kind of part of these chunks (the chunks stay)."""
        gone = pl.col("chunk_id").is_in(pl.Series(chunk_ids, dtype=pl.Int64).implode()) & (
            pl.col("kind") == kind
        )
        self._replace("parts", ~gone)

    def drop_chunks(self, chunk_ids: list[int]) -> None:
        """Forget chunks (their parts become garbage for the next writer)."""
        self._flush_parts()
        keep = ~pl.col("chunk_id").is_in(pl.Series(chunk_ids, dtype=pl.Int64).implode())
        for t in ("chunks", "chunk_tags", "parts"):
            self._replace(t, keep)

    def add_chunk(
        self,
        run_id: str,
        path: str,
        source: str,
        start: int,
        end: int,
        points: Points,
        events: Sequence[dict] = (),
    ) -> int:
        """Queue one batch of points (in logged order) and its events as Parquet parts; returns
        its chunk id.

        The part is written on a background thread while the caller decodes the next batch; at
        most one part waits, so memory stays bounded. `commit()` waits for every part.
        """
        chunk_id = self.next_chunk_id
        frame = (
            pl.DataFrame(
                [{**e, "chunk_id": chunk_id, "run_id": run_id, "path": path} for e in events],
                schema=schema.EVENT_PART,
            )
            if events
            else None
        )  # built first: an event that does not fit its columns stages nothing of the chunk
        self.next_chunk_id += 1
        self.add_rows("chunks", [chunk_row(chunk_id, run_id, path, source, start, end, len(points))])
        if frame is not None:
            self._pending.append(self._pool.submit(self._write_events, run_id, chunk_id, frame))
        if len(points):
            self._pending.append(self._pool.submit(self._write_part, run_id, chunk_id, points))
        while len(self._pending) > 2:
            self._collect(self._pending.pop(0))
        return chunk_id

    def close(self) -> None:
        """Wait for background writes (uncommitted parts are collected by the next writer)."""
        for f in self._pending:
            f.exception()
        self._pool.shutdown(wait=True)

    def _collect(self, future) -> None:
        with disk_full_is_a_store_error(self.root):
            tags, part = future.result()
        if tags is not None:
            self._cols["chunk_tags"].append(tags)
        self.add_rows("parts", part if isinstance(part, list) else [part])

    def _write_events(self, run_id: str, chunk_id: int, frame: pl.DataFrame) -> tuple[None, dict]:
        return None, parts_mod.write_events(self.root, run_id, chunk_id, frame)

    def _write_part(self, run_id: str, chunk_id: int, points: Points) -> tuple[dict, dict]:
        return parts_mod.write_scalars(self.root, run_id, chunk_id, points)

    def _write_shared(self, finish: bool) -> None:
        """Hand the small chunks gathered so far to the file being written (on the background
        thread): whole row groups while more may come; everything, and the file finished, when
        `finish` or the file is full (so a chunk's points never span two files)."""
        whole = finish or self._shared_file_rows + self._shared_rows >= SHARED_ROWS
        if (not whole and self._shared_rows < parts_mod.SHARED_ROW_GROUP) or not (
            self._shared or self._shared_file
        ):
            return
        table = pa.concat_tables(self._shared) if self._shared else pa.table({})
        take = table.num_rows if whole else table.num_rows - table.num_rows % parts_mod.SHARED_ROW_GROUP
        rest = table.slice(take)
        self._shared, self._shared_rows = ([rest] if rest.num_rows else []), rest.num_rows
        self._shared_file_rows += take
        if self._shared_file is None:
            self._shared_file = parts_mod.SharedFile(self.root, self._new_file())
        chunks = None
        if whole:
            chunks = self._shared_chunks
            self._shared_chunks, self._shared_file_rows = [], 0
        self._pending.append(self._pool.submit(_shared_rows, self._shared_file, table.slice(0, take), chunks))
        if whole:
            self._shared_file = None
        while len(self._pending) > 2:
            self._collect(self._pending.pop(0))

    def _new_file(self) -> Path:
        """A name for a file of many chunks that no kept generation lists: numbered for the
        generation this writer publishes next, and its own sequence."""
        self._shared_files += 1
        return layout.compacted_part(self.root, self.generation + 1, self._shared_files)

    def _flush_parts(self) -> None:
        self._write_shared(finish=True)
        while self._pending:
            self._collect(self._pending.pop(0))

    def add_written(
        self, chunks: list[dict], chunk_tags: list[dict], part_rows: list[dict], shared: Sequence = ()
    ) -> None:
        """Stage chunks whose parts another process already wrote (`workbench.store.parts`):
        their chunks rows, chunk_tags columns (dicts of lists) and parts rows; `shared`: the
        (run_id, chunk_id, table) of small chunks it left for the writer to write together."""
        if chunks:
            self.next_chunk_id = max(self.next_chunk_id, max(c["chunk_id"] for c in chunks) + 1)
            self.add_rows("chunks", chunks)
        self._cols["chunk_tags"].extend(chunk_tags)
        self.add_rows("parts", part_rows)
        for _, chunk_id, table in shared:
            self._shared.append(table)
            self._shared_rows += table.num_rows
            self._shared_chunks.append((chunk_id, table.num_rows))
        self._write_shared(finish=False)

    def frame(self, table: str, rows: pl.DataFrame | list[dict]) -> pl.DataFrame:
        """Rows in the table's columns; raises for a value that does not fit (before staging)."""
        sch = schema.META_TABLES[table]
        df = rows if isinstance(rows, pl.DataFrame) else pl.DataFrame(rows, schema=sch)
        return schema.conform(df, sch, table)

    def add(self, table: str, rows: pl.DataFrame | list[dict]) -> None:
        df = self.frame(table, rows)
        if df.height:
            self._settle(table)
            self._new[table].append(df)
            self._index.pop(table, None)

    def add_rows(self, table: str, rows: list[dict]) -> None:
        """Stage rows made by this program (checked when the table is next read, in bulk)."""
        if rows:
            self._rows[table].extend(rows)
            self._index.pop(table, None)

    def _settle(self, table: str) -> None:
        """Turn the rows staged cheaply into frames (upserts replace their key's row)."""
        ups = self._upserts.get(table)
        if ups:
            key = KEYED[table]
            gone = pl.col(key).is_in(pl.Series(list(ups), dtype=pl.String).implode())
            self.tables[table] = self.tables[table].filter(~gone)
            self._new[table] = [d.filter(~gone) for d in self._new[table]]
            self._new[table].append(self.frame(table, list(ups.values())))
            self._upserts[table] = {}
        if rows := self._rows[table]:
            self._rows[table] = []
            self._new[table].append(self.frame(table, rows))
        if cols := self._cols[table]:
            self._cols[table] = []
            joined = {c: np.concatenate([np.asarray(d[c]) for d in cols]) for c in cols[0]}
            frame = pl.DataFrame(joined)
            if "finite_step" in frame.columns:  # numpy has no null integer
                frame = frame.with_columns(
                    finite_step=pl.when(pl.col("finite_step") != parts_mod.NO_STEP).then(
                        pl.col("finite_step")
                    )
                )
            self._new[table].append(self.frame(table, frame))

    def _replace(self, table: str, keep: pl.Expr, rows: pl.DataFrame | Sequence[dict] = ()) -> None:
        """Keep the rows matching `keep` (stored and staged), then stage `rows`."""
        self._settle(table)
        self._index.pop(table, None)
        self.tables[table] = self.tables[table].filter(keep)
        # the staged frames as one: replacing folder after folder (checkpoints, labels) would
        # otherwise filter every earlier folder's frame again, quadratic in folders
        staged = self._new[table]
        self._new[table] = [pl.concat(staged, how="vertical").filter(keep)] if staged else []
        self.add(table, rows if isinstance(rows, pl.DataFrame) else list(rows))

    def _upsert(self, table: str, row: dict) -> None:
        key = row[KEYED[table]]
        ups = self._upserts[table]
        ups.pop(key, None)  # a replaced row goes last, as a fresh one would
        ups[key] = row
        if table in self._index:
            self._index[table][key] = row

    def _lookup(self, table: str, key: str) -> dict | None:
        if table not in self._index:
            df = self.table(table)
            self._index[table] = dict(zip(df[KEYED[table]].to_list(), df.iter_rows(named=True), strict=True))
        return self._index[table].get(key)

    def set_file(self, row: dict) -> None:
        """Insert or replace a file's manifest row."""
        self.changed_runs.add(row["run_id"])
        self._upsert("files", row)

    def clear_problems(self, under: list[str], kinds: tuple[str, ...]) -> None:
        """Forget the problems of these kinds recorded for paths under these folders (or files)."""
        inside = pl.lit(False)
        for root in under:
            inside = (
                inside | (pl.col("path") == root) | pl.col("path").str.starts_with(root.rstrip("/") + "/")
            )
        self._replace("problems", ~(pl.col("kind").is_in(list(kinds)) & inside))

    def set_problems(self, path: str, rows: list[dict], kind: str | None = None) -> None:
        """Replace the problems recorded for `path` (of one kind, if given)."""
        keep = pl.col("path") != path
        self._replace("problems", keep if kind is None else keep | (pl.col("kind") != kind), rows)

    def set_alerts(
        self, rule_ids: list[str], runs: list[str], alerts: pl.DataFrame, source: str = "replay"
    ) -> None:
        """Replace the alerts from `source` (a replay, or a live watch) of these rules on these
        runs; rows without `raised_at` get null. One alert per (run, rule, tag, step_start): an
        interval the other source raised first keeps its row's `source` and `raised_at` (where
        and when it was first raised) and takes the new values (a replay over the finished log
        knows its end)."""
        if source not in schema.ALERT_SOURCES:
            raise ValueError(f"alert source must be one of {schema.ALERT_SOURCES}, got {source!r}")
        if "raised_at" not in alerts.columns:
            alerts = alerts.with_columns(raised_at=pl.lit(None, pl.Float64))
        mine = pl.col("source") == source
        if source == "replay":
            mine = mine | pl.col("source").is_null()  # stored before alerts had a source
        scope = pl.col("rule").is_in(rule_ids) & pl.col("run_id").is_in(runs)
        key = ["run_id", "rule", "tag", "step_start"]
        table = self.table("alerts")
        first = (
            table.filter(scope & ~mine)
            .select(*key, first_source="source", first_raised="raised_at")
            .unique(subset=key, keep="first", maintain_order=True)
        )
        new = (
            alerts.with_columns(source=pl.lit(source))
            .join(first, on=key, how="left", nulls_equal=True)
            .with_columns(
                source=pl.coalesce("first_source", "source"),
                raised_at=pl.when(pl.col("first_source").is_null())
                .then(pl.col("raised_at"))
                .otherwise(pl.col("first_raised")),
            )
            .select(list(schema.ALERTS))
        )
        kept = table.filter(~(scope & mine)).join(new.select(key), on=key, how="anti", nulls_equal=True)
        self._replace("alerts", pl.lit(False), pl.concat([kept, new], how="vertical_relaxed"))

    def set_deliveries(self, rows: list[dict]) -> None:
        """Record what a watch did with these alerts (DELIVERIES rows; one per alert id, the
        latest wins)."""
        if rows:
            bad = {r["outcome"] for r in rows} - set(schema.DELIVERY_OUTCOMES)
            if bad:
                raise ValueError(f"delivery outcome must be one of {schema.DELIVERY_OUTCOMES}, got {bad}")
            ids = pl.Series([r["alert_id"] for r in rows], dtype=pl.String)
            self._replace("deliveries", ~pl.col("alert_id").is_in(ids.implode()), rows)

    def set_watched(self, roots: list[str], since: float) -> None:
        """These folders are followed by a watch from `since` on (kept: the earliest)."""
        known = set(self.table("watched")["root"].to_list())
        self.add("watched", [{"root": r, "since": since} for r in roots if r not in known])

    def set_labels(self, origin: str, rows: list[dict]) -> None:
        """Replace the labels that came from `origin` (a labels.toml, or the CLI for one run)."""
        keep = pl.col("origin") != origin
        if origin == CLI_LABEL_ORIGIN:
            keep = keep | ~pl.col("run_id").is_in([r["run_id"] for r in rows])
        self._replace("labels", keep, [{**r, "origin": origin} for r in rows])

    def checkpoints_in(self, folder: str) -> dict[str, dict]:
        """The checkpoints recorded in `folder` (or that are `folder`), by path."""
        return {r["path"]: r for r in self.table("checkpoints").filter(_inside(folder)).iter_rows(named=True)}

    def set_checkpoints(self, folder: str, rows: list[dict]) -> dict[str, dict]:
        """Replace what is known of the checkpoints in `folder` (they come and go with rotation);
        returns the rows recorded before, by path, so the caller can tell what changed."""
        before = self.checkpoints_in(folder)
        self._replace("checkpoints", ~_inside(folder), rows)
        return before

    def set_sources(self, precedence: list[str]) -> None:
        """The order in which sources keep the current row of a (run, tag, step) they share."""
        self._replace(
            "sources", pl.lit(False), [{"source": s, "precedence": i} for i, s in enumerate(precedence)]
        )

    def set_run_config(self, run_id: str, config: dict) -> None:
        merged = deep_merge(self.run_config(run_id), config)
        self._upsert("run_config", {"run_id": run_id, "config": json.dumps(merged, sort_keys=True)})

    def run_config(self, run_id: str) -> dict:
        row = self._lookup("run_config", run_id)
        return json.loads(row["config"]) if row is not None else {}

    def plugins(self, run_id: str) -> dict[str, str]:
        if "plugins" not in self._index:
            by_run: dict[str, dict[str, str]] = {}
            for r, tag, plugin in self.table("plugins").select("run_id", "tag", "plugin").iter_rows():
                by_run.setdefault(r, {})[tag] = plugin
            self._index["plugins"] = by_run
        return dict(self._index["plugins"].get(run_id, {}))

    def table(self, name: str) -> pl.DataFrame:
        """The table as it will be committed (stored rows plus staged ones)."""
        self._settle(name)
        return pl.concat([self.tables[name], *self._new[name]], how="vertical")

    def file_row(self, path: str) -> dict | None:
        return self._lookup("files", path)

    def compact(self, everything: bool = False) -> int:
        """Merge the chunks' own small scalar parts (`everything`: and the compacted files, less
        the rows of chunks dropped since) into one file (`workbench/store/compaction.py`). Only
        the `parts` rows change, and only at commit do readers see them. Returns how many parts
        were merged."""
        with disk_full_is_a_store_error(self.root):
            self._flush_parts()
            todo, files = compaction.candidates(
                self.root, self.table("parts"), self.table("chunks"), everything
            )
            if len(files) < 2:
                return 0
            merged = compaction.merge(self.root, todo, files, self._new_file())
        self.tables["parts"] = merged.apply(self.tables["parts"])
        self._new["parts"] = [merged.apply(d) for d in self._new["parts"]]
        return len(files)

    def commit(self, derive: dict[str, Derive] | None = None, catalog: bool = True) -> Path:
        """Publish everything staged as a new generation; returns its directory.

        `derive` computes tables of DERIVED_TABLES from the views of the new generation; the
        derived tables it does not name, or whose hook fails (`derive_errors` says why), are
        carried over from the previous generation: a derived table never costs the data.
        `catalog=False` leaves catalog.duckdb on an earlier generation (kept until the next
        catalog is written): for writers that commit every second (a live watch).
        """
        with disk_full_is_a_store_error(self.root):
            # before the number moves on: what they write is named for the generation to come
            self._flush_parts()
            if compaction.due(self.table("parts")):
                self.compact()
        self.generation += 1
        with disk_full_is_a_store_error(self.root):
            final = commit_mod.publish(
                self.root,
                f"g{self.generation:08d}",
                self.table,
                derive or {},
                self.previous,
                self.changed_runs,
                self.derive_errors,
            )
        for t in schema.META_TABLES:
            self.tables[t] = self.table(t)
            self._new[t] = []
        self._index = {}
        self.previous = final
        self.changed_runs = set()
        if catalog:
            commit_mod.write_catalog(self.root, final)
        return final


def _shared_rows(
    file: parts_mod.SharedFile, table: pa.Table, chunks: list[tuple[int, int]] | None
) -> tuple[None, list[dict]]:
    """(On the background thread) rows into a shared file; with `chunks` (the file's chunks),
    the file finished and their `parts` rows."""
    if table.num_rows:
        file.write(table)
    return None, file.close(chunks) if chunks is not None else []
