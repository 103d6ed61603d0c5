"""SQL text for the few places where a statement must be built as text (view definitions over
file paths and user-extensible alias tables). Everything else binds parameters (`?`)."""

from __future__ import annotations

import polars as pl

_DUCK_TYPES = {pl.String: "VARCHAR", pl.Int64: "BIGINT", pl.Float64: "DOUBLE", pl.Boolean: "BOOLEAN"}


def literal(s: str) -> str:
    """A SQL string literal."""
    return "'" + s.replace("'", "''") + "'"


def duck_type(t) -> str:
    return _DUCK_TYPES[t]


def empty_select(schema: dict) -> str:
    """A SELECT with the schema's columns and no rows."""
    cols = ", ".join(f'CAST(NULL AS {duck_type(t)}) AS "{c}"' for c, t in schema.items())
    return f"SELECT {cols} WHERE false"
