"""`workbench ingest`: discover, plan, read what is new, write, commit.

The driver: discovery and labels and checkpoints on this process; `ingest/plan.py` decides what
to read; one task per run (`ingest/task.py`: `read_run(RunTask)`) is mapped through an executor
(`workbench/executor.py`), and the plain rows each task returns are staged in task order and
committed as one generation. `reread` and `repair` read damaged files again for `workbench check
--repair`.

One bad file never costs the rest: whatever goes wrong with one file (its format cannot be
told, its reader fails, it vanishes mid-read, it is a FIFO) becomes a `problems` row naming it,
and everything else is committed. Only the store failing (disk full) stops the ingest, and then
the previous generation stays in force.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

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

from ingest import agreement, checkpoint_integrity, checkpoints, lineage
from ingest.base import Ingestor, Problem
from ingest.discover import Found, discover, run_id_for
from ingest.ds_config import batch_size_of
from ingest.labels import read_labels_toml
from ingest.lines import is_gz
from ingest.plan import plan_reads, stale_files
from ingest.registry import make_ingestors, precedence
from ingest.report import IngestReport, error_text, problem_row, set_problem
from ingest.task import CHUNKS_PER_TASK, FileResult, FileTask, RunTask, ingestors_by_name, read_run
from workbench.errors import NotFoundError
from workbench.executor import Executor, LocalExecutor
from workbench.store import Store, StoreError, StoreWriter
from workbench.store.commit import Derive
from workbench.store.config import max_tags_per_run, settings_folders
from workbench.store.layout import read_derived

NOT_READ = ("not_read", "labels_error", "checkpoint_error")  # problems of things not read at all
# in an ingest of this many runs, or of a run of this many files, small chunks are written many
# to a file (task.SHARED_BELOW)
SHARED_MIN_RUNS = 64
# below this much work, spawning processes costs more than it saves: a spawned worker imports
# for about 1.5 s and this process keeps staging and committing beside the workers, so n
# workers pay off past about 24 MB x n / (n - 1). On 2 cores, in three alternating rounds of
# the many-runs benchmark's JSONL runs (48 KB each), in this process against 2 workers:
# 500 runs (24 MB) 3.1-3.3 s against 4.1-4.4 s; 1,000 runs (48 MB) 5.8-7.3 s against
# 5.2-6.9 s; 1,500 runs (72 MB) 7.4-9.9 s against 7.0-8.4 s
PARALLEL_MIN_TASKS = 64
PARALLEL_MIN_BYTES = 24 << 20
# Below that, many small runs (1 MB a run on average) are read on a thread per core: a run's
# parse (pyarrow), file reads and Parquet writes leave the GIL, so two runs' reads overlap.
# 500 of the benchmark's runs: 2.17-2.52 s against 2.52-2.76 s on one thread (5 alternating
# rounds, 2 cores); 1,000 and 1,500 runs on threads against 2 processes: even within the noise.
# Big runs stay one at a time: two decoded at once would hold twice the memory.
THREADED_MIN_TASKS = 8
THREADED_MAX_RUN_BYTES = 1 << 20


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
    unreachable = {}  # a path that cannot be looked at (EACCES, a /proc link): a problem row
    for p in paths:
        try:
            there = p.exists()
        except OSError as e:
            unreachable[p] = f"not read: {e.strerror or e}"
            continue
        if not there:
            raise NotFoundError(f"{p}: no such file or folder")
    with store.writer(wait_s=wait_s) as w:
        w.set_sources(precedence(ingestors))
        w.clear_problems([str(p.absolute()) for p in paths], NOT_READ)  # found again below if they still are
        roots = w.table("roots")["root"].to_list()
        known = _known_logs(w)
        work = []
        labelled: list[tuple[Path, list[dict]]] = []
        for root in paths:
            if root in unreachable:
                set_problem(w, report, root.absolute(), None, "not_read", unreachable[root])
                continue
            base = _base_for(root, roots)
            if str(base) not in roots:
                roots.append(str(base))
                w.add("roots", [{"root": str(base)}])
            labels_file = (root if root.is_dir() else root.parent) / "labels.toml"
            if labels_file.is_file():
                with _isolated(w, report, labels_file, None, "labels_error"):
                    labelled.append((labels_file, _read_labels(w, labels_file, base, report)))
            found = discover(root, ingestors, known)
            for folder, why in found.problems:
                set_problem(w, report, folder, None, "not_read", why)
            run_ids: dict[Path, str] = {}  # a run of many files: its id worked out once
            for f in found.files:
                if (run_id := run_ids.get(f.run_dir)) is None:
                    run_id = run_ids[f.run_dir] = run_id_for(f.run_dir, base)
                work.append((f, run_id))
            logs = frozenset(f.path for f in found.files if f.format)
            for folder, run_dir in found.checkpoints:
                run_id = run_id_for(run_dir, base)
                with _isolated(w, report, folder, run_id, "checkpoint_error"):
                    _scan_checkpoints(w, folder, run_id, hash_checkpoints, report, logs)
        files = plan_reads(w, work, by_name, report)
        total = sum(max(0, _size(Path(ft.path)) - ft.offset) for ft, _ in files)
        tasks = _run_tasks(w, files, check_crc)
        executor = executor or default_executor(tasks, total, light)
        found_by_path = {str(f.path): f for f, _ in work}
        with _progress(console, total) as progress:
            bar = progress.add_task("ingest", total=total)
            _read_runs(w, tasks, executor, report, progress, bar)
            _reread_stale(w, by_name, found_by_path, {run_id for _, run_id in files}, report, check_crc)
        for labels_file, rows in labelled:
            _check_labels(w, labels_file, rows, report)
        staged = stage(w) if stage is not None else False
        if not light:
            derive: dict[str, Derive] = {"lineage": lineage.build, "agreement": agreement.build}
            w.commit(derive=derive)
            if _learn_batch_sizes(store, w):
                _reread_stale(w, by_name, found_by_path, w.changed_runs, report, check_crc)
                w.commit(derive=derive)
        elif files or staged:  # an idle watched run makes no new generation every second
            w.commit(catalog=False)
        report.derive_errors = dict(w.derive_errors)
    report.seconds = time.perf_counter() - t0
    return report


def _known_logs(w: StoreWriter) -> dict[str, tuple[int, int, str]]:
    """Each log file the store has read: its size and mtime then, and its format (discovery
    opens none of them again while they stay so)."""
    f = w.table("files")
    return {
        p: (size, mtime, fmt)
        for p, size, mtime, fmt in zip(f["path"], f["size"], f["mtime_ns"], f["format"], strict=True)
        if fmt is not None and size is not None and mtime is not None
    }


def _learn_batch_sizes(store: Store, w: StoreWriter) -> bool:
    """DeepSpeed monitor series still on a samples axis (no batch size anywhere in their run)
    whose values agree with another source's once the axis is divided by a whole ratio: take
    that ratio as the run's train_batch_size. Whether any run learned one."""
    # the agreement table of the generation just published, read as it is (no views to make)
    agreement = read_derived("agreement", store.live_generation())
    scaled = agreement.filter(
        (pl.col("verdict") == "scaled")
        & (
            ((pl.col("step_scale") < 0) & pl.col("tag_a").str.starts_with("Train/Samples/"))
            | ((pl.col("step_scale") > 0) & pl.col("tag_b").str.starts_with("Train/Samples/"))
        )
    ).select("run_id", pl.col("step_scale").abs().alias("k"), "source_a", "source_b", "step_scale")
    learned = False
    for run_id, k, a, b, scale in scaled.iter_rows():
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
    later file of the run changed (`plan.stale_files`)."""
    stale = stale_files(w, by_name, found, runs)
    for row, _, _ in stale:
        report.notes = [(p, n) for p, n in report.notes if p != row["path"]]
        report.problems = [(p, x) for p, x in report.problems if p != row["path"]]
        w.drop_file(row["path"])
    files = [
        (
            FileTask(
                row["path"], str(f.run_dir), ingestor.name, 0, None, ingestor.appendable and not is_gz(f.path)
            ),
            row["run_id"],
        )
        for row, f, ingestor in stale
    ]
    read = report.files_read
    _read_runs(w, _run_tasks(w, files, check_crc), LocalExecutor(1), report)
    report.files_read = read  # counted once, when they were first read


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
        set_problem(w, report, path, run_id, kind, f"not read: {error_text(e)}")


def _scan_checkpoints(
    w: StoreWriter, folder: Path, run_id: str, hash_files: bool, report, logs: frozenset[Path]
) -> None:
    """Record the checkpoints in `folder`. One first seen, or changed since it was recorded, is
    checked against its copies (`checkpoint_integrity.verify`): a disagreement is reported once,
    and stays a problem row until the checkpoint changes again; one unchanged keeps what was
    learnt of it (with `--hash`, an unhashed one is hashed now)."""
    rows = [{**row, "run_id": run_id} for row in checkpoints.scan(folder, logs)]
    before = w.checkpoints_in(str(folder))
    for r in rows:
        prev = before.get(r["path"])
        if prev is not None and checkpoints.changes(prev, r) is None:
            r.update(sha256=prev["sha256"], copies=prev["copies"], verified=prev["verified"])
            if not (hash_files and prev["sha256"] is None):
                continue
        mismatch = checkpoint_integrity.verify(r, hash_files)  # hashes it (with --hash)
        if prev is not None and (why := checkpoints.changes(prev, r)):
            changed = f"checkpoint changed after it was recorded: {why}"
            _checkpoint_problem(w, report, r, "checkpoint_changed", changed)
        _checkpoint_problem(w, report, r, "checkpoint_mismatch", mismatch)
    if rows != [before.get(r["path"]) for r in rows] or len(before) != len(rows):
        w.set_checkpoints(str(folder), rows)  # else as recorded: a re-ingest of 10k runs rewrites nothing


def _checkpoint_problem(w: StoreWriter, report, row: dict, kind: str, message: str | None) -> None:
    """The checkpoint's problem of this kind is now `message` (none: the problem is gone)."""
    problem = Problem(0, kind, message) if message else None
    w.set_problems(row["path"], [problem_row(row["path"], row["run_id"], problem)] if problem else [], kind)
    if problem:
        report.problems.append((row["path"], problem))


