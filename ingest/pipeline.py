"""`workbench ingest`: discover, fingerprint, read what is new, write, commit.

Incremental by a per-file manifest (size, mtime, consumed bytes, a hash of the bytes consumed,
sampled for big files): an unchanged file is not opened; a grown file is read from where the
last ingest stopped; a rewritten file (shorter, or different bytes before the resume point) is
dropped and re-read alone. Files that disappeared keep their stored points.

One bad file never costs the rest: whatever goes wrong with one file (its format cannot be
told, its reader fails, it vanishes mid-read, it is a FIFO) becomes a `problems` row naming it,
and everything else is committed. Only the store failing (disk full) stops the ingest, and then
the previous generation stays in force.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from ingest import agreement, checkpoints, lineage
from ingest.base import Batch, Ingestor, Problem, ReadContext
from ingest.discover import Found, discover, run_id_for
from ingest.ds_config import batch_size_of
from ingest.labels import read_labels_toml
from ingest.lines import is_gz
from ingest.registry import make_ingestors, precedence
from workbench.errors import NotFoundError
from workbench.executor import Executor, LocalExecutor
from workbench.store import Store, StoreError, StoreWriter
from workbench.store import parts as store_parts
from workbench.store import schema as store_schema
from workbench.store.writer import chunk_row, deep_merge, disk_full_is_a_store_error

SIG_BYTES = 4096
NOT_READ = ("not_read", "labels_error", "checkpoint_error")  # problems of things not read at all
FULL_HASH_BYTES = 8 << 20  # the content signature hashes smaller prefixes whole ...
SAMPLES = 65  # ... and samples this many SIG_BYTES windows of bigger ones (first, middle, last too)
# chunk ids each run's task may use: tasks run anywhere and in any order, and still number their
# chunks as the same ingest in one process would (2^20 chunks of 8 MiB is more than a run writes)
CHUNKS_PER_TASK = 1 << 20
# in an ingest of many runs, chunks of fewer points are handed to the writer, which writes
# many runs' into one file: a Parquet file per small run costs more than its points (a few
# runs keep a file each: damage to one costs only its own re-read)
SHARED_BELOW = 1 << 16
SHARED_MIN_RUNS = 64
# below this much work, spawning processes costs more than it saves
PARALLEL_MIN_TASKS = 64
PARALLEL_MIN_BYTES = 8 << 20


@dataclass
class IngestReport:
    runs: set[str] = field(default_factory=set)
    files_read: int = 0
    files_unchanged: int = 0
    files_skipped: int = 0
    points: int = 0
    bytes_read: int = 0
    problems: list[tuple[str, Problem]] = field(default_factory=list)
    notes: list[tuple[str, str]] = field(default_factory=list)
    labels: int = 0
    seconds: float = 0.0
    # (run_id, path, source, chunk_id) of every chunk written: what a live watch reads next
    chunks: list[tuple[str, str, str, int]] = field(default_factory=list)
    # runs that had a file dropped and read again (rewritten, truncated, rotated)
    reread: set[str] = field(default_factory=set)
    derive_errors: dict[str, str] = field(default_factory=dict)  # derived table -> why it was kept

    @property
    def log_files(self) -> int:
        return self.files_read + self.files_unchanged


def content_sig(path: Path, end: int, whole: bool) -> str:
    """A hash of the file's first `end` bytes: all of them for a file that is re-read whole
    anyway (`whole`) or up to FULL_HASH_BYTES, else SAMPLES windows spread evenly over them,
    so that a rewrite of the same size is not taken for the same file."""
    h = hashlib.sha1(str(end).encode())
    with open(path, "rb") as f:
        if whole or end <= FULL_HASH_BYTES:
            h.update(f.read(end))
        else:
            for i in range(SAMPLES):
                f.seek(i * (end - SIG_BYTES) // (SAMPLES - 1))
                h.update(f.read(SIG_BYTES))
    return h.hexdigest()


def _plan(found: Found, run_id: str, prev: dict | None, appendable: bool) -> tuple[str, int]:
    """('new' | 'unchanged' | 'touched' | 'append' | 'reread', offset to read from).

    A file whose size and mtime are as recorded is unchanged. Otherwise the bytes read before
    must be the same (`content_sig`) before the resume point is trusted: then a file of the same
    size was only touched, a longer one grew; anything else is read again from the start."""
    st = found.path.stat()
    if not stat.S_ISREG(st.st_mode):
        raise OSError(f"{found.path} is no longer a regular file")
    if prev is None or prev["format"] is None:
        return "new", 0
    if prev["run_id"] != run_id or prev["format"] != found.format:
        return "reread", 0
    if st.st_size == prev["size"] and st.st_mtime_ns == prev["mtime_ns"]:
        return "unchanged", prev["consumed"]
    consumed = prev["consumed"]
    if st.st_size < consumed or prev["content_sig"] != content_sig(found.path, consumed, not appendable):
        return "reread", 0
    if st.st_size == consumed:
        return "touched", consumed
    return ("append", consumed) if appendable else ("reread", 0)


def _base_for(root: Path, roots: list[str]) -> Path:
    """Keep run ids stable: ingesting a sub-folder of an earlier root names runs as before."""
    root = root.absolute()
    if root.is_file():
        root = root.parent
    for r in sorted(roots, key=len):
        rp = Path(r)
        if root == rp or rp in root.parents:
            return rp
    return root


def ingest(
    paths: list[Path],
    store: Store,
    *,
    check_crc: bool = True,
    hash_checkpoints: bool = False,
    wait_s: float = 60.0,
    console: Console | None = None,
    light: bool = False,
    stage: Callable[[StoreWriter], bool] | None = None,
    executor: Executor | None = None,
) -> IngestReport:
    """Ingest every log under `paths` into `store`; per-file problems are reported, not raised.
    `light`: a poll of a live watch, which commits every second: lineage and catalog.duckdb
    are left as they were (the watch refreshes them now and then), and a poll that found no new
    bytes and staged nothing commits nothing. `stage` adds the caller's own changes to the
    same commit (a watch's alerts) and says whether it added any. `executor` reads the runs
    (`read_run` per run); by default in this process for a few runs, a process per core for
    many. Every executor stages the same rows in the same order."""
    console = console or Console(stderr=True)
    report = IngestReport()
    t0 = time.perf_counter()
    ingestors = make_ingestors(check_crc=check_crc)
    by_name = {i.name: i for i in ingestors}
    for p in paths:
        if not p.exists():
            raise NotFoundError(f"{p}: no such file or folder")
    with store.writer(wait_s=wait_s) as w:
        w.set_sources(precedence(ingestors))
        w.clear_problems([str(p.absolute()) for p in paths], NOT_READ)  # found again below if they still are
        roots = w.table("roots")["root"].to_list()
        work = []
        for root in paths:
            base = _base_for(root, roots)
            if str(base) not in roots:
                roots.append(str(base))
                w.add("roots", [{"root": str(base)}])
            labels_file = (root if root.is_dir() else root.parent) / "labels.toml"
            if labels_file.is_file():
                with _isolated(w, report, labels_file, None, "labels_error"):
                    _read_labels(w, labels_file, root, base, report)
            found = discover(root, ingestors)
            for folder, why in found.problems:
                _set_problem(w, report, folder, None, "not_read", why)
            for f in found.files:
                run_id = run_id_for(f.run_dir, root, base)
                work.append((f, run_id))
            for folder, run_dir in found.checkpoints:
                run_id = run_id_for(run_dir, root, base)
                with _isolated(w, report, folder, run_id, "checkpoint_error"):
                    _scan_checkpoints(w, folder, run_id, hash_checkpoints, report)
        plans = []
        for f, run_id in work:
            key = str(f.path)
            prev = w.file_row(key)
            if f.format is None:
                report.files_skipped += 1
                note = f.problem or f.note
                if prev is None or prev["note"] != note:
                    w.set_file(_file_row(f, run_id, "skipped" if f.problem is None else "error", note=note))
                if f.problem:
                    _set_problem(w, report, f.path, run_id, "not_read", f.problem)
                continue
            appendable = by_name[f.format].appendable and not is_gz(f.path)
            try:
                action, offset = _plan(f, run_id, prev, appendable)
            except OSError as e:  # vanished or replaced since discovery
                _set_problem(w, report, f.path, run_id, "not_read", f"not read: {e.strerror or e}")
                continue
            if action in ("unchanged", "touched"):
                report.files_unchanged += 1
                report.runs.add(run_id)
                if action == "touched":  # same bytes, new mtime: remember it, read nothing
                    st = f.path.stat()
                    w.set_file({**prev, "size": st.st_size, "mtime_ns": st.st_mtime_ns})
                continue
            if action == "reread" and prev is not None:
                w.drop_file(key)
                report.reread.add(run_id)
                if appendable and (prev["run_id"], prev["format"]) == (run_id, f.format):
                    _note_rewrite(w, f, run_id, prev, report)
            plans.append((f, run_id, offset, prev if action == "append" else None, appendable))
        # configuration first (ds_config, hparams): other files of the run may need it
        plans.sort(key=lambda p: (p[1], not by_name[p[0].format].is_config, str(p[0].path)))
        total = sum(max(0, _size(f.path) - off) for f, _, off, _, _ in plans)
        files = [
            (FileTask(str(f.path), str(f.run_dir), f.format, off, prev, appendable), run_id)
            for f, run_id, off, prev, appendable in plans
        ]
        tasks = _run_tasks(w, files, check_crc)
        executor = executor or default_executor(tasks, total, light)
        found_by_path = {str(f.path): f for f, _ in work}
        with _progress(console, total) as progress:
            bar = progress.add_task("ingest", total=total)
            _read_runs(w, tasks, executor, report, progress, bar)
            _reread_stale(w, by_name, found_by_path, {p[1] for p in plans}, report, check_crc)
        staged = stage(w) if stage is not None else False
        if not light:
            derive = {"lineage": lineage.build, "agreement": agreement.build}
            w.commit(derive=derive)
            if _learn_batch_sizes(store, w):
                _reread_stale(w, by_name, found_by_path, w.changed_runs, report, check_crc)
                w.commit(derive=derive)
        elif plans or staged:  # an idle watched run makes no new generation every second
            w.commit(catalog=False)
        report.derive_errors = dict(w.derive_errors)
    report.seconds = time.perf_counter() - t0
    return report


def _learn_batch_sizes(store: Store, w: StoreWriter) -> bool:
    """DeepSpeed monitor series still on a samples axis (no batch size anywhere in their run)
    whose values agree with another source's once the axis is divided by a whole ratio: take
    that ratio as the run's train_batch_size. Whether any run learned one."""
    con = store.connect()
    try:
        scaled = con.sql(
            "SELECT run_id, abs(step_scale) AS k, source_a, source_b, step_scale FROM agreement "
            "WHERE verdict = 'scaled' AND ((step_scale < 0 AND starts_with(tag_a, 'Train/Samples/')) "
            "OR (step_scale > 0 AND starts_with(tag_b, 'Train/Samples/')))"
        ).fetchall()
    finally:
        con.close()
    learned = False
    for run_id, k, a, b, scale in scaled:
        config = w.run_config(run_id)
        if batch_size_of(config)[0] is None:
            other = b if scale < 0 else a
            w.set_run_config(
                run_id, {"learned": {"train_batch_size": int(k), "from": f"agreement with {other}"}}
            )
            w.changed_runs.add(run_id)
            learned = True
    return learned


def _reread_stale(
    w: StoreWriter,
    by_name: dict[str, Ingestor],
    found: dict[str, Found],
    runs: set[str],
    report: IngestReport,
    check_crc: bool = True,
) -> None:
    """Read again the files whose reading took something from their run's configuration that a
    later file of the run changed (a batch size stated by a console read after the monitor CSV)."""
    rows = w.table("files").filter(pl.col("run_id").is_in(sorted(runs)) & pl.col("format").is_not_null())
    stale = []
    for row in rows.iter_rows(named=True):
        ingestor, f = by_name.get(row["format"]), found.get(row["path"])
        if ingestor is None or f is None:
            continue
        state = json.loads(row["state"]) if row["state"] else {}
        if ingestor.config_used(w.run_config(row["run_id"]), state) != row["config_used"]:
            stale.append((row, f, ingestor))
    for row, _, _ in stale:
        report.notes = [(p, n) for p, n in report.notes if p != row["path"]]
        report.problems = [(p, x) for p, x in report.problems if p != row["path"]]
        w.drop_file(row["path"])
    files = [
        (
            FileTask(
                row["path"], str(f.run_dir), f.format, 0, None, ingestor.appendable and not is_gz(f.path)
            ),
            row["run_id"],
        )
        for row, f, ingestor in stale
    ]
    read = report.files_read
    _read_runs(w, _run_tasks(w, files, check_crc), LocalExecutor(1), report)
    report.files_read = read  # counted once, when they were first read


def _note_rewrite(w: StoreWriter, f: Found, run_id: str, prev: dict, report: IngestReport) -> None:
    """A log that should only grow was truncated, rotated or rewritten: it is read again from
    the start, and the problems table says so."""
    size = f.path.stat().st_size
    why = "is shorter than" if size < prev["consumed"] else "changed before"
    problem = Problem(
        0,
        "rewritten",
        f"file {why} the {prev['consumed']} bytes read before (now {size} bytes): "
        "truncated, rotated or rewritten; its points were dropped and it is read again from the start",
    )
    report.problems.append((str(f.path), problem))
    w.add(
        "problems",
        [
            {
                "path": str(f.path),
                "run_id": run_id,
                "offset": 0,
                "kind": problem.kind,
                "message": problem.message,
            }
        ],
    )


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


@contextlib.contextmanager
def _isolated(w: StoreWriter, report: IngestReport, path: Path, run_id: str | None, kind: str):
    """Whatever goes wrong inside becomes a problem row for `path`; only the store failing
    (StoreError: disk full, ...) stops the ingest."""
    try:
        yield
    except StoreError:
        raise
    except Exception as e:  # noqa: BLE001 - one bad file never costs the rest
        _set_problem(w, report, path, run_id, kind, f"not read: {_why(e)}")


def _why(e: Exception) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return f"{type(e).__name__}: {e}"


def _set_problem(w: StoreWriter, report: IngestReport, path: Path, run_id, kind: str, message: str) -> None:
    """The one problem row of something that was not read (replacing the last ingest's)."""
    problem = Problem(0, kind, message)
    report.problems.append((str(path), problem))
    w.set_problems(str(path), [_problem_row(str(path), run_id, problem)], kind)


def _problem_row(path: str, run_id: str | None, p: Problem) -> dict:
    return {"path": path, "run_id": run_id, "offset": p.offset, "kind": p.kind, "message": p.message}


def _scan_checkpoints(w: StoreWriter, folder: Path, run_id: str, hash_files: bool, report) -> None:
    rows = [{**row, "run_id": run_id} for row in checkpoints.scan(folder, hash_files)]
    before = w.set_checkpoints(str(folder), rows)
    for r in rows:
        why = checkpoints.changes(before[r["path"]], r) if r["path"] in before else None
        if why:
            problem = Problem(0, "checkpoint_changed", f"checkpoint changed after it was recorded: {why}")
            report.problems.append((r["path"], problem))
            w.add("problems", [_problem_row(r["path"], run_id, problem)])


def _read_labels(w: StoreWriter, path: Path, root: Path, base: Path, report: IngestReport) -> None:
    rows, problems = read_labels_toml(path)
    w.set_labels(
        str(path.absolute()),
        [
            {k: v for k, v in r.items() if k != "folder"}
            | {"run_id": run_id_for(path.parent / r["folder"], root, base)}
            for r in rows
        ],
    )
    report.problems.extend((str(path), p) for p in problems)
    w.set_problems(str(path), [_problem_row(str(path), None, p) for p in problems])  # read whole each time
    report.labels += len(rows)


def _progress(console: Console, total: int) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=total < (8 << 20) or not console.is_terminal,
    )


