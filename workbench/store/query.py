"""Answers rendered by DuckDB itself (CSV or JSON, what `workbench sql` and the read commands
print), and the lookups the faces share; the questions are in `workbench.store.reads`."""

from __future__ import annotations

import os
import tempfile

import duckdb

from workbench.errors import NotFoundError
from workbench.store import reads
from workbench.store.reads import QueryError
from workbench.store.sql import literal
from workbench.store.store import Store

__all__ = ["QueryError", "onset_outside", "require_run", "run_query"]


def run_query(
    store: Store, query: str | reads.Query, fmt: str = "csv", params: list | dict | None = None
) -> str:
    """Run one read-only statement (SQL text, or one of the store's questions); returns
    DuckDB's CSV (header + rows) or JSON array text."""
    if isinstance(query, reads.Query):
        params = query.params or None
        query = query.sql
    con = store.connect(query)
    fd, tmp = tempfile.mkstemp(suffix="." + fmt)
    os.close(fd)
    try:
        reads.one_select(query, con)
        options = "FORMAT json, ARRAY true" if fmt == "json" else "FORMAT csv, HEADER true"
        body = query.strip().rstrip(";")
        con.execute(f"COPY (\n{body}\n) TO {literal(tmp)} ({options})", params or [])
        with open(tmp, encoding="utf-8") as f:
            text = f.read()
    except duckdb.Error as e:
        raise reads.query_error(store.root, e) from None
    finally:
        os.unlink(tmp)
        con.close()
    if fmt == "json" and not text.strip("[] \t\n"):  # nothing, or DuckDB's empty array ("[", a tab, "]")
        text = "[]\n"
    return text


def require_run(store: Store, run_id: str) -> None:
    """Raise NotFoundError (with what to type next) unless the store holds `run_id`."""
    try:
        known = store.rows(reads.run_count(run_id))[0][0]
    except duckdb.Error as e:
        raise reads.query_error(store.root, e) from None
    if not known:
        raise NotFoundError(f"no run {run_id!r} in {store.root}; list them with: workbench runs")


def onset_outside(store: Store, run_id: str, onset: int) -> str | None:
    """Why an onset cannot be where the run's failure starts (it lies outside the run's steps),
    or None when it lies inside."""
    rows = store.rows(reads.step_range(run_id))
    first, last = rows[0] if rows else (None, None)
    if first is None or first <= onset <= last:
        return None
    return f"onset {onset} is outside the steps of {run_id} ({first} to {last}); its lead times will not mean much"
