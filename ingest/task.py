"""One run's reading, anywhere: `read_run(RunTask)` reads every file of a run that needs it
and writes their Parquet parts, returning the rows to stage as plain data (`FileResult`).

Tasks are top level and picklable in and out, free of the writer, so any executor (this
process, a process per core, Ray) runs them; each numbers its chunks from its own block of ids,
so the rows come out as the same ingest in one process would make them.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from ingest.base import Batch, Ingestor, Problem, ReadContext
from ingest.discover import Found
from ingest.lines import is_settled
from ingest.manifest import content_sig, file_row
from ingest.registry import make_ingestors
from ingest.report import error_text, problem_row
from workbench.store import StoreError
from workbench.store import parts as store_parts
from workbench.store import schema as store_schema
from workbench.store.config import DEFAULT_MAX_TAGS_PER_RUN
from workbench.store.points import Points
from workbench.store.writer import chunk_row, deep_merge, disk_full_is_a_store_error

# chunk ids each run's task may use: tasks run anywhere and in any order, and still number their
# chunks as the same ingest in one process would (2^20 chunks of 8 MiB is more than a run writes)
CHUNKS_PER_TASK = 1 << 20
# in an ingest of many runs, chunks of fewer points are handed to the writer, which writes
# many runs' into one file: a Parquet file per small run costs more than its points (a few
# runs keep a file each: damage to one costs only its own re-read)
SHARED_BELOW = 1 << 16


@dataclass
class FileTask:
    """One file of a run to read, from `offset` (`prev`: its manifest row when appending)."""

    path: str
    run_dir: str
    format: str
    offset: int
    prev: dict | None
    appendable: bool


@dataclass
class RunTask:
    """All the files of one run that need reading, configuration first: what `read_run` needs,
    picklable and free of the writer, so any executor can run it."""

    store_root: str
    run_id: str
    files: list[FileTask]
    run_config: dict
    plugins: dict[str, str]
    first_chunk: int  # chunk ids [first_chunk, first_chunk + CHUNKS_PER_TASK) are this task's
    check_crc: bool = True
    share_small: bool = False  # leave small chunks to the writer to write with other runs'
    tags: list[str] = field(default_factory=list)  # the distinct tags the run holds already
    max_tags: int = DEFAULT_MAX_TAGS_PER_RUN  # past this many, a new tag's points are not stored


class TagBudget:
    """The distinct tags one run may hold: those it holds, and new ones until `limit`; the
    points of tags past it are dropped and counted per file (a log that names a new key in
    every record would otherwise cost memory and time by keys x records, and bury the rest)."""

    def __init__(self, tags: list[str], limit: int):
        self.seen, self.limit = set(tags), limit
        self.dropped_tags: set[str] = set()
        self.dropped_points = 0

    def admit(self, points: Points) -> Points:
        ok = np.ones(len(points.tags), bool)
        for i, t in enumerate(points.tags):
            if t in self.seen:
                continue
            if len(self.seen) < self.limit:
                self.seen.add(t)
            else:
                ok[i] = False
                self.dropped_tags.add(t)
        if ok.all():
            return points
        mask = ok[points.tag_code]
        self.dropped_points += int(len(points) - mask.sum())
        keep = np.flatnonzero(ok)
        code = np.full(len(ok), -1, np.int32)
        code[keep] = np.arange(len(keep), dtype=np.int32)
        return Points(
            [points.tags[i] for i in keep],
            code[points.tag_code[mask]],
            points.step[mask],
            points.wall_time[mask],
            points.value[mask],
        )

    def problem(self) -> Problem | None:
        """The file's problem when it named tags past the limit (then the count starts over)."""
        if not self.dropped_tags:
            return None
        n, points = len(self.dropped_tags), self.dropped_points
        self.dropped_tags, self.dropped_points = set(), 0
        return Problem(
            0,
            "too_many_tags",
            f"{n:,} more distinct tags than the run's limit of {self.limit:,} (max_tags_per_run "
            f"under [ingest] in workbench.toml); their {points:,} points were not stored",
        )


