"""The store: Parquet parts for points, immutable metadata generations, DuckDB views.

A writer writes parts first and then a new generation; only a generation makes parts visible
(the views join parts to the generation's chunk list), so killing a writer at any moment leaves
the previous generation in force and the next ingest redoes the lost work. Readers open Parquet
through an in-memory DuckDB and never take a lock, so an open app never blocks an ingest.
Folder layout: `workbench.store.layout`; views: `workbench.store.views`.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import duckdb

import workbench.store.integrity as integrity
import workbench.store.layout as layout
import workbench.store.leases as leases
import workbench.store.locks as locks
import workbench.store.reads as reads
import workbench.store.table_cache as table_cache
import workbench.store.views as views
from workbench.errors import StoreError, WorkbenchError
from workbench.store.layout import store_path
from workbench.store.sql import duckdb_config

# the writer, check and polars load when first used: a read (`workbench sql`, `workbench runs`)
# needs DuckDB alone
if TYPE_CHECKING:
    import polars as pl

    import workbench.store.check as check_mod
    from workbench.store.writer import StoreWriter

T = TypeVar("T")


class Store:
    """A store directory. Its read methods answer the usual questions as polars frames
    (`runs()`, `tags(run)`, `scalars(run, metric=...)`, `events`, `alerts`, `labels`, `lineage`,
    `problems`, or any SELECT with `query(sql)`); `connect()` gives DuckDB over the views,
    `writer()` the one writer, `check()` verifies. Each read opens the live generation anew, so
    a long-lived Store sees every later ingest."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = store_path(root).absolute()
        if self.root.exists() and not self.root.is_dir():
            raise StoreError(
                f"{self.root} is a file, not a store folder; pass a folder to --store (or $WORKBENCH_STORE)"
            )

    # ---- reading -------------------------------------------------------------------------
    def current_generation(self) -> Path | None:
        """The live generation (None: nothing written yet); StoreError for a damaged or newer store."""
        layout.store_format(self.root)
        return layout.current_generation(self.root)

    def exists(self) -> bool:
        return self.current_generation() is not None

    def connect(self, query: str | None = None, generation: Path | None = None) -> duckdb.DuckDBPyConnection:
        """An in-memory DuckDB connection with the store's views (read-only by construction,
        offline: no extension is installed or loaded); with `query`, only the views it may read
        (a one-shot query starts faster). It holds a lease on its generation for as long as it
        lives, so writers keep the parts it reads (`leases.py`). `generation`: that one rather
        than the live one (it must still be kept). A store with a missing part or an unreadable
        table refuses (StoreError) rather than answer without them."""
        gen, lease = self._leased(generation)
        try:
            con = self._open(gen, query)
        except BaseException:
            if lease is not None:
                lease.release()
            raise
        if lease is not None:
            weakref.finalize(con, lease.release)
        return con

    def _leased(self, pinned: Path | None) -> tuple[Path, leases.Lease | None]:
        """A generation and a lease on it, taken while it is one of the two newest (a
        collection already under way keeps those; any later one sees the lease)."""
        for _ in range(20):
            gen = pinned or self.live_generation()
            lease = leases.take(self.root, gen)
            current = self.current_generation()
            newest = [g for g in layout.generations(self.root) if current is not None and g <= current][-2:]
            if lease is None or gen in newest:
                return gen, lease
            lease.release()
            if pinned is not None:
                raise StoreError(f"generation {gen.name} of {self.root} is no longer kept; read the live one")
        return gen, lease  # writers outran twenty tries: read with the lease held

    def live_generation(self) -> Path:
        """The live generation; StoreError for a store nothing was written to yet."""
        gen = self.current_generation()
        if gen is None:
            raise StoreError(
                f"no store at {self.root}. Create one with: workbench ingest PATH --store {self.root}"
            )
        return gen

    def _open(self, gen: Path, query: str | None, use_kept: bool = True) -> duckdb.DuckDBPyConnection:
        con = duckdb.connect(":memory:", config=duckdb_config())
        # DuckDB draws a progress bar on stdout for a query past 2 s, into a script's output
        con.execute("SET enable_progress_bar = false")
        if query is not None and views.reads_no_view(query):
            con.execute("SET lock_configuration = true")
            return con
        made = plan_key = None
        from_kept = False
        try:
            gen_key = table_cache.generation_key(self.root, gen)
            if query is not None and use_kept:
                plan_key = table_cache.plan_key(self.root, gen_key, query)
            made = self._kept_plan(gen, gen_key, plan_key)
            from_kept = made is not None
            if made is None:
                cols = views.table_columns(con, gen)
                parts = views.listed_parts(con, self.root, gen, cols)  # a damaged table: DuckDB's error
                if damage := integrity.quick_check(self.root, gen, parts=parts):
                    con.close()
                    raise StoreError(integrity.damage_message(self.root, damage))
                table_cache.save_part_files(gen, gen_key, parts)
                stmts = views.view_statements(self.root, gen, con, parts, cols)
                tabled = views.TABLED if query is None else views.TABLED_ONE_SHOT
                made = table_cache.plan(con, stmts, query, tabled, gen, use_kept)
            for stmt in made.statements:
                con.execute(stmt)
        except (duckdb.Error, OSError) as e:
            con.close()
            if made is not None and made.reads:  # a kept table that cannot be read: compute them all
                table_cache.forget(made.reads)
                return self._open(gen, query, use_kept=False)
            damage = integrity.verify_generation(self.root, gen)
            if damage:
                raise StoreError(integrity.damage_message(self.root, damage)) from None
            raise StoreError(
                f"the store at {self.root} is damaged: {str(e).splitlines()[0]}; {layout.repair_hint(self.root)}"
            ) from None
        assert made is not None  # (the statements ran)
        table_cache.save(con, made.saves)
        if not from_kept and plan_key is not None:
            table_cache.save_plan(gen, plan_key, made)
        con.execute("SET lock_configuration = true")
        return con

    def _kept_plan(self, gen: Path, gen_key: str, plan_key: str | None) -> table_cache.Plan | None:
        """The plan a reader kept for this query, once each part file the generation lists is
        found as it was written (a plan to make checks every part instead)."""
        plan = table_cache.kept_plan(gen, plan_key) if plan_key else None
        files = table_cache.kept_part_files(gen, gen_key) if plan is not None else None
        if files is None or integrity.quick_check(self.root, gen, parts=files):
            return None
        return plan

    def _ask(
        self, query: reads.Query, how: Callable[[duckdb.DuckDBPyRelation], T], one_select: bool = False
    ) -> T:
        """`how` applied to `query`'s answer, on a connection with only the views it reads;
        `one_select`: QueryError unless the query is one SELECT."""
        con = self.connect(query.sql)
        try:
            if one_select:
                reads.one_select(query.sql, con)
            return how(query.on(con))
        finally:
            con.close()

    def rows(self, query: reads.Query) -> list[tuple]:
        """The rows of one of the store's questions (`workbench.store.reads`), as tuples."""
        return self._ask(query, lambda rel: rel.fetchall())

    def query(self, sql: str | reads.Query, params: list[Any] | dict[str, Any] | None = None) -> pl.DataFrame:
        """Any one SELECT over the views (`?` or `$name` parameters), as a polars frame;
        QueryError for another statement or one DuckDB refuses."""
        if isinstance(sql, reads.Query):
            return self._ask(sql, lambda rel: rel.pl())
        try:
            return self._ask(reads.Query(sql, params or []), lambda rel: rel.pl(), one_select=True)
        except duckdb.Error as e:
            raise reads.query_error(self.root, e) from None

    def runs(self) -> pl.DataFrame:
        """The `runs` view: one row per run with its status (and the evidence for it), formats,
        files, segments, points, tags, step range, problems, config, consistency."""
        return self.query(reads.runs())

    def tags(self, run_id: str) -> pl.DataFrame:
        """The tags of one run: tag, metric (canonical name or null), points, first_step,
        last_step, non_finite (over its current points)."""
        return self.query(reads.tags(run_id))

    def scalars(
        self, run_id: str, metric: str | None = None, tag: str | None = None, all_points: bool = False
    ) -> pl.DataFrame:
        """One run's current points (of a canonical `metric`, a `tag`, or both): step, value,
        wall_time, tag, metric, source, by tag and step. `all_points`: the points later ones
        replaced too, with `superseded`, `segment` and `source_file`."""
        return self.query(reads.scalars(run_id, metric, tag, all_points))

    def events(self, run_id: str | None = None, kinds: Sequence[str] | None = None) -> pl.DataFrame:
        """The `events` view (of one run; of these kinds, e.g. ["overflow", "checkpoint"])."""
        return self.query(reads.events(run_id, kinds))

    def histograms(self, run_id: str | None = None, tag: str | None = None) -> pl.DataFrame:
        """The `histograms` view (of one run; of one tag): TensorBoard histogram summaries, one
        row per tag and step, buckets as `left`, `right` and `count` lists."""
        return self.query(reads.histograms(None if run_id is None else [run_id], tag))

    def alerts(self, run_id: str | None = None) -> pl.DataFrame:
        """The stored alerts (of one run): what the last replay and any watch raised."""
        return self.query(reads.alerts(None if run_id is None else [run_id]))

    def labels(self) -> pl.DataFrame:
        """Each labelled run's outcome, onset and failure kind, and where the label came from."""
        return self.query(reads.labels())

    def lineage(self, run_id: str | None = None) -> pl.DataFrame:
        """The edges of who continued whom (those into or out of one run), with the step and
        evidence of each."""
        return self.query(reads.lineage(run_id))

    def problems(self, run_id: str | None = None) -> pl.DataFrame:
        """What could not be read (of one run's files): path, offset, kind, message."""
        return self.query(reads.problems(run_id))

    def check(self) -> check_mod.CheckReport:
        """Verify the store against its metadata (read-only); see `workbench.store.check`."""
        import workbench.store.check as check_mod

        return check_mod.check(self.root)

    # ---- writing -------------------------------------------------------------------------
    def label(self, run_id: str, outcome: str, onset: int | None, kind: str | None, note: str | None) -> None:
        """Label one run by hand; it overrides labels.toml and automatic labels."""
        if onset is not None and not 0 <= onset < 2**63:
            raise WorkbenchError(f"onset {onset} is not a step (a whole number from 0 to {2**63 - 1})")
        from workbench.store.writer import CLI_LABEL_ORIGIN

        with self.writer() as w:
            w.set_labels(
                CLI_LABEL_ORIGIN,
                [{"run_id": run_id, "outcome": outcome, "onset": onset, "kind": kind, "note": note}],
            )
            w.commit()

    def compact(self, wait_s: float = 60.0) -> int:
        """`workbench compact`: every scalar part merged into one file (see StoreWriter.compact)."""
        with self.writer(wait_s=wait_s) as w:
            merged = w.compact(everything=True)
            if merged:
                w.commit()
        return merged

    @contextlib.contextmanager
    def writer(self, wait_s: float = 60.0) -> Iterator[StoreWriter]:
        """The one writer of this store (other processes wait up to `wait_s`, then fail)."""
        from workbench.store.writer import StoreWriter

        with self._locked(wait_s):
            w = StoreWriter(self.root)
            try:
                yield w
            finally:
                w.close()

    def repair(self, reread: check_mod.Reread, wait_s: float = 60.0) -> check_mod.CheckReport:
        """Repair what `check` finds, under the writer lock; see `workbench.store.check.repair`."""
        import workbench.store.check as check_mod

        with self._locked(wait_s, repairing=True):
            return check_mod.repair(self.root, reread)

    @contextlib.contextmanager
    def _locked(self, wait_s: float, repairing: bool = False) -> Iterator[None]:
        """The writer lock (repair judges the marker's format itself)."""
        if not repairing:
            layout.store_format(self.root)  # never write into a store of a newer format
        self.root.mkdir(parents=True, exist_ok=True)
        root = self.root
        with locks.hold(
            layout.writer_lock(root),
            locks.this_process(),
            wait_s,
            busy=lambda h: (
                f"another ingest ({h.describe()}) is writing to {root}; "
                "try again when it has finished, or pass --wait SECONDS"
            ),
            waiting=lambda h: f"waiting for another ingest ({h.describe()}) to finish ...",
        ):
            (root / layout.MARKER).touch()  # a store from the start: ingest never reads it
            yield

    @contextlib.contextmanager
    def watching(self, paths: Sequence[str | os.PathLike], wait_s: float = 0.0) -> Iterator[None]:
        """The watch lock: one `workbench watch` per store (two would store and send every
        alert twice). Another process's watch is waited for up to `wait_s` seconds (a standby
        that takes over when it ends), then StoreError naming it."""
        layout.store_format(self.root)
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / layout.MARKER).touch()  # the lock file is no log to read
        root = self.root
        following = " ".join(str(Path(p).absolute()) for p in paths)
        with locks.hold(
            layout.watch_lock(root),
            locks.this_process(f"{locks.process_name()} following {following}"[:300]),
            wait_s,
            busy=lambda h: (
                f"another watch ({h.describe()}) is watching the store at {root}: one watch per store "
                "(two would store and send each alert twice). Stop it first, or pass --wait SECONDS "
                "to take over when it ends"
            ),
            waiting=lambda h: f"waiting for the store's watch ({h.describe()}) to end ...",
        ):
            yield