def _file_row(f: Found, run_id: str, status: str, **kw) -> dict:
    try:
        st = f.path.stat()
        size, mtime_ns = st.st_size, st.st_mtime_ns
    except OSError:
        size = mtime_ns = None
    row = {
        "path": str(f.path),
        "run_id": run_id,
        "format": f.format,
        "status": status,
        "size": size,
        "mtime_ns": mtime_ns,
        "consumed": 0,
        "content_sig": None,
        "first_wall_time": None,
        "last_wall_time": None,
        "records": 0,
        "points": 0,
        "problems": 0,
        "note": None,
        "contents": None,
        "state": None,
        "config_used": None,
        "ingested_at": time.time(),
    }
    row.update(kw)
    return row


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


_INGESTORS: dict[bool, dict[str, Ingestor]] = {}  # per process: ingestors hold compiled state
_POOL: list[ThreadPoolExecutor] = []  # per process: writes parts while the next batch is decoded


def _pool() -> ThreadPoolExecutor:
    if not _POOL:
        _POOL.append(ThreadPoolExecutor(1, thread_name_prefix="parquet"))
    return _POOL[0]


def _ingestors(check_crc: bool) -> dict[str, Ingestor]:
    if check_crc not in _INGESTORS:
        _INGESTORS[check_crc] = {i.name: i for i in make_ingestors(check_crc=check_crc)}
    return _INGESTORS[check_crc]


