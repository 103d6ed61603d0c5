"""MLflow file store runs: `mlruns/<experiment>/<run>/{meta.yaml,metrics/,params/,tags/}`.

Each metric file is one series (its key is its path below `metrics/`), one line per point:
`timestamp_ms value [step [dataset digest]]`, appended as logged. The run's `meta.yaml`
brings status, times, params and tags into the run's configuration.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ingest.base import Batch, Evidence, Ingestor, Problem, ReadContext
from ingest.lines import LineIngestor, LineParser, flat_yaml, to_float, to_step
from workbench.store.points import Points

STATUS = {1: "RUNNING", 2: "SCHEDULED", 3: "FINISHED", 4: "FAILED", 5: "KILLED"}
# RUNNING is no evidence: a run killed without a goodbye stays RUNNING forever
RUN_STATUS = {"FINISHED": "completed", "FAILED": "crashed", "KILLED": "crashed"}


def mlflow_run_dir(folder: Path) -> Path | None:
    """The run folder when `folder` lies in an MLflow run's metrics/params/tags, else None."""
    parts = folder.parts  # (names, not a Path per parent: this runs for every folder of an ingest)
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] in ("metrics", "params", "tags") and (run := Path(*parts[:i]) / "meta.yaml").is_file():
            return run.parent
    return None


def _read_values(folder: Path) -> dict:
    if not folder.is_dir():
        return {}
    return {
        p.relative_to(folder).as_posix(): p.read_text(errors="replace")
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


class _MetricParser(LineParser):
    def __init__(self, path: Path, ctx: ReadContext):
        super().__init__(path, ctx)
        self.walls: list[float] = []
        self.values: list[float] = []
        self.steps: list[int] = []

    def feed(self, text: str, batch: Batch) -> None:
        f = text.split()
        if not f:
            return
        ts, v = (to_float(f[0]), to_float(f[1])) if len(f) in (2, 3, 5) else (None, None)
        step = to_step(f[2]) if len(f) >= 3 else 0  # raises ValueError for a step that is none
        if ts is None or v is None or step is None:
            batch.problems.append(
                Problem(
                    self.line,
                    "bad_line",
                    f"line {self.line}: expected 'timestamp value step', got {text[:80]!r}; skipped",
                )
            )
            return
        self.walls.append(ts / 1000.0)
        self.values.append(v)
        self.steps.append(step)
        batch.records += 1

    def end_block(self, batch: Batch, last: bool) -> None:
        run = mlflow_run_dir(self.path.parent)
        assert run is not None  # sniff took only files inside a run's metrics/
        key = self.path.relative_to(run / "metrics").as_posix()
        n = len(self.values)
        batch.points = Points(
            [key],
            np.zeros(n, np.int32),
            np.array(self.steps, np.int64),
            np.array(self.walls),
            np.array(self.values),
        )
        if self.walls:
            batch.first_wall_time = self.walls[0]
        self.walls, self.values, self.steps = [], [], []


class MlflowMetricIngestor(LineIngestor):
    name = "mlflow"
    precedence = 40
    needs_head = False
    parser = _MetricParser

    def sniff(self, path: Path, head: bytes) -> bool:
        run = mlflow_run_dir(path.parent)
        return run is not None and (run / "metrics") in path.parents

    def run_folder(self, folder: Path) -> Path | None:
        return mlflow_run_dir(folder)


class MlflowRunMetaIngestor(Ingestor):
    name = "mlflow_meta"
    needs_head = True
    is_config = True

    def sniff(self, path: Path, head: bytes) -> bool:
        return path.name == "meta.yaml" and b"run_id:" in head

    def read(self, path: Path, start: int, ctx: ReadContext) -> Iterator[Batch]:
        meta = flat_yaml(path.read_text(errors="replace"))
        run = path.parent
        status = (
            STATUS.get(int(meta["status"]), str(meta["status"])) if to_float(meta.get("status")) else None
        )
        yield Batch(
            evidence=[Evidence(RUN_STATUS[status], f"MLflow run status {status}")]
            if status in RUN_STATUS
            else [],
            start=0,
            end=path.stat().st_size,
            records=1,
            config={
                "mlflow": {
                    "run_id": meta.get("run_id"),
                    "name": meta.get("run_name") or meta.get("name"),
                    "status": status,
                    "start_time": meta.get("start_time"),
                    "end_time": meta.get("end_time"),
                    "params": _read_values(run / "params"),
                    "tags": _read_values(run / "tags"),
                }
            },
        )