@dataclass
class FileResult:
    """What reading one file staged, as plain rows, in the order the writer applies them."""

    path: str
    run_id: str
    chunks: list[dict] = field(default_factory=list)
    chunk_tags: list[dict] = field(default_factory=list)
    parts: list[dict] = field(default_factory=list)
    shared: list = field(default_factory=list)  # (run_id, chunk_id, table): small chunks, unwritten
    problems: list[dict] = field(default_factory=list)
    evidence: list[dict] = field(default_factory=list)
    plugins: list[dict] = field(default_factory=list)
    configs: list[dict] = field(default_factory=list)  # merged into the run's config, in order
    file_row: dict | None = None
    not_read: str | None = None  # the file could not even be opened
    reported: list[Problem] = field(default_factory=list)  # report.problems of this file
    note: str | None = None
    chunk_ids: list[tuple[str, int]] = field(default_factory=list)  # (source, chunk_id)
    points: int = 0
    bytes_read: int = 0

    def __getstate__(self) -> dict:  # (pickled: from a worker process to the writer)
        return {**self.__dict__, "shared": [(r, c, store_parts.table_bytes(t)) for r, c, t in self.shared]}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, shared=[(r, c, store_parts.table_of(b)) for r, c, b in state["shared"]])


_INGESTORS: dict[bool, dict[str, Ingestor]] = {}  # per process: ingestors hold compiled state
_POOL: list[ThreadPoolExecutor] = []  # per process: writes parts while the next batch is decoded


_POOL_MADE = threading.Lock()  # runs may be read on several threads (LocalExecutor's `threads`)


def _pool() -> ThreadPoolExecutor:
    with _POOL_MADE:
        if not _POOL:
            _POOL.append(ThreadPoolExecutor(1, thread_name_prefix="parquet"))
    return _POOL[0]


def ingestors_by_name(check_crc: bool) -> dict[str, Ingestor]:
    """The registry's readers by name, made once per process."""
    if check_crc not in _INGESTORS:
        _INGESTORS[check_crc] = {i.name: i for i in make_ingestors(check_crc=check_crc)}
    return _INGESTORS[check_crc]


def read_run(task: RunTask) -> list[FileResult]:
    """Read every file of one run and write their Parquet parts; the rows to stage, per file.

    Runs in any process (top level, picklable in and out). The run's configuration and
    plugins grow file by file as they would in the writer, so a file read after the run's
    ds_config sees it."""
    by_name = ingestors_by_name(task.check_crc)
    root = Path(task.store_root)
    run_config, plugins = dict(task.run_config), dict(task.plugins)
    next_id = [task.first_chunk]
    out = []
    pool = _pool()
    budget = TagBudget(task.tags, task.max_tags)
    for ft in task.files:
        res = _read_file(
            root,
            pool,
            by_name[ft.format],
            ft,
            task.run_id,
            run_config,
            plugins,
            next_id,
            budget,
            task.share_small,
        )
        if next_id[0] > task.first_chunk + CHUNKS_PER_TASK:
            raise StoreError(f"{ft.path}: more than {CHUNKS_PER_TASK} chunks in one ingest of one run")
        for c in res.configs:
            run_config = deep_merge(run_config, c)
        plugins.update({r["tag"]: r["plugin"] for r in res.plugins})
        out.append(res)
    return out