def _read_labels(w: StoreWriter, path: Path, base: Path, report: IngestReport) -> list[dict]:
    """Store the labels of one labels.toml (replacing what it said before); returns them."""
    rows, problems = read_labels_toml(path)
    labels = [
        {k: v for k, v in r.items() if k != "folder"}
        | {"run_id": run_id_for(path.parent / r["folder"], base)}
        for r in rows
    ]
    w.set_labels(str(path.absolute()), labels)
    report.problems.extend((str(path), p) for p in problems)
    w.set_problems(str(path), [problem_row(str(path), None, p) for p in problems])  # read whole each time
    report.labels += len(rows)
    return labels


def _check_labels(w: StoreWriter, path: Path, labels: list[dict], report: IngestReport) -> None:
    """A label naming a folder that holds one run (Lightning's `run/lightning_logs/version_0`,
    a trainer's `output/runs/<date>`) is that run's. A label for a run the store does not hold,
    or whose onset lies outside the run's steps, is kept (the run may come later) and reported
    as a problem of the labels file."""
    ranges = (
        w.table("chunks")
        .select("chunk_id", "run_id")
        .join(w.table("chunk_tags").select("chunk_id", "min_step", "max_step"), on="chunk_id")
        .group_by("run_id")
        .agg(pl.col("min_step").min(), pl.col("max_step").max())
    )
    steps = {r: (lo, hi) for r, lo, hi in ranges.iter_rows()}
    runs = set(w.table("files")["run_id"].drop_nulls().to_list()) | set(steps)
    problems = []
    # the runs under each label that names no run (few: the runs are scanned once per such label)
    missing = {label["run_id"] for label in labels} - runs
    inside = {m: sorted(r for r in runs if r.startswith(m + "/")) for m in missing}
    if one := {m: under[0] for m, under in inside.items() if len(under) == 1}:
        labels = [{**label, "run_id": one.get(label["run_id"], label["run_id"])} for label in labels]
        w.set_labels(str(path.absolute()), labels)
    for label in labels:
        run, onset = label["run_id"], label["onset"]
        if run not in runs and len(inside[run]) > 1:
            some = ", ".join(inside[run][:3]) + (", ..." if len(inside[run]) > 3 else "")
            problems.append(
                Problem(
                    0,
                    "label_unknown_run",
                    f"[runs.{json.dumps(run)}]: a folder of {len(inside[run])} runs ({some}); label one of them",
                )
            )
        elif run not in runs:
            problems.append(
                Problem(0, "label_unknown_run", f"[runs.{json.dumps(run)}]: no such run under {path.parent}")
            )
        elif onset is not None and run in steps and not steps[run][0] <= onset <= steps[run][1]:
            lo, hi = steps[run]
            problems.append(
                Problem(
                    0,
                    "label_onset_outside",
                    f"[runs.{json.dumps(run)}]: onset {onset} is outside the run's steps ({lo} to {hi})",
                )
            )
    report.problems.extend((str(path), p) for p in problems)
    w.add("problems", [problem_row(str(path), None, p) for p in problems])


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


