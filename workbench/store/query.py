"""Read-only questions to the store: SQL rendered by DuckDB itself, and the lookups the faces share."""

from __future__ import annotations

import os
import tempfile

import duckdb

from workbench.errors import NotFoundError, WorkbenchError
from workbench.store import aliases
from workbench.store.store import Store

RUNS_SQL = (
    "SELECT run_id, status, formats, files, segments, points, tags, first_step, last_step, "
    "problems, evidence, consistency FROM runs ORDER BY run_id"
)
TAGS_SQL = (
    "SELECT tag, metric, count(*) AS points, min(step) AS first_step, max(step) AS last_step, "
    "count(*) FILTER (WHERE NOT isfinite(value)) AS non_finite, "
    f"{aliases.looks_like_sql('tag', 'metric')} AS looks_like "
    "FROM scalars WHERE run_id = ? GROUP BY tag, metric ORDER BY tag"
)


class QueryError(WorkbenchError):
    """A query DuckDB refused, or one that would change the store."""


def run_query(store: Store, query: str, fmt: str = "csv", params: list | None = None) -> str:
    """Run one read-only statement; returns DuckDB's CSV (header + rows) or JSON array text."""
    try:
        stmts = duckdb.extract_statements(query)
    except duckdb.Error as e:
        raise QueryError(str(e)) from None
    if len(stmts) != 1:
        raise QueryError("give exactly one SQL statement")
    if stmts[0].type != duckdb.StatementType.SELECT:
        raise QueryError(
            f"only SELECT queries are allowed (got {stmts[0].type.name}); the store is read-only here"
        )
    con = store.connect(query)
    fd, tmp = tempfile.mkstemp(suffix="." + fmt)
    os.close(fd)
    try:
        options = "FORMAT json, ARRAY true" if fmt == "json" else "FORMAT csv, HEADER true"
        body = query.strip().rstrip(";")
        con.execute(f"COPY (\n{body}\n) TO '{tmp}' ({options})", params or [])
        with open(tmp, encoding="utf-8") as f:
            text = f.read()
    except duckdb.Error as e:
        raise _query_error(store, e) from None
    finally:
        os.unlink(tmp)
        con.close()
    if fmt == "json" and not text.strip():
        text = "[]\n"
    return text


def require_run(store: Store, run_id: str) -> None:
    """Raise NotFoundError (with what to type next) unless the store holds `run_id`."""
    con = store.connect()
    try:
        known = con.execute("SELECT count(*) FROM runs WHERE run_id = ?", [run_id]).fetchall()[0][0]
    except duckdb.Error as e:
        raise _query_error(store, e) from None
    finally:
        con.close()
    if not known:
        raise NotFoundError(f"no run {run_id!r} in {store.root}; list them with: workbench runs")


# errors in the query text itself; anything else may come from a damaged file
_QUERY_FAULTS = (
    duckdb.ParserException,
    duckdb.BinderException,
    duckdb.CatalogException,
    duckdb.ConversionException,
    duckdb.OutOfRangeException,
)


def _query_error(store: Store, e: duckdb.Error) -> QueryError:
    message = str(e).strip()
    if not isinstance(e, _QUERY_FAULTS):
        message += f"\n(if the query is not at fault, the store may be damaged: workbench check --store {store.root})"
    return QueryError(message)
