"""The store: Parquet parts for points, immutable metadata generations, DuckDB views.

Layout of a store directory (default `.workbench/`):

    CURRENT                    name of the live metadata generation (replaced atomically)
    meta/gNNNNNNNN/*.parquet   one immutable generation: files, chunks, chunk_tags, events, ...
    scalars/<run-key>/cN.parquet   points of one chunk (a batch of one source file), zstd
    catalog.duckdb             views for the duckdb CLI, rebuilt (temp + rename) on each commit
    lock                       held by the one ingest that may write

A writer writes parts first and then a new generation; only a generation makes parts visible
(the views join parts to the generation's chunk list), so killing an ingest at any moment leaves
the previous generation in force and the next ingest redoes the lost work. Readers open Parquet
through an in-memory DuckDB and never take a lock, so an open app never blocks an ingest.

Preemption (what `superseded` means): within a (run, source, tag), points are ordered as they
were written: files by their first wall time (then path), chunks by offset, rows in file order.
A point is superseded when a later point has a step <= its own, as TensorBoard's loader does
when a resumed writer logs step 100 again. The view `scalars` keeps the rest, so it is unique
on (run_id, tag, step).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import time
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from workbench import aliases, schema
from workbench.points import Points, order_and_supersede

DEFAULT_STORE = ".workbench"
CLI_LABEL_ORIGIN = "workbench label"
MARKER = "WORKBENCH_STORE"  # marks a folder as a store, so ingest never reads a store's own files


class StoreError(Exception):
    """A problem a user can act on (message says what to do)."""


def store_path(explicit: str | os.PathLike | None = None) -> Path:
    return Path(explicit or os.environ.get("WORKBENCH_STORE") or DEFAULT_STORE)


def run_key(run_id: str) -> str:
    """A file-system-safe, collision-free folder name for a run."""
    slug = urllib.parse.quote(run_id, safe="")[:80]
    return f"{slug}-{hashlib.sha1(run_id.encode()).hexdigest()[:10]}"


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        _fsync_file(path)


class Store:
    """A store directory. `writer()` for ingest, `connect()` for queries."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = store_path(root).absolute()

    # ---- reading -------------------------------------------------------------------------
    def current_generation(self) -> Path | None:
        try:
            name = (self.root / "CURRENT").read_text().strip()
        except FileNotFoundError:
            return None
        return self.root / "meta" / name

    def exists(self) -> bool:
        return self.current_generation() is not None

    def read_meta(self, table: str, generation: Path | None = None) -> pl.DataFrame:
        gen = generation or self.current_generation()
        path = gen / f"{table}.parquet" if gen is not None else None
        if path is None or not path.exists():  # a store written before this table existed
            return schema.empty(schema.META_TABLES[table])
        df = pl.read_parquet(path)
        return df.with_columns(
            [pl.lit(None, t).alias(c) for c, t in schema.META_TABLES[table].items() if c not in df.columns]
        )

    def connect(self) -> duckdb.DuckDBPyConnection:
        """An in-memory DuckDB connection with the store's views (read-only by construction)."""
        gen = self.current_generation()
        if gen is None:
            raise StoreError(
                f"no store at {self.root}. Create one with: workbench ingest PATH --store {self.root}"
            )
        con = duckdb.connect(":memory:")
        for stmt in view_statements(self.root, gen):
            con.execute(stmt)
        return con

    # ---- writing -------------------------------------------------------------------------
    @contextlib.contextmanager
    def writer(self, wait_s: float = 60.0) -> Iterator[StoreWriter]:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / MARKER).touch()
        lock = open(self.root / "lock", "a+")  # noqa: SIM115 - held for the whole block
        try:
            _acquire(lock, self.root, wait_s)
            lock.seek(0)
            lock.truncate()
            lock.write(str(os.getpid()))
            lock.flush()
            w = StoreWriter(self)
            try:
                yield w
            finally:
                w.close()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            lock.close()