def _apply(w: StoreWriter, results: list[FileResult], report: IngestReport) -> None:
    """Stage what `read_run` returned, file by file, in the order it was read."""
    for res in results:
        if res.not_read is not None:
            set_problem(w, report, Path(res.path), res.run_id, "not_read", res.not_read)
            continue
        w.add_written(res.chunks, res.chunk_tags, res.parts, res.shared)
        for table, rows in (("problems", res.problems), ("evidence", res.evidence), ("plugins", res.plugins)):
            w.add_rows(table, rows)
        for config in res.configs:
            w.set_run_config(res.run_id, config)
        assert res.file_row is not None  # every file that was opened has its manifest row
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
    from the writer's next chunk id, with the tags the run holds and how many it may."""
    tasks: dict[str, RunTask] = {}
    max_tags = max_tags_per_run(*settings_folders(w.root))
    held = _tags_held(w, {run_id for _, run_id in files})
    for ft, run_id in files:
        if run_id not in tasks:
            first = w.next_chunk_id + len(tasks) * CHUNKS_PER_TASK
            tasks[run_id] = RunTask(
                str(w.root),
                run_id,
                [],
                w.run_config(run_id),
                w.plugins(run_id),
                first,
                check_crc,
                tags=held.get(run_id, []),
                max_tags=max_tags,
            )
        tasks[run_id].files.append(ft)
    for t in tasks.values():  # many runs, or a run of many files: a Parquet file per chunk costs more
        t.share_small = len(tasks) >= SHARED_MIN_RUNS or len(t.files) >= SHARED_MIN_RUNS
    return list(tasks.values())


