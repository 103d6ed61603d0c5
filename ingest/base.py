"""The ingestor contract: what every format reader declares, takes and returns.

Adding a format is one module with one `Ingestor` subclass, one line in `ingest.registry`, and
one test file. Discovery, fingerprinting, incremental reading and writing live elsewhere; an
ingestor only recognises its files (`sniff`) and turns bytes into Batches (`read`).
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from workbench.store.points import Points


@dataclass
class Problem:
    offset: int  # byte offset (binary formats) or 1-based line number (text formats)
    kind: str
    message: str


@dataclass
class Evidence:
    """What a file says about how its run ended; the run's status is its strongest evidence
    (order: workbench.store.schema.STATUS_EVIDENCE)."""

    status: str  # diverged | crashed | completed | incomplete | checkpoint
    message: str  # in words, e.g. "HF Trainer wrote its final summary"
    step: int | None = None
    failure: str | None = None  # the failure kind an automatic label takes from it (crash, oom, ...)
    wall_time: float | None = None  # when it was written; the run writing on long after it makes it stale


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
    evidence: list[Evidence] = field(default_factory=list)  # the end-of-run evidence hook
    records: int = 0
    config: dict = field(default_factory=dict)  # run configuration found (hparams, ds_config, ...)
    plugins: dict[str, str] = field(default_factory=dict)  # tag -> first-seen plugin
    first_wall_time: float | None = None
    counts: dict[str, int] = field(default_factory=dict)  # things seen but not stored
    note: str | None = None  # e.g. an unfinished trailing record
    state: dict | None = None


class Ingestor(ABC):
    """One log format.

    Class attributes (the declared contract, read by the pipeline, discovery and registry):
    - `name`: the format's name, stored as each point's `source`.
    - `precedence`: when two sources of a run log the same tag at the same step, the lower
      number keeps the current row (10 trainer state files, 20 JSON Lines, 30 TensorBoard,
      40-60 other structured files, 90 console text); None for formats that write no points.
    - `appendable`: a grown file is read from where the last ingest stopped (else re-read whole).
    - `needs_head`: `sniff` looks at the file's first bytes (`head`), not only its path.
    - `is_config`: the file configures its run (ds_config, hparams); read before the run's logs.
    - `sub_source`: tools write it into a sub-folder of its run (`tb/`, `monitor_csv/job/`),
      which then belongs to the parent run instead of being a run of its own.
    End-of-run evidence (completed, crashed, diverged, ...) travels in `Batch.evidence`.
    """

    name: ClassVar[str]
    precedence: ClassVar[int | None] = None
    appendable: ClassVar[bool] = False
    needs_head: ClassVar[bool] = False
    is_config: ClassVar[bool] = False
    sub_source: ClassVar[bool] = False

    @abstractmethod
    def sniff(self, path: Path, head: bytes) -> bool:
        """Whether `path` (whose first bytes are `head` when `needs_head`) is this format."""

    @abstractmethod
    def read(self, path: Path, start: int, ctx: ReadContext) -> Iterator[Batch]:
        """Batches for the bytes of `path` from `start` on, in file order."""

    def config_used(self, run_config: dict, state: dict) -> str | None:
        """What this file's reading took from its run's configuration (e.g. the batch size that
        turns samples into steps), given the file's saved state; the file is read again when
        the run's final configuration gives another answer. None: it depends on none."""
        return None

    def run_folder(self, folder: Path) -> Path | None:
        """The run that files in `folder` belong to when the format's own layout says so (an
        MLflow run's `metrics/` and `params/`), else None: discovery decides."""
        return None


def event(
    step, wall_time, kind: str, message: str, attrs: dict | None = None, offset: int | None = None
) -> dict:
    """One row for the events table (run_id and path are added by the pipeline)."""
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
