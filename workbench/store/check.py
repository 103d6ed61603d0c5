"""`workbench check`: prove the store whole against its own records, or say what is damaged;
`--repair` mends what it can and says what it could not.

What is checked: the marker's format version; CURRENT names a generation; the generation's table
files against its manifest (size, sha256); every Parquet part its chunks wrote, against the
size and sha256 recorded when it was written (`workbench.store.integrity`).

What repair does, in order:
1. CURRENT missing or garbage, or the live generation's tables damaged: CURRENT is pointed at
   the newest intact generation (the ingests after it are redone by the next ingest); with none
   intact, it refuses and says how to start over.
2. a part missing or damaged: the log file it came from is read again (the `reread` hook, which
   the ingest layer provides); when that log is gone, the chunk is dropped and the loss is
   recorded as a problem of that file. The damaged part files are removed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

import workbench.store.integrity as integrity
import workbench.store.layout as layout
import workbench.store.leases as leases
from workbench.errors import StoreError
from workbench.store.integrity import Damage
from workbench.store.writer import StoreWriter

# re-reads log files (given as their `files` rows, already dropped from the writer) into the
# writer; returns one line per file saying what happened
Reread = Callable[[StoreWriter, list[dict]], list[str]]


@dataclass
class CheckReport:
    root: Path
    generation: str | None = None
    tables: int = 0  # table files verified
    parts: int = 0  # parts verified
    damage: list[Damage] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)  # what --repair did, in words
    refused: list[str] = field(default_factory=list)  # what it could not, and what to do instead
    after: list[Damage] = field(default_factory=list)  # damage left after repairing

    @property
    def ok(self) -> bool:
        """Whole: nothing damaged, or all of it repaired."""
        return not (self.after if self.repaired or self.refused else self.damage) and not self.refused


def check(root: Path) -> CheckReport:
    """Verify everything the live generation refers to (read-only, takes no lock)."""
    report = CheckReport(root)
    if not (root / layout.MARKER).exists() and not (root / "CURRENT").exists():
        raise StoreError(f"no store at {root}; create one with: workbench ingest PATH --store {root}")
    try:
        version = layout.read_format(root)
    except ValueError as e:
        version = None
        report.damage.append(Damage(layout.MARKER, "marker", str(e)))
    if version is not None and version > layout.FORMAT_VERSION:
        report.damage.append(Damage(layout.MARKER, "format", layout.newer_format_message(root, version)))
        return report
    gen = _current_or_damage(root, report)
    if gen is None:
        return report
    report.generation = gen.name
    report.tables = len(list(gen.glob("*.parquet")))
    with leases.holding(root, gen):  # an ingest meanwhile does not collect what is being checked
        report.damage += integrity.verify_generation(root, gen)
        if report.damage:
            return report  # its chunk list cannot be trusted to name the parts
        parts = integrity.expected_parts(root, integrity.read_tables(gen))
        report.parts = parts.height
        report.damage += integrity.verify_parts(root, parts)
    return report


def repair(root: Path, reread: Reread) -> CheckReport:
    """Repair what `check` finds; the caller holds the writer lock."""
    report = check(root)
    if not report.damage:
        return report
    kinds = {d.kind for d in report.damage}
    if "format" in kinds:
        report.refused.append(report.damage[0].message)
        return report
    if "marker" in kinds:  # an unreadable marker in a store that is otherwise ours
        layout.write_marker(root)
        report.repaired.append(f"{layout.MARKER} rewritten (format {layout.FORMAT_VERSION})")
    if kinds & {"current", "generation"} and not _restore_generation(root, report):
        return report
    parts = [d for d in check(root).damage if d.chunk_id is not None]
    if parts:
        _repair_parts(root, parts, reread, report)
    final = check(root)
    report.after, report.generation, report.tables, report.parts = (
        final.damage,
        final.generation,
        final.tables,
        final.parts,
    )
    return report


def _current_or_damage(root: Path, report: CheckReport) -> Path | None:
    try:
        return layout.current_generation(root)
    except StoreError:
        try:
            name = (root / "CURRENT").read_text(errors="replace").strip()
            what = f"names {name[:40]!r}, which is no generation in meta/"
        except FileNotFoundError:
            n = len(layout.generations(root))
            what = (
                f"is missing, and the store holds {n} generations"
                if n
                else "is missing, and so is every generation"
            )
        report.damage.append(Damage("CURRENT", "current", what))
        return None


def _restore_generation(root: Path, report: CheckReport) -> bool:
    """Point CURRENT at the newest intact generation; False (refused) when there is none."""
    damaged = {d.path.split("/")[1] for d in report.damage if d.kind == "generation"}
    for gen in reversed(layout.generations(root)):
        if gen.name not in damaged and not integrity.verify_generation(root, gen):
            break
    else:
        report.refused.append(
            "no intact metadata generation is left to go back to: start a fresh store from the logs "
            f"(workbench ingest PATH --store NEW_FOLDER); {root} is left as it is"
        )
        return False
    tmp = root / "CURRENT.tmp"
    tmp.write_text(gen.name + "\n")
    layout.fsync_file(tmp)
    os.replace(tmp, root / "CURRENT")
    layout.fsync_dir(root)
    was = f" (was {report.generation})" if report.generation else ""
    if gen == layout.generations(root)[-1]:
        report.repaired.append(f"CURRENT now names {gen.name}{was}, the newest generation (intact)")
    else:
        report.repaired.append(
            f"CURRENT now names {gen.name}{was}, the newest intact generation; "
            "the next ingest reads again what was ingested after it"
        )
    report.generation = gen.name
    return True


def _repair_parts(root: Path, damage: list[Damage], reread: Reread, report: CheckReport) -> None:
    """Re-read the logs of damaged parts; drop what they held when their logs are gone."""
    for d in damage:  # dropped below; a reader's glob over the parts must not trip on them
        (root / d.path).unlink(missing_ok=True)
    w = StoreWriter(root, verify=False)
    try:
        sources = sorted({d.source for d in damage if d.source is not None})  # a part names its log
        present = [s for s in sources if os.path.isfile(s)]
        rows = w.table("files").filter(pl.col("path").is_in(present)).to_dicts()
        for path in present:
            w.drop_file(path)
        if rows:
            report.repaired += reread(w, rows)
        for path in sorted(set(sources) - set(present)):
            _drop_lost(w, path, [d for d in damage if d.source == path], report)
        w.commit()
    finally:
        w.close()


def _drop_lost(w: StoreWriter, path: str, damage: list[Damage], report: CheckReport) -> None:
    """A damaged part whose log is gone: its chunk goes (points and events) when its points were
    damaged; only the events part goes when only that was."""
    scalars = sorted({d.chunk_id for d in damage if d.part == "scalars" and d.chunk_id is not None})
    events = sorted(
        {d.chunk_id for d in damage if d.part == "events" and d.chunk_id is not None} - set(scalars)
    )
    chunks = w.table("chunks").filter(pl.col("chunk_id").is_in(scalars))
    points = int(chunks["rows"].sum())
    w.drop_chunks(scalars)
    w.drop_parts(events, "events")
    lost = ", ".join(
        what
        for n, what in (
            (scalars, f"{points:,} points of {len(scalars)} chunks"),
            (events, f"the events of {len(events)} chunks"),
        )
        if n
    )
    message = f"{lost} lost: their Parquet parts were damaged and this log file is gone, so they cannot be read again"
    row = w.file_row(path)
    if row is not None:
        w.set_file(
            {
                **row,
                "points": max(0, row["points"] - points),
                "problems": row["problems"] + 1,
                "status": "problems",
            }
        )
    w.add(
        "problems",
        [
            {
                "path": path,
                "run_id": row["run_id"] if row else None,
                "offset": 0,
                "kind": "store_damage",
                "message": message,
            }
        ],
    )
    report.repaired.append(f"{path}: {message}; dropped them")