def _tags_held(w: StoreWriter, runs: set[str]) -> dict[str, list[str]]:
    """The distinct tags each of these runs holds in the store (and staged)."""
    if not runs:
        return {}
    chunks = w.table("chunks").filter(pl.col("run_id").is_in(sorted(runs))).select("chunk_id", "run_id")
    held = (
        w.table("chunk_tags")
        .select("chunk_id", "tag")
        .join(chunks, on="chunk_id")
        .group_by("run_id")
        .agg(pl.col("tag").unique())
    )
    return dict(held.iter_rows())


def _read_runs(
    w: StoreWriter, tasks: list[RunTask], executor: Executor, report: IngestReport, progress=None, bar=None
) -> None:
    for task, results in zip(tasks, executor.map(read_run, tasks), strict=True):
        _apply(w, results, report)
        if progress is not None:
            progress.advance(bar, sum(r.bytes_read for r in results))
        del task


def default_executor(tasks: list[RunTask], total_bytes: int, light: bool) -> Executor:
    """In this process for a handful of runs or a watch's poll, many small runs on a thread per
    core; a process per core for many runs holding much."""
    cores = os.cpu_count() or 1
    many = len(tasks) >= PARALLEL_MIN_TASKS and total_bytes >= PARALLEL_MIN_BYTES * cores / max(1, cores - 1)
    if many and not light:
        return LocalExecutor(cores)
    small = len(tasks) >= THREADED_MIN_TASKS and total_bytes <= THREADED_MAX_RUN_BYTES * len(tasks)
    return LocalExecutor(1, threads=cores if small else 1)


def reread(w: StoreWriter, rows: list[dict], check_crc: bool = True) -> list[str]:
    """Read files again from 0 into `w` (their stored data already dropped), as they were read
    before: same run, same format. The `reread` hook of `workbench check --repair`."""
    by_name = ingestors_by_name(check_crc)
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
