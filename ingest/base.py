"""What every format ingestor returns: batches of points, events and problems with offsets."""

from __future__ import annotations

from dataclasses import dataclass, field

from workbench.points import Points


@dataclass
class Problem:
    offset: int  # byte offset (binary formats) or 1-based line number (text formats)
    kind: str
    message: str


@dataclass
class Batch:
    """One consumed byte range [start, end) of one file.

    `points` are in the order they were logged. `end` is where the next read
    resumes: the start of an unfinished trailing record, or the end of the file.
    """

    start: int
    end: int
    points: Points = field(default_factory=Points.empty)
    events: list[dict] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    records: int = 0
    config: dict = field(default_factory=dict)  # run configuration found (hparams, ...)
    plugins: dict[str, str] = field(default_factory=dict)  # tag -> first-seen plugin
    first_wall_time: float | None = None
    counts: dict[str, int] = field(default_factory=dict)  # things seen but not stored
    note: str | None = None  # e.g. an unfinished trailing record