def _deep_merge(base: dict, new: dict) -> dict:
    """`new` over `base`; nested objects merge key by key (results.train beside results.all)."""
    out = dict(base)
    for k, v in new.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _acquire(lock, root: Path, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            holder = (root / "lock").read_text().strip() or "?"
            if time.monotonic() >= deadline:
                raise StoreError(
                    f"another ingest (pid {holder}) is writing to {root}; "
                    "try again when it has finished, or pass --wait SECONDS"
                ) from None
            if not said:
                print(f"waiting for another ingest (pid {holder}) to finish ...", file=sys.stderr)
                said = True
            time.sleep(0.2)


class StoreWriter:
    """Stages changes to the store; nothing is visible until `commit()`."""

    def __init__(self, store: Store):
        self.store = store
        self.root = store.root
        gen = store.current_generation()
        self.generation = int(gen.name[1:]) if gen else 0
        self.tables = {t: store.read_meta(t, gen) for t in schema.META_TABLES}
        self.next_chunk_id = int(self.tables["chunks"]["chunk_id"].max() or 0) + 1
        self._new: dict[str, list[pl.DataFrame]] = {t: [] for t in schema.META_TABLES}
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="parquet")
        self._pending: list = []
        self._collect_garbage()

    # Everything is keyed by source path: a rewritten or moved file is dropped whole, then re-read.
    def drop_file(self, path: str) -> None:
        self._flush_parts()
        for t in ("files", "chunks", "problems"):
            df = self.tables[t]
            old = df.filter(pl.col("path") == path)
            if t == "chunks":
                ids = old["chunk_id"]
                self.tables["chunk_tags"] = self.tables["chunk_tags"].filter(
                    ~pl.col("chunk_id").is_in(ids.implode())
                )
            self.tables[t] = df.filter(pl.col("path") != path)
            self._new[t] = [d.filter(pl.col("path") != path) for d in self._new[t]]

    def add_chunk(
        self,
        run_id: str,
        path: str,
        source: str,
        start: int,
        end: int,
        points: Points,
        events: list[dict] = (),
    ) -> int:
        """Queue one batch of points (in logged order) and its events as Parquet parts; returns
        its chunk id.

        The part is written on a background thread while the caller decodes the next batch; at
        most one part waits, so memory stays bounded. `commit()` waits for every part.
        """
        chunk_id = self.next_chunk_id
        self.next_chunk_id += 1
        self.add(
            "chunks",
            pl.DataFrame(
                {
                    "chunk_id": [chunk_id],
                    "run_id": [run_id],
                    "path": [path],
                    "source": [source],
                    "start_offset": [start],
                    "end_offset": [end],
                    "rows": [len(points)],
                },
                schema=schema.CHUNKS,
            ),
        )
        if events:
            frame = pl.DataFrame(
                [{**e, "chunk_id": chunk_id, "run_id": run_id, "path": path} for e in events],
                schema=schema.EVENT_PART,
            )
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
        result = future.result()
        if result is not None:
            self.add("chunk_tags", result)

    def _write_events(self, run_id: str, chunk_id: int, frame: pl.DataFrame) -> None:
        folder = self.root / "events" / run_key(run_id)
        folder.mkdir(parents=True, exist_ok=True)
        part = folder / f"e{chunk_id}.parquet"
        tmp = part.with_name(part.name + ".tmp")
        frame.write_parquet(tmp, compression="zstd")
        _fsync_file(tmp)
        os.replace(tmp, part)

    def _flush_parts(self) -> None:
        while self._pending:
            self._collect(self._pending.pop(0))

    def _write_part(self, run_id: str, chunk_id: int, points: Points) -> pl.DataFrame:
        """Write the part file; returns its per-tag step ranges (chunk_tags rows)."""
        n = len(points)
        # dictionary in name order, so parts sort by (tag name, step)
        by_name = np.argsort(np.array(points.tags, dtype=object))
        rank = np.empty(len(by_name), np.int32)
        rank[by_name] = np.arange(len(by_name), dtype=np.int32)
        sorted_tags = [points.tags[i] for i in by_name]
        points = Points(sorted_tags, rank[points.tag_code], points.step, points.wall_time, points.value)
        order, superseded = order_and_supersede(points)
        codes = points.tag_code[order]
        steps = points.step[order]
        table = pa.table(
            {
                "run_id": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([run_id])),
                "chunk_id": pa.array(np.full(n, chunk_id, np.int64)),
                "tag": pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(sorted_tags, pa.string())),
                "step": pa.array(steps),
                "wall_time": pa.array(points.wall_time[order]),
                "value": pa.array(points.value[order]),
                "local_superseded": pa.array(superseded[order]),
            }
        )
        folder = self.root / "scalars" / run_key(run_id)
        folder.mkdir(parents=True, exist_ok=True)
        part = folder / f"c{chunk_id}.parquet"
        tmp = part.with_name(part.name + ".tmp")
        pq.write_table(table, tmp, compression="zstd", row_group_size=1 << 20)
        _fsync_file(tmp)
        os.replace(tmp, part)
        # codes are sorted, so each tag is one contiguous run
        starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
        return pl.DataFrame(
            {
                "chunk_id": np.full(len(starts), chunk_id, np.int64),
                "tag": [sorted_tags[c] for c in codes[starts]],
                "points": np.diff(np.r_[starts, n]),
                "min_step": np.minimum.reduceat(steps, starts),
                "max_step": np.maximum.reduceat(steps, starts),
            }
        )

    def add(self, table: str, rows: pl.DataFrame | list[dict]) -> None:
        sch = schema.META_TABLES[table]
        df = rows if isinstance(rows, pl.DataFrame) else pl.DataFrame(rows, schema=sch)
        if df.height:
            self._new[table].append(schema.conform(df, sch, table))

    def set_file(self, row: dict) -> None:
        """Insert or replace a file's manifest row."""
        self.tables["files"] = self.tables["files"].filter(pl.col("path") != row["path"])
        self._new["files"] = [d.filter(pl.col("path") != row["path"]) for d in self._new["files"]]
        self.add("files", [row])

    def set_alerts(self, rule_ids: list[str], runs: list[str], alerts: pl.DataFrame) -> None:
        """Replace the alerts of these rules on these runs (a replay's selection)."""
        keep = ~(pl.col("rule").is_in(rule_ids) & pl.col("run_id").is_in(runs))
        self.tables["alerts"] = self.tables["alerts"].filter(keep)
        self._new["alerts"] = [d.filter(keep) for d in self._new["alerts"]]
        self.add("alerts", alerts)

    def set_labels(self, origin: str, rows: list[dict]) -> None:
        """Replace the labels that came from `origin` (a labels.toml, or the CLI for one run)."""
        keep = pl.col("origin") != origin
        if origin == CLI_LABEL_ORIGIN:
            keep = keep | ~pl.col("run_id").is_in([r["run_id"] for r in rows])
        self.tables["labels"] = self.tables["labels"].filter(keep)
        self._new["labels"] = [d.filter(keep) for d in self._new["labels"]]
        self.add("labels", [{**r, "origin": origin} for r in rows])

    def set_checkpoints(self, folder: str, rows: list[dict]) -> list[tuple[dict, str]]:
        """Replace what is known of the checkpoints in `folder` (they come and go with rotation);
        returns the checkpoints that changed since they were recorded, with why."""
        from ingest.checkpoints import changes

        inside = pl.col("path").str.starts_with(folder.rstrip("/") + "/") | (pl.col("path") == folder)
        before = {r["path"]: r for r in self.table("checkpoints").filter(inside).iter_rows(named=True)}
        changed = [(r, why) for r in rows if r["path"] in before and (why := changes(before[r["path"]], r))]
        self.tables["checkpoints"] = self.tables["checkpoints"].filter(~inside)
        self._new["checkpoints"] = [d.filter(~inside) for d in self._new["checkpoints"]]
        self.add("checkpoints", rows)
        return changed

    def set_run_config(self, run_id: str, config: dict) -> None:
        merged = _deep_merge(self.run_config(run_id), config)
        for key in ("run_config",):
            self.tables[key] = self.tables[key].filter(pl.col("run_id") != run_id)
            self._new[key] = [d.filter(pl.col("run_id") != run_id) for d in self._new[key]]
        self.add("run_config", [{"run_id": run_id, "config": json.dumps(merged, sort_keys=True)}])

    def run_config(self, run_id: str) -> dict:
        df = self.table("run_config").filter(pl.col("run_id") == run_id)
        return json.loads(df["config"][0]) if df.height else {}

    def plugins(self, run_id: str) -> dict[str, str]:
        df = self.table("plugins").filter(pl.col("run_id") == run_id)
        return dict(zip(df["tag"].to_list(), df["plugin"].to_list(), strict=True))

    def table(self, name: str) -> pl.DataFrame:
        """The table as it will be committed (stored rows plus staged ones)."""
        return pl.concat([self.tables[name], *self._new[name]], how="vertical")

    def file_row(self, path: str) -> dict | None:
        df = self.table("files").filter(pl.col("path") == path)
        return df.row(0, named=True) if df.height else None

    def commit(self) -> Path:
        """Publish everything staged as a new generation; returns its directory."""
        self._flush_parts()
        self.generation += 1
        name = f"g{self.generation:08d}"
        meta = self.root / "meta"
        meta.mkdir(exist_ok=True)
        tmp = meta / (name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for t, sch in schema.META_TABLES.items():
            df = schema.conform(self.table(t), sch, t)
            df.write_parquet(tmp / f"{t}.parquet", compression="zstd")
            _fsync_file(tmp / f"{t}.parquet")
        self._derive(tmp)
        final = meta / name
        os.replace(tmp, final)
        _fsync_dir(meta)
        cur_tmp = self.root / "CURRENT.tmp"
        cur_tmp.write_text(name + "\n")
        _fsync_file(cur_tmp)
        os.replace(cur_tmp, self.root / "CURRENT")
        _fsync_dir(self.root)
        for t in schema.META_TABLES:
            self.tables[t] = self.table(t)
            self._new[t] = []
        self._write_catalog(final)
        return final

    def _derive(self, gen: Path) -> None:
        """Tables computed from the whole generation before it is published: lineage."""
        from workbench import lineage

        con = duckdb.connect(":memory:")
        try:
            for stmt in view_statements(self.root, gen):
                con.execute(stmt)
            lineage.build(con).write_parquet(gen / "lineage.parquet", compression="zstd")
        finally:
            con.close()
        _fsync_file(gen / "lineage.parquet")

    def _write_catalog(self, gen: Path) -> None:
        """A DuckDB file with the same views, for people who open the store with the duckdb CLI."""
        tmp = self.root / "catalog.duckdb.tmp"
        tmp.unlink(missing_ok=True)
        con = duckdb.connect(str(tmp))
        try:
            for stmt in view_statements(self.root, gen):
                con.execute(stmt)
        finally:
            con.close()
        os.replace(tmp, self.root / "catalog.duckdb")

    def _collect_garbage(self) -> None:
        """Remove what no live generation refers to: parts of killed ingests, old generations."""
        meta = self.root / "meta"
        if not meta.exists():
            return
        gens = sorted(p for p in meta.iterdir() if re.fullmatch(r"g\d{8}", p.name))
        for p in meta.iterdir():
            if p.name.endswith(".tmp"):
                shutil.rmtree(p, ignore_errors=True)
        current = self.store.current_generation()
        keep = [g for g in gens if current is not None and g <= current][-2:]  # readers may lag one
        for g in gens:
            if g not in keep:
                shutil.rmtree(g, ignore_errors=True)
        live: set[str] = set()
        for g in keep:
            chunks = pl.read_parquet(g / "chunks.parquet", columns=["chunk_id", "run_id"])
            for c, r in zip(chunks["chunk_id"].to_list(), chunks["run_id"].to_list(), strict=True):
                live.update((f"scalars/{run_key(r)}/c{c}.parquet", f"events/{run_key(r)}/e{c}.parquet"))
        for kind in ("scalars", "events"):
            if (self.root / kind).exists():
                for part in (self.root / kind).glob("*/*"):
                    if f"{kind}/{part.parent.name}/{part.name}" not in live:
                        part.unlink(missing_ok=True)


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _meta_sql(gen: Path, table: str) -> str:
    """A generation's table; tables or columns newer than the store read as empty/null."""
    sch = schema.META_TABLES[table]
    path = gen / f"{table}.parquet"
    if not path.exists():
        return (
            "SELECT "
            + ", ".join(f'CAST(NULL AS {_duck_type(t)}) AS "{c}"' for c, t in sch.items())
            + " WHERE false"
        )
    have = set(pl.read_parquet_schema(path))
    cols = ", ".join(
        f'"{c}"' if c in have else f'CAST(NULL AS {_duck_type(t)}) AS "{c}"' for c, t in sch.items()
    )
    return f"SELECT {cols} FROM read_parquet({_sql_str(str(path))})"


def _any_file(folder: Path, pattern: str) -> bool:
    """Whether the glob matches anything (stops at the first match: a store has many parts)."""
    return folder.exists() and next(folder.glob(pattern), None) is not None


def view_statements(root: Path, gen: Path) -> list[str]:
    """CREATE VIEW statements for the documented views over one generation."""
    stmts = [f"CREATE OR REPLACE VIEW _{t} AS {_meta_sql(gen, t)}" for t in schema.META_TABLES]
    if _any_file(root / "scalars", "*/c*.parquet"):
        glob = _sql_str(str(root / "scalars" / "*" / "c*.parquet"))
        part_sql = f"SELECT * FROM read_parquet({glob})"
    else:
        cols = ", ".join(f"CAST(NULL AS {_duck_type(t)}) AS {c}" for c, t in schema.SCALAR_PART.items())
        part_sql = f"SELECT {cols} WHERE false"
    source_rank = (
        "CASE c.source "
        + " ".join(f"WHEN '{src}' THEN {i}" for i, src in enumerate(schema.SOURCE_PRECEDENCE))
        + f" ELSE {len(schema.SOURCE_PRECEDENCE)} END"
    )
    user = aliases.load_user_aliases(root, Path.cwd())
    if _any_file(root / "events", "*/e*.parquet"):
        event_glob = _sql_str(str(root / "events" / "*" / "e*.parquet"))
        event_sql = (
            f"SELECT e.* EXCLUDE (chunk_id) FROM read_parquet({event_glob}) e "
            "SEMI JOIN _chunks c ON c.chunk_id = e.chunk_id"
        )
    else:
        event_cols = ", ".join(
            f"CAST(NULL AS {_duck_type(t)}) AS {c}" for c, t in schema.EVENT_PART.items() if c != "chunk_id"
        )
        event_sql = f"SELECT {event_cols} WHERE false"
    metric_rows = f"SELECT DISTINCT tag, {aliases.metric_case_sql('tag', user)} AS metric FROM _chunk_tags"
    stmts += [
        f"CREATE OR REPLACE VIEW _parts AS {part_sql}",
        f"CREATE OR REPLACE VIEW _events AS {event_sql}",
        f"CREATE OR REPLACE VIEW _tag_metric AS {metric_rows}",
        # segments: a run's files in the order they were first written
        # segments: a run's files in the order they were written: by first wall time; files
        # without one (console logs) by their first step (a resumed log starts below the previous
        # one's end but above its start), then by path
        """CREATE OR REPLACE VIEW _file_order AS
           WITH first_steps AS (SELECT c.path, min(ct.min_step) AS first_step
                                FROM _chunks c JOIN _chunk_tags ct USING (chunk_id) GROUP BY c.path)
           SELECT f.path, f.run_id, fs.first_step,
                  dense_rank() OVER (PARTITION BY f.run_id
                                     ORDER BY f.first_wall_time NULLS LAST, fs.first_step NULLS LAST, f.path) - 1 AS segment
           FROM _files f LEFT JOIN first_steps fs USING (path) WHERE f.format IS NOT NULL""",
        """CREATE OR REPLACE VIEW _cutoffs AS
           SELECT ct.chunk_id, ct.tag,
                  min(ct.min_step) OVER (
                      PARTITION BY c.run_id, c.source, ct.tag
                      ORDER BY fo.segment, c.start_offset
                      ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING) AS cutoff
           FROM _chunk_tags ct JOIN _chunks c USING (chunk_id)
           JOIN _file_order fo ON fo.path = c.path""",
        f"""CREATE OR REPLACE VIEW _points AS
           SELECT p.run_id, p.tag, m.metric, p.step, p.wall_time, p.value,
                  c.source, fo.segment, c.path AS source_file,
                  (p.local_superseded OR coalesce(p.step >= k.cutoff, false)) AS superseded,
                  {source_rank} AS source_rank
           FROM _parts p
           JOIN _chunks c ON c.chunk_id = p.chunk_id
           JOIN _file_order fo ON fo.path = c.path
           LEFT JOIN _cutoffs k ON k.chunk_id = p.chunk_id AND k.tag = p.tag
           LEFT JOIN _tag_metric m ON m.tag = p.tag""",
        # tags that several sources of a run log: only these need the cross-source ranking
        """CREATE OR REPLACE VIEW _multi_source AS
           SELECT c.run_id, ct.tag FROM _chunk_tags ct JOIN _chunks c USING (chunk_id)
           GROUP BY ALL HAVING count(DISTINCT c.source) > 1""",
        """CREATE OR REPLACE VIEW scalars_all AS
           SELECT * EXCLUDE (source_rank) FROM _points p
           WHERE NOT EXISTS (SELECT 1 FROM _multi_source ms WHERE ms.run_id = p.run_id AND ms.tag = p.tag)
           UNION ALL
           SELECT * EXCLUDE (source_rank, current_rank) REPLACE (superseded OR current_rank > 1 AS superseded)
           FROM (SELECT p.*, CASE WHEN p.superseded THEN 0 ELSE row_number() OVER (
                     PARTITION BY p.run_id, p.tag, p.step, p.superseded ORDER BY p.source_rank) END AS current_rank
                 FROM _points p SEMI JOIN _multi_source ms ON ms.run_id = p.run_id AND ms.tag = p.tag)""",
        """CREATE OR REPLACE VIEW scalars AS
           SELECT run_id, tag, metric, step, wall_time, value FROM scalars_all
           WHERE NOT superseded""",
        """CREATE OR REPLACE VIEW files AS
           SELECT f.path, f.run_id, f.format, f.status, f.size, f.consumed, f.records,
                  f.points, f.problems, f.note, f.contents, fo.segment,
                  to_timestamp(f.mtime_ns / 1e9) AS mtime, to_timestamp(f.ingested_at) AS ingested_at
           FROM _files f LEFT JOIN _file_order fo USING (path)""",
        "CREATE OR REPLACE VIEW events AS SELECT run_id, step, wall_time, kind, message, attrs, "
        'path AS source_file, "offset" FROM _events',
        "CREATE OR REPLACE VIEW problems AS SELECT * FROM _problems",
        "CREATE OR REPLACE VIEW alerts AS SELECT * FROM _alerts",
        "CREATE OR REPLACE VIEW checkpoints AS SELECT run_id, step, path, kind, to_timestamp(wall_time) AS wall_time, "
        "size, files, metadata, sha256 FROM _checkpoints",
        f"CREATE OR REPLACE VIEW _run_status AS {run_status_sql()}",
        # manual labels win (the CLI over labels.toml); evidence gives auto labels to the rest
        """CREATE OR REPLACE VIEW _auto_labels AS
           WITH nf AS (SELECT p.run_id, min(p.step) AS onset FROM _parts p JOIN _tag_metric m USING (tag)
                       WHERE m.metric = 'loss' AND NOT isfinite(p.value) GROUP BY p.run_id),
                ev AS (SELECT run_id, kind, min(step) AS onset FROM _events
                       WHERE kind IN ('min_loss_scale', 'crash', 'oom') GROUP BY ALL)
           SELECT run_id, 'failed' AS outcome, onset, kind FROM (
               SELECT run_id, onset, 'divergence_nan' AS kind, 1 AS pref FROM nf
               UNION ALL SELECT run_id, onset, CASE kind WHEN 'min_loss_scale' THEN 'fp16_overflow' ELSE kind END, 2
               FROM ev)
           QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY pref, onset NULLS LAST) = 1""",
        """CREATE OR REPLACE VIEW labels AS
           SELECT run_id, outcome, onset, kind, 'manual' AS source, note, origin FROM _labels
           QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY origin = 'workbench label' DESC) = 1
           UNION ALL
           SELECT a.run_id, a.outcome, a.onset, a.kind, 'auto', 'from evidence in the logs', NULL
           FROM _auto_labels a WHERE a.run_id NOT IN (SELECT run_id FROM _labels)""",
        """CREATE OR REPLACE VIEW _runs_base AS
           WITH pts AS (
               SELECT c.run_id, sum(ct.points) AS points, count(DISTINCT ct.tag) AS tags,
                      min(ct.min_step) AS first_step, max(ct.max_step) AS last_step
               FROM _chunk_tags ct JOIN _chunks c USING (chunk_id) GROUP BY c.run_id),
           fl AS (
               SELECT run_id, string_agg(DISTINCT format, ',' ORDER BY format) AS formats,
                      count(*) AS files, sum(problems) AS problems,
                      min(first_wall_time) AS first_wall_time,
                      max(mtime_ns) AS last_mtime_ns, max(ingested_at) AS ingested_at
               FROM _files WHERE format IS NOT NULL GROUP BY run_id),
           seg AS (SELECT run_id, count(*) AS segments FROM _file_order GROUP BY run_id)
           SELECT fl.run_id, rs.status, rs.evidence, fl.formats, fl.files, seg.segments,
                  coalesce(pts.points, 0) AS points, coalesce(pts.tags, 0) AS tags,
                  pts.first_step, pts.last_step,
                  to_timestamp(fl.first_wall_time) AS started,
                  to_timestamp(fl.last_mtime_ns / 1e9) AS last_write,
                  fl.problems, rc.config, to_timestamp(fl.ingested_at) AS ingested_at
           FROM fl LEFT JOIN pts USING (run_id) LEFT JOIN seg USING (run_id)
           LEFT JOIN _run_config rc USING (run_id)
           LEFT JOIN _run_status rs USING (run_id)""",
        f"CREATE OR REPLACE VIEW _lineage AS {_derived_sql(gen, 'lineage', lineage_schema())}",
        "CREATE OR REPLACE VIEW lineage AS SELECT * FROM _lineage",
        # a run whose continuation (another run) ended healthy was recovered; its label stays
        """CREATE OR REPLACE VIEW runs AS
           WITH cont AS (
               SELECT l.parent_run AS run_id, string_agg(DISTINCT l.child_run, ', ') AS recovered_by
               FROM _lineage l LEFT JOIN labels lb ON lb.run_id = l.child_run
               LEFT JOIN _runs_base rb ON rb.run_id = l.child_run
               WHERE l.child_run <> l.parent_run AND (lb.outcome = 'healthy' OR rb.status = 'completed')
               GROUP BY 1)
           SELECT rb.* REPLACE (
                      CASE WHEN cont.run_id IS NOT NULL AND rb.status <> 'completed' THEN 'recovered' ELSE rb.status END AS status,
                      CASE WHEN cont.run_id IS NOT NULL AND rb.status <> 'completed'
                           THEN 'continued by ' || cont.recovered_by || ', which ended healthy; ' || rb.evidence
                           ELSE rb.evidence END AS evidence),
                  cont.recovered_by
           FROM _runs_base rb LEFT JOIN cont USING (run_id)""",
    ]

    return stmts


def lineage_schema() -> dict:
    from workbench.lineage import LINEAGE

    return LINEAGE


def _derived_sql(gen: Path, table: str, sch: dict) -> str:
    """A table derived at commit (lineage); empty while it is being derived."""
    path = gen / f"{table}.parquet"
    if not path.exists():
        return (
            "SELECT "
            + ", ".join(f'CAST(NULL AS {_duck_type(t)}) AS "{c}"' for c, t in sch.items())
            + " WHERE false"
        )
    return f"SELECT * FROM read_parquet({_sql_str(str(path))})"


def _duck_type(t) -> str:
    return {
        pl.String: "VARCHAR",
        pl.Int64: "BIGINT",
        pl.Float64: "DOUBLE",
        pl.Boolean: "BOOLEAN",
    }[t]


def run_status_sql() -> str:
    """Status inferred from evidence, most specific first, with the evidence in words.

    diverged: DeepSpeed's minimum-loss-scale exit, or the last loss is NaN/Inf.
    crashed: hparams/MLflow say FAILED/KILLED, or a crash/OOM event, or HF Trainer stopped
    before max_steps without its final summary. completed: hparams SUCCESS, MLflow FINISHED,
    HF's final summary, or global_step >= max_steps. running: written in the last 5 minutes.
    """
    cfg = "json_extract_string(rc.config, '{}')"
    return f"""
        WITH f AS (SELECT run_id, max(mtime_ns) AS last_write FROM _files WHERE format IS NOT NULL GROUP BY run_id),
        ev AS (SELECT run_id,
                      max(step) FILTER (WHERE kind = 'min_loss_scale') AS min_scale_step,
                      count(*) FILTER (WHERE kind = 'min_loss_scale') AS min_scale,
                      count(*) FILTER (WHERE kind IN ('crash', 'oom')) AS crashes,
                      arg_max(message, coalesce(step, -1)) FILTER (WHERE kind IN ('crash', 'oom')) AS crash_message
               FROM _events GROUP BY run_id),
        loss AS (SELECT run_id, arg_max(value, step) AS last_loss, max(step) AS last_loss_step
                 FROM _parts p JOIN _tag_metric m USING (tag)
                 WHERE m.metric = 'loss' AND NOT p.local_superseded GROUP BY run_id),
        facts AS (
            SELECT f.run_id, f.last_write, ev.min_scale, ev.min_scale_step, ev.crashes, ev.crash_message,
                   loss.last_loss, loss.last_loss_step,
                   {cfg.format("$.session_status")} AS hp_status,
                   {cfg.format("$.mlflow.status")} AS mlflow_status,
                   {cfg.format("$.trainer_summary")} IS NOT NULL AS hf_summary,
                   TRY_CAST({cfg.format("$.trainer_state.global_step")} AS BIGINT) AS hf_step,
                   TRY_CAST({cfg.format("$.trainer_state.max_steps")} AS BIGINT) AS hf_max
            FROM f LEFT JOIN _run_config rc USING (run_id) LEFT JOIN ev USING (run_id) LEFT JOIN loss USING (run_id))
        SELECT run_id,
          CASE
            WHEN min_scale > 0 OR NOT isfinite(last_loss) THEN 'diverged'
            WHEN hp_status = 'FAILURE' OR mlflow_status IN ('FAILED', 'KILLED') OR crashes > 0 THEN 'crashed'
            WHEN hp_status = 'SUCCESS' OR mlflow_status = 'FINISHED' OR hf_summary OR hf_step >= hf_max THEN 'completed'
            WHEN last_write > epoch_ns(now()) - 300e9 OR mlflow_status = 'RUNNING' THEN 'running'
            WHEN hf_step < hf_max THEN 'crashed'
            ELSE 'unknown' END AS status,
          CASE
            WHEN min_scale > 0 THEN 'loss scale hit its minimum (DeepSpeed exit) at step ' || coalesce(min_scale_step::VARCHAR, '?')
            WHEN NOT isfinite(last_loss) THEN 'last loss is ' || last_loss::VARCHAR || ' at step ' || last_loss_step::VARCHAR
            WHEN hp_status = 'FAILURE' OR hp_status = 'SUCCESS' THEN 'hparams session_end_info: ' || hp_status
            WHEN mlflow_status IN ('FAILED', 'KILLED', 'FINISHED', 'RUNNING') THEN 'MLflow run status ' || mlflow_status
            WHEN crashes > 0 THEN 'crash in the log: ' || coalesce(crash_message, '?')
            WHEN hf_summary THEN 'HF Trainer wrote its final summary'
            WHEN hf_step >= hf_max THEN 'HF Trainer reached max_steps ' || hf_max::VARCHAR
            WHEN last_write > epoch_ns(now()) - 300e9 THEN 'a log file was written in the last 5 minutes'
            WHEN hf_step < hf_max THEN 'HF Trainer stopped at global_step ' || hf_step::VARCHAR || ' of max_steps '
                                        || hf_max::VARCHAR || ' with no final summary'
            ELSE 'no end-of-run evidence in the logs' END AS evidence
        FROM facts
    """
