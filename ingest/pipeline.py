"""`workbench ingest`: discover, fingerprint, read what is new, write, commit.

Incremental by a per-file manifest (size, mtime, consumed bytes, hashes of the first bytes and
of the bytes before the resume point): an unchanged file is not opened; a grown file is read
from where the last ingest stopped; a rewritten file (shorter, or different bytes before the
resume point) is dropped and re-read alone. Files that disappeared keep their stored points.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
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
from ingest.base import Ingestor, Problem, ReadContext
from ingest.discover import Found, discover, run_id_for
from ingest.ds_config import batch_size_of
from ingest.labels import read_labels_toml
from ingest.registry import make_ingestors, precedence
from workbench.errors import NotFoundError
from workbench.store import Store, StoreWriter

SIG_BYTES = 4096


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

    @property
    def log_files(self) -> int:
        return self.files_read + self.files_unchanged


def _sig(path: Path, start: int, end: int) -> str:
    start = max(0, start)
    with open(path, "rb") as f:
        f.seek(start)
        return hashlib.sha1(f.read(max(0, end - start))).hexdigest()


def _plan(found: Found, run_id: str, prev: dict | None, appendable: bool) -> tuple[str, int]:
    """('unchanged' | 'append' | 'reread' | 'new', offset to read from)."""
    st = found.path.stat()
    if prev is None or prev["format"] is None:
        return "new", 0
    if prev["run_id"] != run_id or prev["format"] != found.format:
        return "reread", 0
    if st.st_size == prev["size"] and st.st_mtime_ns == prev["mtime_ns"]:
        return "unchanged", prev["consumed"]
    consumed = prev["consumed"]
    if not appendable:
        return "reread", 0
    if st.st_size < consumed:
        return "reread", 0
    if _sig(found.path, 0, min(SIG_BYTES, consumed)) != prev["head_sig"]:
        return "reread", 0
    if _sig(found.path, consumed - SIG_BYTES, consumed) != prev["tail_sig"]:
        return "reread", 0
    return ("append" if st.st_size > consumed else "unchanged"), consumed


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
) -> IngestReport:
    """Ingest every log under `paths` into `store`; per-file problems are reported, not raised.
    `light`: a poll of a live watch, which commits every second: lineage and catalog.duckdb
    are left as they were (the watch refreshes them now and then), and a poll that found no new
    bytes and staged nothing commits nothing. `stage` adds the caller's own changes to the
    same commit (a watch's alerts) and says whether it added any."""
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
        roots = w.table("roots")["root"].to_list()
        work = []
        for root in paths:
            base = _base_for(root, roots)
            if str(base) not in roots:
                roots.append(str(base))
                w.add("roots", [{"root": str(base)}])
            labels_file = (root if root.is_dir() else root.parent) / "labels.toml"
            if labels_file.is_file():
                _read_labels(w, labels_file, root, base, report)
            found = discover(root, ingestors)
            for f in found.files:
                run_id = run_id_for(f.run_dir, root, base)
                work.append((f, run_id))
            for folder, run_dir in found.checkpoints:
                run_id = run_id_for(run_dir, root, base)
                rows = [{**row, "run_id": run_id} for row in checkpoints.scan(folder, hash_checkpoints)]
                before = w.set_checkpoints(str(folder), rows)
                changed = [
                    (r, why)
                    for r in rows
                    if r["path"] in before and (why := checkpoints.changes(before[r["path"]], r))
                ]
                for row, why in changed:
                    problem = Problem(
                        0, "checkpoint_changed", f"checkpoint changed after it was recorded: {why}"
                    )
                    report.problems.append((row["path"], problem))
                    w.add(
                        "problems",
                        [
                            {
                                "path": row["path"],
                                "run_id": run_id,
                                "offset": 0,
                                "kind": problem.kind,
                                "message": problem.message,
                            }
                        ],
                    )
        plans = []
        for f, run_id in work:
            key = str(f.path)
            prev = w.file_row(key)
            if f.format is None:
                report.files_skipped += 1
                if prev is None or prev["note"] != f.note:
                    w.set_file(_file_row(f, run_id, "skipped", note=f.note))
                continue
            action, offset = _plan(f, run_id, prev, by_name[f.format].appendable)
            if action == "unchanged":
                report.files_unchanged += 1
                report.runs.add(run_id)
                continue
            if action == "reread" and prev is not None:
                w.drop_file(key)
                report.reread.add(run_id)
                if by_name[f.format].appendable and (prev["run_id"], prev["format"]) == (run_id, f.format):
                    _note_rewrite(w, f, run_id, prev, report)
            plans.append((f, run_id, offset, prev if action == "append" else None))
        # configuration first (ds_config, hparams): other files of the run may need it
        plans.sort(key=lambda p: (p[1], not by_name[p[0].format].is_config, str(p[0].path)))
        total = sum(max(0, f.path.stat().st_size - off) for f, _, off, _ in plans)
        with _progress(console, total) as progress:
            task = progress.add_task("ingest", total=total)
            for f, run_id, offset, prev in plans:
                progress.update(task, description=f.path.name[-40:])
                _read_file(w, by_name[f.format], f, run_id, offset, prev, report, progress, task)
            _reread_stale(w, by_name, {str(f.path): f for f, _ in work}, {p[1] for p in plans}, report)
        staged = stage(w) if stage is not None else False
        if not light:
            derive = {"lineage": lineage.build, "agreement": agreement.build}
            w.commit(derive=derive)
            if _learn_batch_sizes(store, w):
                _reread_stale(w, by_name, {str(f.path): f for f, _ in work}, w.changed_runs, report)
                w.commit(derive=derive)
        elif plans or staged:  # an idle watched run makes no new generation every second
            w.commit(catalog=False)
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
) -> None:
    """Read again the files whose reading took something from their run's configuration that a
    later file of the run changed (a batch size stated by a console read after the monitor CSV)."""
    rows = w.table("files").filter(pl.col("run_id").is_in(sorted(runs)) & pl.col("format").is_not_null())
    for row in rows.iter_rows(named=True):
        ingestor, f = by_name.get(row["format"]), found.get(row["path"])
        if ingestor is None or f is None:
            continue
        state = json.loads(row["state"]) if row["state"] else {}
        if ingestor.config_used(w.run_config(row["run_id"]), state) != row["config_used"]:
            report.notes = [(p, n) for p, n in report.notes if p != row["path"]]
            report.problems = [(p, x) for p, x in report.problems if p != row["path"]]
            w.drop_file(row["path"])
            _read_file(w, ingestor, f, row["run_id"], 0, None, report, None, None)
            report.files_read -= 1  # counted once, when it was first read


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
    st = f.path.stat()
    row = {
        "path": str(f.path),
        "run_id": run_id,
        "format": f.format,
        "status": status,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "consumed": 0,
        "head_sig": None,
        "tail_sig": None,
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


def _read_file(
    w: StoreWriter,
    ingestor: Ingestor,
    f: Found,
    run_id: str,
    offset: int,
    prev: dict | None,
    report,
    progress,
    task,
) -> None:
    key = str(f.path)
    st = f.path.stat()
    records = prev["records"] if prev else 0
    points = prev["points"] if prev else 0
    n_problems = prev["problems"] if prev else 0
    first_wall = prev["first_wall_time"] if prev else None
    last_wall = prev["last_wall_time"] if prev else None
    consumed = offset
    note = None
    contents = Counter(json.loads(prev["contents"]) if prev and prev["contents"] else {})
    state = json.loads(prev["state"]) if prev and prev["state"] else {}
    ctx = ReadContext(run_id, state=state, plugins=w.plugins(run_id), run_config=w.run_config(run_id))
    try:
        for batch in ingestor.read(f.path, offset, ctx):
            chunk_id = w.add_chunk(
                run_id, key, ingestor.name, batch.start, batch.end, batch.points, batch.events
            )
            report.chunks.append((run_id, key, ingestor.name, chunk_id))
            if batch.problems:
                w.add(
                    "problems",
                    [
                        {
                            "path": key,
                            "run_id": run_id,
                            "offset": p.offset,
                            "kind": p.kind,
                            "message": p.message,
                        }
                        for p in batch.problems
                    ],
                )
                report.problems.extend((key, p) for p in batch.problems)
            if batch.evidence:
                w.add(
                    "evidence",
                    [
                        {
                            "path": key,
                            "run_id": run_id,
                            "status": e.status,
                            "message": e.message,
                            "step": e.step,
                            "failure": e.failure,
                        }
                        for e in batch.evidence
                    ],
                )
            if batch.plugins:
                w.add(
                    "plugins", [{"run_id": run_id, "tag": t, "plugin": p} for t, p in batch.plugins.items()]
                )
            if batch.config:
                w.set_run_config(run_id, batch.config)
            if first_wall is None and batch.first_wall_time is not None:
                first_wall = batch.first_wall_time
            last_wall = _latest(last_wall, batch)
            records += batch.records
            points += len(batch.points)
            n_problems += len(batch.problems)
            report.points += len(batch.points)
            report.bytes_read += batch.end - batch.start
            if progress is not None:
                progress.advance(task, batch.end - batch.start)
            consumed = batch.end
            note = batch.note
            if batch.state is not None:
                state = batch.state
            contents.update({k: v for k, v in batch.counts.items() if v})
    except OSError as e:
        note = f"read error: {e.strerror or e}; kept what was read up to byte {consumed}"
        report.problems.append((key, Problem(consumed, "read_error", note)))
        w.add(
            "problems",
            [{"path": key, "run_id": run_id, "offset": consumed, "kind": "read_error", "message": note}],
        )
        n_problems += 1
    if note:
        report.notes.append((key, note))
    report.files_read += 1
    report.runs.add(run_id)
    w.set_file(
        _file_row(
            f,
            run_id,
            "problems" if n_problems else "ok",
            size=st.st_size,
            mtime_ns=st.st_mtime_ns,
            consumed=consumed,
            head_sig=_sig(f.path, 0, min(SIG_BYTES, consumed)),
            tail_sig=_sig(f.path, consumed - SIG_BYTES, consumed),
            first_wall_time=first_wall,
            last_wall_time=last_wall,
            records=records,
            points=points,
            problems=n_problems,
            note=note,
            state=json.dumps(state, sort_keys=True) if state else None,
            config_used=ingestor.config_used(ctx.run_config, state),
            contents=json.dumps(dict(sorted(contents.items()))) if contents else None,
        )
    )


def _latest(last: float | None, batch) -> float | None:
    """The newest wall time seen in the file so far (points and events)."""
    times = [t for t in (last, batch.first_wall_time) if t is not None]
    walls = batch.points.wall_time
    if len(walls) and np.isfinite(walls).any():
        times.append(float(np.nanmax(walls)))
    times += [e["wall_time"] for e in batch.events if e.get("wall_time") is not None]
    return max(times, default=None)


def print_report(report: IngestReport, console: Console | None = None, max_problems: int = 20) -> None:
    console = console or Console(stderr=True)
    for path, p in report.problems[:max_problems]:
        console.print(f"[yellow]problem[/] {path} @ {p.offset}: {p.message}", highlight=False)
    if len(report.problems) > max_problems:
        console.print(
            f'... and {len(report.problems) - max_problems} more: workbench sql "SELECT * FROM problems"',
            highlight=False,
        )
    for path, note in report.notes:
        console.print(f"[dim]note[/] {path}: {note}", highlight=False)
    mb = report.bytes_read / 1e6
    console.print(
        f"ingested {len(report.runs)} runs: {report.files_read} files read, "
        f"{report.files_unchanged} unchanged, {report.files_skipped} skipped (not logs); "
        f"{report.points:,} points, {mb:,.1f} MB in {report.seconds:.2f}s; "
        f"{len(report.problems)} problems",
        highlight=False,
    )
    sys.stderr.flush()