def _read_file(
    root: Path,
    pool: ThreadPoolExecutor,
    ingestor: Ingestor,
    ft: FileTask,
    run_id: str,
    run_config: dict,
    plugins: dict[str, str],
    next_id: list[int],
    budget: TagBudget,
    share: bool = False,
) -> FileResult:
    """Read one file from its offset and write its batches' parts. Whatever goes wrong stays
    with this file: the batches read before are kept, the rest is a problem row saying why."""
    res = FileResult(ft.path, run_id)
    path = Path(ft.path)
    try:
        st = path.stat()
    except OSError as e:
        res.not_read = f"not read: {e.strerror or e}"
        return res
    settled = is_settled(path, st)  # before reading: what the reader holds back depends on it
    tally = _Tally.resume(ft.prev, ft.offset)
    ctx = ReadContext(run_id, state=tally.state, plugins=dict(plugins), run_config=dict(run_config))
    pending: list = []
    failure = _read_batches(root, pool, pending, res, ingestor, ft, ctx, tally, next_id, budget, share)
    with disk_full_is_a_store_error(root):
        for f in pending:
            _collect(res, f.result())
    if (too_many := budget.problem()) is not None:
        res.reported.append(too_many)
        res.problems.append(problem_row(ft.path, run_id, too_many))
        tally.problems += 1
    if failure is not None:
        tally.note = failure.message
        res.reported.append(failure)
        res.problems.append(problem_row(ft.path, run_id, failure))
        tally.problems += 1
    res.note = tally.note
    res.file_row = _manifest_row(
        ft, run_id, st, tally, ingestor.config_used(ctx.run_config, tally.state), settled
    )
    return res


@dataclass
class _Tally:
    """What a file's manifest row counts, carried on from its last ingest when appending."""

    consumed: int
    records: int = 0
    points: int = 0
    problems: int = 0
    first_wall: float | None = None
    last_wall: float | None = None
    note: str | None = None
    contents: Counter = field(default_factory=Counter)
    state: dict = field(default_factory=dict)

    @classmethod
    def resume(cls, prev: dict | None, offset: int) -> _Tally:
        if not prev:
            return cls(offset)
        return cls(
            offset,
            prev["records"],
            prev["points"],
            prev["problems"],
            prev["first_wall_time"],
            prev["last_wall_time"],
            contents=Counter(json.loads(prev["contents"]) if prev["contents"] else {}),
            state=json.loads(prev["state"]) if prev["state"] else {},
        )

    def add(self, batch: Batch) -> None:
        if self.first_wall is None and batch.first_wall_time is not None:
            self.first_wall = batch.first_wall_time
        self.last_wall = _latest(self.last_wall, batch)
        self.records += batch.records
        self.points += len(batch.points)
        self.problems += len(batch.problems)
        self.consumed = batch.end
        self.note = batch.note
        if batch.state is not None:
            self.state = batch.state
        self.contents.update({k: v for k, v in batch.counts.items() if v})


def _read_batches(
    root: Path,
    pool: ThreadPoolExecutor,
    pending: list,
    res: FileResult,
    ingestor: Ingestor,
    ft: FileTask,
    ctx: ReadContext,
    tally: _Tally,
    next_id: list[int],
    budget: TagBudget,
    share: bool,
) -> Problem | None:
    """Stage the file's batches as the reader yields them (their points of tags within the
    run's budget); the problem that stopped it, if any (only the store failing is raised)."""
    try:
        for batch in ingestor.read(Path(ft.path), ft.offset, ctx):
            batch.points = budget.admit(batch.points)
            _stage(root, pool, pending, res, ingestor.name, batch, next_id, share)
            res.reported.extend(batch.problems)
            tally.add(batch)
            res.points += len(batch.points)
            res.bytes_read += batch.end - batch.start
    except StoreError:
        raise
    except OSError as e:
        consumed = tally.consumed
        return Problem(
            consumed, "read_error", f"read error: {error_text(e)}; kept what was read up to byte {consumed}"
        )
    except Exception as e:  # noqa: BLE001 - a reader bug on one file never costs the other files
        consumed = tally.consumed
        return Problem(
            consumed,
            "reader_error",
            f"the {ingestor.name} reader failed ({error_text(e)}); kept what was read up to byte {consumed}",
        )
    return None


