"""What one ingest did (`IngestReport`), and the problem rows it records for the files it read
or could not read. Rendered for a terminal by `workbench/render.py` (`ingest_report`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ingest.base import Problem
from workbench.store import StoreWriter


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


def error_text(e: Exception) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return f"{type(e).__name__}: {e}"


def set_problem(w: StoreWriter, report: IngestReport, path: Path, run_id, kind: str, message: str) -> None:
    """The one problem row of something that was not read (replacing the last ingest's)."""
    problem = Problem(0, kind, message)
    report.problems.append((str(path), problem))
    w.set_problems(str(path), [problem_row(str(path), run_id, problem)], kind)


def problem_row(path: str, run_id: str | None, p: Problem) -> dict:
    return {"path": path, "run_id": run_id, "offset": p.offset, "kind": p.kind, "message": p.message}