def read_run(task: RunTask) -> list[FileResult]:
    """Read every file of one run and write their Parquet parts; the rows to stage, per file.

    Runs in any process (top level, picklable in and out). The run's configuration and
    plugins grow file by file as they would in the writer, so a file read after the run's
    ds_config sees it."""
    by_name = _ingestors(task.check_crc)
    root = Path(task.store_root)
    run_config, plugins = dict(task.run_config), dict(task.plugins)
    next_id = [task.first_chunk]
    out = []
    pool = _pool()
    for ft in task.files:
        res = _read_file(
            root, pool, by_name[ft.format], ft, task.run_id, run_config, plugins, next_id, task.share_small
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
    share: bool = False,
) -> FileResult:
    """Read one file from its offset and write its batches' parts. Whatever goes wrong stays
    with this file: the batches read before are kept, the rest is a problem row saying why."""
    res = FileResult(ft.path, run_id)
    path, prev = Path(ft.path), ft.prev
    try:
        st = path.stat()
    except OSError as e:
        res.not_read = f"not read: {e.strerror or e}"
        return res
    records = prev["records"] if prev else 0
    points = prev["points"] if prev else 0
    n_problems = prev["problems"] if prev else 0
    first_wall = prev["first_wall_time"] if prev else None
    last_wall = prev["last_wall_time"] if prev else None
    consumed = ft.offset
    note = None
    contents = Counter(json.loads(prev["contents"]) if prev and prev["contents"] else {})
    state = json.loads(prev["state"]) if prev and prev["state"] else {}
    ctx = ReadContext(run_id, state=state, plugins=dict(plugins), run_config=dict(run_config))
    failure = None
    pending: list = []
    try:
        for batch in ingestor.read(path, ft.offset, ctx):
            _stage(root, pool, pending, res, ingestor.name, batch, next_id, share)
            res.reported.extend(batch.problems)
            if first_wall is None and batch.first_wall_time is not None:
                first_wall = batch.first_wall_time
            last_wall = _latest(last_wall, batch)
            records += batch.records
            points += len(batch.points)
            n_problems += len(batch.problems)
            res.points += len(batch.points)
            res.bytes_read += batch.end - batch.start
            consumed = batch.end
            note = batch.note
            if batch.state is not None:
                state = batch.state
            contents.update({k: v for k, v in batch.counts.items() if v})
    except StoreError:
        raise
    except OSError as e:
        failure = Problem(
            consumed, "read_error", f"read error: {_why(e)}; kept what was read up to byte {consumed}"
        )
    except Exception as e:  # noqa: BLE001 - a reader bug on one file never costs the other files
        failure = Problem(
            consumed,
            "reader_error",
            f"the {ingestor.name} reader failed ({_why(e)}); kept what was read up to byte {consumed}",
        )
    with disk_full_is_a_store_error(root):
        for f in pending:
            _collect(res, f.result())
    if failure is not None:
        note = failure.message
        res.reported.append(failure)
        res.problems.append(_problem_row(ft.path, run_id, failure))
        n_problems += 1
    res.note = note
    try:
        sig = content_sig(path, consumed, whole=not ft.appendable)
    except OSError:  # gone mid-read: no signature, so a file that comes back is read anew
        sig = None
    res.file_row = _file_row(
        Found(path, Path(ft.run_dir), ft.format),
        run_id,
        "problems" if n_problems else "ok",
        size=st.st_size,
        mtime_ns=st.st_mtime_ns,
        consumed=consumed,
        first_wall_time=first_wall,
        last_wall_time=last_wall,
        records=records,
        points=points,
        problems=n_problems,
        note=note,
        state=json.dumps(state, sort_keys=True) if state else None,
        config_used=ingestor.config_used(ctx.run_config, state),
        contents=json.dumps(dict(sorted(contents.items()))) if contents else None,
        content_sig=sig,
    )
    return res


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
    problems = _checked("problems", [_problem_row(key, run_id, p) for p in batch.problems])
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