def _manifest_row(
    ft: FileTask, run_id: str, st, tally: _Tally, config_used: str | None, settled: bool
) -> dict:
    """The file's manifest row after this read (`st`: its stat before the read; `settled`:
    whether the file had stopped growing then)."""
    path = Path(ft.path)
    try:
        sig = content_sig(path, tally.consumed, whole=not ft.appendable)
    except OSError:  # gone mid-read: no signature, so a file that comes back is read anew
        sig = None
    return file_row(
        Found(path, Path(ft.run_dir), ft.format),
        run_id,
        "problems" if tally.problems else "ok",
        size=st.st_size,
        mtime_ns=st.st_mtime_ns,
        consumed=tally.consumed,
        first_wall_time=tally.first_wall,
        last_wall_time=tally.last_wall,
        records=tally.records,
        points=tally.points,
        problems=tally.problems,
        note=tally.note,
        state=json.dumps(tally.state, sort_keys=True) if tally.state else None,
        config_used=config_used,
        contents=json.dumps(dict(sorted(tally.contents.items()))) if tally.contents else None,
        content_sig=sig,
        settled=settled,
    )


def _collect(res: FileResult, written: tuple[dict | None, dict]) -> None:
    tags, part = written
    if tags is not None:
        res.chunk_tags.append(tags)
    res.parts.append(part)


def _latest(last: float | None, batch) -> float | None:
    """The newest wall time seen in the file so far (points and events)."""
    times = [t for t in (last, batch.first_wall_time) if t is not None]
    walls = batch.points.wall_time
    if len(walls) and np.isfinite(walls).any():
        times.append(float(np.nanmax(walls)))
    times += [e["wall_time"] for e in batch.events if e.get("wall_time") is not None]
    return max(times, default=None)


def _checked(table: str, rows: list[dict]) -> list[dict]:
    """Rows that fit the table's columns (raises before anything of the batch is staged)."""
    if rows:
        sch = store_schema.META_TABLES[table]
        store_schema.conform(pl.DataFrame(rows, schema=sch), sch, table)
    return rows


def _stage(
    root: Path,
    pool,
    pending: list,
    res: FileResult,
    source: str,
    batch: Batch,
    next_id: list[int],
    share: bool = False,
) -> None:
    """Stage one batch whole or not at all: its rows are checked before anything is staged,
    then its parts are written (on `pool`, at most two waiting: memory stays bounded)."""
    key, run_id = res.path, res.run_id
    problems = _checked("problems", [problem_row(key, run_id, p) for p in batch.problems])
    evidence = _checked(
        "evidence",
        [
            {
                "path": key,
                "run_id": run_id,
                "status": e.status,
                "message": e.message,
                "step": e.step,
                "failure": e.failure,
                "wall_time": e.wall_time,
            }
            for e in batch.evidence
        ],
    )
    plugins = _checked(
        "plugins", [{"run_id": run_id, "tag": t, "plugin": p} for t, p in batch.plugins.items()]
    )
    chunk_id = next_id[0]
    events = (
        pl.DataFrame(
            [{**e, "chunk_id": chunk_id, "run_id": run_id, "path": key} for e in batch.events],
            schema=store_schema.EVENT_PART,
        )
        if batch.events
        else None
    )  # built first: an event that does not fit its columns stages nothing of the chunk
    # through JSON once: what the store will write (string keys, no objects it cannot write)
    config = json.loads(json.dumps(batch.config, default=str)) if batch.config else None
    next_id[0] += 1
    res.chunks.append(chunk_row(chunk_id, run_id, key, source, batch.start, batch.end, len(batch.points)))
    res.chunk_ids.append((source, chunk_id))
    if events is not None:
        pending.append(pool.submit(lambda: (None, store_parts.write_events(root, run_id, chunk_id, events))))
    if share and 0 < len(batch.points) < SHARED_BELOW:  # written with other runs' by the writer
        table, tags = store_parts.scalar_table(run_id, chunk_id, batch.points)
        res.chunk_tags.append(tags)
        res.shared.append((run_id, chunk_id, table))
    elif len(batch.points):
        pending.append(pool.submit(store_parts.write_scalars, root, run_id, chunk_id, batch.points))
    while len(pending) > 2:
        with disk_full_is_a_store_error(root):
            _collect(res, pending.pop(0).result())
    res.problems += problems
    res.evidence += evidence
    res.plugins += plugins
    if config:
        res.configs.append(config)
