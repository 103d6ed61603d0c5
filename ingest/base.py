"""What every format ingestor takes and returns.

An ingestor is a small class: `name`, `sniff(path, head)`, `read(path, start, ctx)` yielding
Batches, and `appendable` (True when a grown file can be read from where the last ingest
stopped; otherwise a changed file is re-read whole). Discovery, fingerprinting and writing
live elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from workbench.points import Points


@dataclass
class Problem:
    offset: int  # byte offset (binary formats) or 1-based line number (text formats)
    kind: str
    message: str


@dataclass
class ReadContext:
    """What an ingestor may know besides the file: its own state from the last ingest of this
    file, and what the run has shown so far (TensorBoard plugins, configuration)."""

    run_id: str
    state: dict = field(default_factory=dict)
    plugins: dict[str, str] = field(default_factory=dict)
    run_config: dict = field(default_factory=dict)


@dataclass
class Batch:
    """One consumed byte range [start, end) of one file.

    `points` are in the order they were logged. `end` is where the next read resumes: the start
    of an unfinished trailing record or line, or the end of the file. `state` is handed back in
    the ReadContext of the next ingest of this file.
    """

    start: int
    end: int
    points: Points = field(default_factory=Points.empty)
    events: list[dict] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    records: int = 0
    config: dict = field(default_factory=dict)  # run configuration found (hparams, ds_config, ...)
    plugins: dict[str, str] = field(default_factory=dict)  # tag -> first-seen plugin
    first_wall_time: float | None = None
    counts: dict[str, int] = field(default_factory=dict)  # things seen but not stored
    note: str | None = None  # e.g. an unfinished trailing record
    state: dict | None = None


def event(
    step, wall_time, kind: str, message: str, attrs: dict | None = None, offset: int | None = None
) -> dict:
    """One row for the events table (run_id and path are added by the pipeline)."""
    import json
    import math

    return {
        "step": None if step is None else int(step),
        "wall_time": None
        if wall_time is None or (isinstance(wall_time, float) and math.isnan(wall_time))
        else float(wall_time),
        "kind": kind,
        "message": message,
        "attrs": json.dumps(attrs or {}, sort_keys=True),
        "offset": None if offset is None else int(offset),
    }