def _apply(w: StoreWriter, results: list[FileResult], report: IngestReport) -> None:
    """Stage what `read_run` returned, file by file, in the order it was read."""
    for res in results:
        if res.not_read is not None:
            _set_problem(w, report, Path(res.path), res.run_id, "not_read", res.not_read)
            continue
        w.add_written(res.chunks, res.chunk_tags, res.parts, res.shared)
        for table, rows in (("problems", res.problems), ("evidence", res.evidence), ("plugins", res.plugins)):
            w.add_rows(table, rows)
        for config in res.configs:
            w.set_run_config(res.run_id, config)
        w.set_file(res.file_row)
        report.chunks += [(res.run_id, res.path, source, cid) for source, cid in res.chunk_ids]
        report.problems += [(res.path, p) for p in res.reported]
        if res.note:
            report.notes.append((res.path, res.note))
        report.points += res.points
        report.bytes_read += res.bytes_read
        report.files_read += 1
        report.runs.add(res.run_id)


def _run_tasks(w: StoreWriter, files: list[tuple[FileTask, str]], check_crc: bool) -> list[RunTask]:
    """One task per run (files in the order given, which puts configuration first), numbered
    from the writer's next chunk id."""
    tasks: dict[str, RunTask] = {}
    for ft, run_id in files:
        if run_id not in tasks:
            first = w.next_chunk_id + len(tasks) * CHUNKS_PER_TASK
            tasks[run_id] = RunTask(
                str(w.root), run_id, [], w.run_config(run_id), w.plugins(run_id), first, check_crc
            )
        tasks[run_id].files.append(ft)
    if len(tasks) >= SHARED_MIN_RUNS:
        for t in tasks.values():
            t.share_small = True
    return list(tasks.values())


