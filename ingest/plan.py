"""Planning an ingest, on the driver: from what discovery found and each file's manifest row,
what to read and from where.

Incremental by the per-file manifest (`ingest/manifest.py`): an unchanged file is not opened; a
grown file is read from where the last ingest stopped; a rewritten file (shorter, or different
bytes before the resume point) is dropped and read again alone, and the problems table says so.
Files that disappeared keep their stored points. A file read with something from its run's
configuration that a later file changed is stale: it is read again (`stale_files`).
"""

from __future__ import annotations

import json
import stat

import polars as pl

from ingest.base import Ingestor, Problem
from ingest.discover import Found
from ingest.lines import is_gz, is_settled
from ingest.manifest import content_sig, file_row
from ingest.report import IngestReport, set_problem
from ingest.task import FileTask
from workbench.store import StoreWriter


def plan_file(found: Found, run_id: str, prev: dict | None, appendable: bool) -> tuple[str, int]:
    """('new' | 'unchanged' | 'touched' | 'settle' | 'append' | 'reread', offset to read from).

    A file whose size and mtime are as recorded is unchanged. Otherwise the bytes read before
    must be the same (`content_sig`) before the resume point is trusted: then a file of the same
    size was only touched, a longer one grew; anything else is read again from the start. A
    growing log read before it settled, that has settled since with the same bytes, is read on
    from where that read stopped: what it held back (an unfinished last line, notices waiting for
    a step that never came) is the log's end now."""
    st = found.path.stat()
    if not stat.S_ISREG(st.st_mode):
        raise OSError(f"{found.path} is no longer a regular file")
    if prev is None or prev["format"] is None:
        return "new", 0
    if prev["run_id"] != run_id or prev["format"] != found.format:
        return "reread", 0
    consumed = prev["consumed"]
    settle = appendable and prev["settled"] is False and is_settled(found.path, st)
    if st.st_size == prev["size"] and st.st_mtime_ns == prev["mtime_ns"]:
        return ("settle", consumed) if settle else ("unchanged", consumed)
    if st.st_size < consumed or prev["content_sig"] != content_sig(found.path, consumed, not appendable):
        return "reread", 0
    if st.st_size == prev["size"] and settle:
        return "settle", consumed
    if st.st_size == consumed:
        return "touched", consumed
    return ("append", consumed) if appendable else ("reread", 0)


def plan_reads(
    w: StoreWriter, work: list[tuple[Found, str]], by_name: dict[str, Ingestor], report: IngestReport
) -> list[tuple[FileTask, str]]:
    """The files to read, each with its run, configuration first within a run (ds_config,
    hparams: other files of the run may need it). Files that are not logs are recorded as
    skipped; unchanged ones counted; rewritten ones dropped (and said so) to be read anew."""
    plans = []
    for f, run_id in work:
        key = str(f.path)
        prev = w.file_row(key)
        if f.format is None:
            report.files_skipped += 1
            note = f.problem or f.note
            if prev is None or prev["note"] != note:
                w.set_file(file_row(f, run_id, "skipped" if f.problem is None else "error", note=note))
            if f.problem:
                set_problem(w, report, f.path, run_id, "not_read", f.problem)
            continue
        appendable = by_name[f.format].appendable and not is_gz(f.path)
        try:
            action, offset = plan_file(f, run_id, prev, appendable)
        except OSError as e:  # vanished or replaced since discovery
            set_problem(w, report, f.path, run_id, "not_read", f"not read: {e.strerror or e}")
            continue
        if action in ("unchanged", "touched"):
            report.files_unchanged += 1
            report.runs.add(run_id)
            if action == "touched":  # same bytes, new mtime: remember it, read nothing
                assert prev is not None  # plan_file says "touched" only of a file it has a row of
                st = f.path.stat()
                w.set_file({**prev, "size": st.st_size, "mtime_ns": st.st_mtime_ns})
            continue
        if action == "reread" and prev is not None:
            w.drop_file(key)
            report.reread.add(run_id)
            if appendable and (prev["run_id"], prev["format"]) == (run_id, f.format):
                note_rewrite(w, f, run_id, prev, report)
        plans.append(
            (f, run_id, offset, prev if action in ("append", "settle") else None, appendable, f.format)
        )
    plans.sort(key=lambda p: (p[1], not by_name[p[5]].is_config, str(p[0].path)))
    return [
        (FileTask(str(f.path), str(f.run_dir), fmt, off, prev, appendable), run_id)
        for f, run_id, off, prev, appendable, fmt in plans
    ]


def note_rewrite(w: StoreWriter, f: Found, run_id: str, prev: dict, report: IngestReport) -> None:
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


def stale_files(
    w: StoreWriter, by_name: dict[str, Ingestor], found: dict[str, Found], runs: set[str]
) -> list[tuple[dict, Found, Ingestor]]:
    """The files of these runs whose reading took something from their run's configuration that
    a later file of the run changed (a batch size stated by a console read after the monitor
    CSV): (manifest row, what discovery found, its reader)."""
    rows = w.table("files").filter(pl.col("run_id").is_in(sorted(runs)) & pl.col("format").is_not_null())
    stale = []
    for row in rows.iter_rows(named=True):
        ingestor, f = by_name.get(row["format"]), found.get(row["path"])
        if ingestor is None or f is None:
            continue
        state = json.loads(row["state"]) if row["state"] else {}
        if ingestor.config_used(w.run_config(row["run_id"]), state) != row["config_used"]:
            stale.append((row, f, ingestor))
    return stale
