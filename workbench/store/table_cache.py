"""What a reader works out from one generation, kept in the generation's folder for the next:
tables, and a one-shot query's statements with the part files they are checked against.

A reading connection makes the small tables many views read (`views.TABLED`, and for a one-shot
query `views.TABLED_ONE_SHOT`): per tag, file, chunk or run, a few kB. Computing them was most of
a `workbench runs` (about 20 statements, 100 ms). A generation never changes, so the first reader
that computes such a table saves it as Parquet in `<generation>/cache/<table>-<key>.parquet`,
and later readers read that file instead, and nothing of what it was computed from. An ingest
keeps `views.TABLED` as it writes catalog.duckdb (`commit.write_catalog`).

The key is a digest of the table's SQL and of the SQL of every view it reads in turn. That text
names the generation's files, the parts, the aliases in force and this version's definition of
each view, so a change to any of them gives a new key; so does a change to the size or
modification time of one of the generation's table files (damage: read again, and found). A
table whose SQL reads the clock (`runs`: `running?`) is never kept. The folder is removed with
its generation. Saving is best-effort: a reader that cannot write to the store computes the
tables as before.

A one-shot query's plan (its statements, once every table they read is kept) and the generation's
part files are kept as JSON too (`kept_plan`, `kept_part_files`; the section at the end).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import duckdb

import workbench.store.views as views
from workbench.store.config import CONFIG_FILE, settings_folders
from workbench.store.sql import identifier, literal

FOLDER = "cache"
T = TypeVar("T")
TYPES_KEY = "workbench_types"  # the table's DuckDB column types, in the file's key-value metadata
_CLOCK = re.compile(
    r"\b(now|today|random|uuid|gen_random_uuid|get_current_time|get_current_timestamp)\s*\(|\bcurrent_(timestamp|date|time)\b",
    re.IGNORECASE,
)


@dataclass
class Plan:
    """The statements that make a connection's views; `saves`: the tables they compute that are
    worth keeping, each with its file; `reads`: the kept files they read."""

    statements: list[str]
    saves: dict[str, Path] = field(default_factory=dict)
    reads: list[Path] = field(default_factory=list)


def plan(
    con: duckdb.DuckDBPyConnection,
    stmts: list[str],
    query: str | None,
    tabled: frozenset[str],
    gen: Path,
    use_kept: bool = True,
) -> Plan:
    """The statements of `views.view_statements` that `query` needs (all of them for None), those
    named in `tabled` made tables, each read from its kept file where a reader saved one
    (`use_kept`) and then without what it was computed from."""
    graph = views.statement_graph(stmts)
    stamp = _stamp(gen)
    keys: dict[str, str] = {}
    clock: dict[str, bool] = {}

    def visit(name: str) -> None:
        if name in keys:
            return
        _, stmt, deps = graph[name]
        for d in deps:
            visit(d)
        digest = hashlib.sha256(f"{duckdb.__version__}\n{stamp}\n{stmt}".encode())
        for d in sorted(deps):
            digest.update(keys[d].encode())
        keys[name] = digest.hexdigest()[:24]
        clock[name] = bool(_CLOCK.search(stmt)) or any(clock[d] for d in deps)

    for name in graph:
        if name in tabled:
            visit(name)
    keepable = {n: gen / FOLDER / f"{n}-{keys[n]}.parquet" for n in graph if n in tabled and not clock[n]}
    types = _kept_types(con, [f for f in keepable.values() if f.exists()]) if use_kept else {}
    kept = {n for n, f in keepable.items() if str(f) in types}
    chosen = list(graph) if query is None else views.needed(graph, query, leaves=frozenset(kept))
    out = Plan([])
    for name in chosen:
        written, stmt, _ = graph[name]
        if name in kept:
            # Parquet has no type for some of DuckDB's (a HUGEINT sum comes back a DOUBLE: exact below
            # 2^53): each column is cast back to the type it was saved from
            cols = ", ".join(
                f"{identifier(c)}::{t} AS {identifier(c)}" for c, t in types[str(keepable[name])]
            )
            out.statements.append(
                f"CREATE OR REPLACE TABLE {written} AS SELECT {cols} FROM read_parquet({literal(str(keepable[name]))})"
            )
            out.reads.append(keepable[name])
            continue
        out.statements += views.tabled([stmt], tabled)
        if name in keepable:
            out.saves[written] = keepable[name]
    return out


def _stamp(gen: Path) -> str:
    """The name, size and modification time of each of the generation's table files: one changed
    since it was written is damaged, and a new key has it read again (and its damage found)
    rather than answered from what was kept."""
    return repr(sorted((p.name, (st := p.stat()).st_size, st.st_mtime_ns) for p in gen.glob("*.parquet")))


def _kept_types(con: duckdb.DuckDBPyConnection, files: list[Path]) -> dict[str, list[list[str]]]:
    """The column types saved in each of `files`; a file without them, or one that cannot be
    read, is left out (and removed: the next reader keeps the table again)."""
    query = "SELECT file_name, decode(value) FROM parquet_kv_metadata(?) WHERE decode(key) = ?"
    try:
        rows = con.execute(query, [[str(f) for f in files], TYPES_KEY]).fetchall() if files else []
    except duckdb.Error:  # one at a time, to know which
        rows = []
        for f in files:
            try:
                rows += con.execute(query, [str(f), TYPES_KEY]).fetchall()
            except duckdb.Error:
                forget([f])
    return {file: json.loads(types) for file, types in rows}


def save(con: duckdb.DuckDBPyConnection, saves: dict[str, Path]) -> None:
    """Write each computed table to its file (written whole, then renamed into place), and remove
    the table's files of other keys; stops at the first that cannot be written."""
    for table, path in saves.items():
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            path.parent.mkdir(exist_ok=True)
            types = json.dumps(
                con.execute(f"SELECT column_name, column_type FROM (DESCRIBE {table})").fetchall()
            )
            con.execute(
                f"COPY {table} TO {literal(str(tmp))} (FORMAT parquet, KV_METADATA {{{TYPES_KEY}: {literal(types)}}})"
            )
            os.replace(tmp, path)
        except (OSError, duckdb.Error):  # a store this reader may not write to, a full disk
            with contextlib.suppress(OSError):
                tmp.unlink()
            return
        for other in path.parent.glob(f"{table}-*.parquet"):
            if other != path:
                with contextlib.suppress(OSError):
                    other.unlink()


