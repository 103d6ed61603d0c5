"""The store: Parquet parts for points, immutable metadata generations, DuckDB views.

A writer writes parts first and then a new generation; only a generation makes parts visible
(the views join parts to the generation's chunk list), so killing a writer at any moment leaves
the previous generation in force and the next ingest redoes the lost work. Readers open Parquet
through an in-memory DuckDB and never take a lock, so an open app never blocks an ingest.
Folder layout: `workbench.store.layout`; views: `workbench.store.views`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb

import workbench.store.layout as layout
from workbench.errors import WorkbenchError
from workbench.store.layout import MARKER, store_path
from workbench.store.views import view_statements
from workbench.store.writer import CLI_LABEL_ORIGIN, StoreWriter


class StoreError(WorkbenchError):
    """A store that cannot be opened or written as asked (the message says what to do)."""


class Store:
    """A store directory. `writer()` for ingest, `connect()` for queries."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = store_path(root).absolute()

    # ---- reading -------------------------------------------------------------------------
    def current_generation(self) -> Path | None:
        return layout.current_generation(self.root)

    def exists(self) -> bool:
        return self.current_generation() is not None

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
    def label(self, run_id: str, outcome: str, onset: int | None, kind: str | None, note: str | None) -> None:
        """Label one run by hand; it overrides labels.toml and automatic labels."""
        with self.writer() as w:
            w.set_labels(
                CLI_LABEL_ORIGIN,
                [{"run_id": run_id, "outcome": outcome, "onset": onset, "kind": kind, "note": note}],
            )
            w.commit()

    @contextlib.contextmanager
    def writer(self, wait_s: float = 60.0) -> Iterator[StoreWriter]:
        """The one writer of this store (other processes wait up to `wait_s`, then fail)."""
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / MARKER).touch()
        lock = open(self.root / "lock", "a+")  # noqa: SIM115 - held for the whole block
        try:
            _acquire(lock, self.root, wait_s)
            lock.seek(0)
            lock.truncate()
            lock.write(str(os.getpid()))
            lock.flush()
            w = StoreWriter(self.root)
            try:
                yield w
            finally:
                w.close()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            lock.close()


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