def _read_runs(
    w: StoreWriter, tasks: list[RunTask], executor: Executor, report: IngestReport, progress=None, bar=None
) -> None:
    for task, results in zip(tasks, executor.map(read_run, tasks), strict=True):
        _apply(w, results, report)
        if progress is not None:
            progress.advance(bar, sum(r.bytes_read for r in results))
        del task


def default_executor(tasks: list[RunTask], total_bytes: int, light: bool) -> Executor:
    """In this process for a handful of runs or a watch's poll; a process per core for many."""
    many = len(tasks) >= PARALLEL_MIN_TASKS and total_bytes >= PARALLEL_MIN_BYTES
    return LocalExecutor(os.cpu_count() if many and not light else 1)


def reread(w: StoreWriter, rows: list[dict], check_crc: bool = True) -> list[str]:
    """Read files again from 0 into `w` (their stored data already dropped), as they were read
    before: same run, same format. The `reread` hook of `workbench check --repair`."""
    by_name = _ingestors(check_crc)
    rows = sorted(rows, key=lambda r: (r["run_id"], not by_name[r["format"]].is_config, r["path"]))
    files = [
        (
            FileTask(
                r["path"],
                str(Path(r["path"]).parent),
                r["format"],
                0,
                None,
                by_name[r["format"]].appendable and not is_gz(Path(r["path"])),
            ),
            r["run_id"],
        )
        for r in rows
    ]
    out = []
    for task in _run_tasks(w, files, check_crc):
        for res in read_run(task):
            report = IngestReport()
            _apply(w, [res], report)
            more = len(report.problems)
            out.append(
                f"{res.path}: read again from the log, {report.points:,} points"
                + (f", {more} problems" if more else "")
            )
    return out


def repair(store: Store, wait_s: float = 60.0):
    """`workbench check --repair`: the store's repair, re-reading damaged parts from their logs."""
    return store.repair(reread, wait_s=wait_s)
