"""SQL text for the few places where a statement must be built as text (view definitions over
file paths and user-extensible alias tables), and the one DuckDB configuration every store
connection uses. Everything else binds parameters (`?`)."""

from __future__ import annotations

# by the schema's Python types (`workbench.store.schema`) and by polars dtypes' names
_DUCK_TYPES = {str: "VARCHAR", int: "BIGINT", float: "DOUBLE", bool: "BOOLEAN"}
_DUCK_TYPES_BY_NAME = {"String": "VARCHAR", "Int64": "BIGINT", "Float64": "DOUBLE", "Boolean": "BOOLEAN"}


def duckdb_config() -> dict:
    """Offline by construction: a query never installs or loads an extension (a read-only
    `SELECT * FROM read_csv('https://...')` would otherwise fetch code and data from the network)."""
    return {
        "autoinstall_known_extensions": False,
        "autoload_known_extensions": False,
        "allow_community_extensions": False,
    }


def literal(s: str) -> str:
    """A SQL string literal."""
    return "'" + s.replace("'", "''") + "'"


def identifier(name: str) -> str:
    """A SQL quoted identifier (a column name)."""
    return '"' + name.replace('"', '""') + '"'


def glob_literal(path: str, pattern: str = "") -> str:
    """A SQL string literal for a DuckDB glob: `path` + `pattern`, where the glob characters of
    `path` match only themselves (a store folder may be named `runs[1]`)."""
    return literal("".join(f"[{c}]" if c in "[*?" else c for c in path) + pattern)


def duck_type(t) -> str:
    return _DUCK_TYPES.get(t) or _DUCK_TYPES_BY_NAME[str(t)]


def empty_select(schema: dict) -> str:
    """A SELECT with the schema's columns and no rows."""
    cols = ", ".join(f'CAST(NULL AS {duck_type(t)}) AS "{c}"' for c, t in schema.items())
    return f"SELECT {cols} WHERE false"
