"""Read-only SQL over the store, rendered by DuckDB itself (CSV or a JSON array)."""

from __future__ import annotations

import os
import tempfile

import duckdb

from workbench.store import Store


class QueryError(Exception):
    pass


def run_query(store: Store, query: str, fmt: str = "csv") -> str:
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
    con = store.connect()
    fd, tmp = tempfile.mkstemp(suffix="." + fmt)
    os.close(fd)
    try:
        options = "FORMAT json, ARRAY true" if fmt == "json" else "FORMAT csv, HEADER true"
        body = query.strip().rstrip(";")
        con.execute(f"COPY (\n{body}\n) TO '{tmp}' ({options})")
        with open(tmp, encoding="utf-8") as f:
            text = f.read()
    except duckdb.Error as e:
        raise QueryError(str(e).strip()) from None
    finally:
        os.unlink(tmp)
        con.close()
    if fmt == "json" and not text.strip():
        text = "[]\n"
    return text