def forget(files: list[Path]) -> None:
    """Remove kept files that could not be read (computed afresh by the next reader)."""
    for f in files:
        with contextlib.suppress(OSError):
            f.unlink()


# ---- what a reader works out before its first statement, kept too ----------------------------
# A one-shot reader's statements follow from the generation, this version's code, the aliases in
# force and the query. Working them out (the tables' columns, the parts, the views' SQL, the kept
# tables' types) was a third of a `workbench runs` once its tables were kept, so they are kept as
# JSON as well, with the part files the reader checks before it reads from a kept plan.
PLAN_MAX_BYTES = 64 * 1024  # a plan that names many parts (a query of points at scale) is not kept
PLANS_MAX = 64  # plans kept per generation: each query text has its own
_code: list[str] = []


def generation_key(root: Path, gen: Path) -> str:
    """A digest of what the parts a generation lists and its views' SQL follow from, but the
    aliases: its table files, the store's place and this version of the store's code."""
    if not _code:  # the code cannot change under a running process
        digest = hashlib.sha256()
        for f in sorted(Path(__file__).parent.glob("*.py")):
            digest.update(f.name.encode() + b"\0" + f.read_bytes())
        _code.append(digest.hexdigest())
    text = "\0".join((duckdb.__version__, _code[0], str(root), str(gen), _stamp(gen)))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def plan_key(root: Path, generation: str, query: str) -> str | None:
    """A digest of what `query`'s statements follow from (`generation`: `generation_key`), the
    settings files that give the aliases (`config.settings_folders`) included; None while one of
    them cannot be read (no plan then: working them out says what is wrong)."""
    digest = hashlib.sha256(f"{generation}\0{query}\0".encode())
    folders = settings_folders(root)
    digest.update(f"{len(folders)}\0".encode())  # (a working folder removed: its settings are gone)
    for folder in folders:
        try:
            digest.update((folder / CONFIG_FILE).read_bytes())
        except FileNotFoundError:
            digest.update(b"-")
        except OSError:
            return None
        digest.update(b"\0")
    return digest.hexdigest()[:24]


def kept_part_files(gen: Path, key: str) -> list[dict] | None:
    """What `integrity.quick_check` reads of the parts a generation lists, one row per part
    file, as a reader kept it (`key`: `generation_key`), or None."""
    return _read_json(
        gen / FOLDER / f"parts-{key}.json",
        lambda got: [dict(zip(got["columns"], r, strict=True)) for r in got["rows"]],
    )


def save_part_files(gen: Path, key: str, parts: list[dict]) -> None:
    """Keep one row of `views.listed_parts` per part file and recorded state (a shared file
    holds many chunks): what a check of the files needs; a damaged one is then listed chunk by
    chunk from the generation."""
    path = gen / FOLDER / f"parts-{key}.json"
    if path.exists():  # kept already (a connection that reads no kept plan lists the parts anyway)
        return
    columns = ["file", "size", "mtime_ns", "sha256", "kind", "chunk_id", "source"]
    rows = {
        (r["file"], r["size"], r["mtime_ns"], r["sha256"]): [r[c] for c in columns] for r in reversed(parts)
    }
    _write_json(path, {"columns": columns, "rows": list(rows.values())})
    forget([p for p in path.parent.glob("parts-*.json") if p != path])  # of another version's code


def kept_plan(gen: Path, key: str) -> Plan | None:
    """The plan a reader kept for `key` (`plan_key`), or None; its file is one it reads, so that
    a plan whose tables cannot be read goes with them (`forget`)."""
    path = gen / FOLDER / f"plan-{key}.json"
    return _read_json(path, lambda got: Plan(list(got["statements"]), reads=[*map(Path, got["reads"]), path]))


def save_plan(gen: Path, key: str, made: Plan) -> None:
    """Keep a plan that computes nothing (every table it needs read from its kept file), while
    it is small and the generation keeps few."""
    text = json.dumps({"statements": made.statements, "reads": [str(p) for p in made.reads]})
    folder = gen / FOLDER
    if made.saves or len(text) > PLAN_MAX_BYTES or len(list(folder.glob("plan-*.json"))) >= PLANS_MAX:
        return
    _write_json(folder / f"plan-{key}.json", text)


def _read_json(path: Path, make: Callable[[Any], T]) -> T | None:
    try:
        return make(json.loads(path.read_bytes()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, LookupError, TypeError):  # damaged: worked out and kept again
        forget([path])
        return None


def _write_json(path: Path, value: dict | str) -> None:
    """Written whole, then renamed into place; best-effort, as `save`."""
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(exist_ok=True)
        tmp.write_text(value if isinstance(value, str) else json.dumps(value))
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
