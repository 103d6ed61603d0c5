"""MLflow file store runs: `mlruns/<experiment>/<run>/{meta.yaml,metrics/,params/,tags/}`.

Each metric file is one series (its key is its path below `metrics/`), one line per point:
`timestamp_ms value [step [dataset digest]]`, appended as logged. The run's `meta.yaml`
brings status, times, params and tags into the run's configuration.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ingest.base import Batch, Problem, ReadContext
from ingest.textio import flat_yaml, line_blocks, to_float
from workbench.points import Points

STATUS = {1: "RUNNING", 2: "SCHEDULED", 3: "FINISHED", 4: "FAILED", 5: "KILLED"}


def mlflow_run_dir(path: Path) -> Path | None:
    """The run folder when `path` lies in an MLflow run's metrics/params/tags, else None."""
    for parent in path.parents:
        if parent.name in ("metrics", "params", "tags") and (parent.parent / "meta.yaml").is_file():
            return parent.parent
    return None


def _read_values(folder: Path) -> dict:
    if not folder.is_dir():
        return {}
    return {
        p.relative_to(folder).as_posix(): p.read_text(errors="replace")
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


class MlflowMetricIngestor:
    name = "mlflow"
    appendable = True
    needs_head = False

    @staticmethod
    def sniff(path: Path, head: bytes) -> bool:
        run = mlflow_run_dir(path)
        return run is not None and (run / "metrics") in path.parents

    def read(self, path: Path, start: int, ctx: ReadContext) -> Iterator[Batch]:
        key = path.relative_to(mlflow_run_dir(path) / "metrics").as_posix()
        line_no = ctx.state.get("line", 0)
        for b0, b1, lines in line_blocks(path, start):
            batch = Batch(start=b0, end=b1)
            walls, values, steps = [], [], []
            for text in lines:
                line_no += 1
                f = text.split()
                if not f:
                    continue
                ts, v = (to_float(f[0]), to_float(f[1])) if len(f) in (2, 3, 5) else (None, None)
                step = to_float(f[2]) if len(f) >= 3 else 0.0
                if ts is None or v is None or step is None:
                    batch.problems.append(
                        Problem(
                            line_no,
                            "bad_line",
                            f"line {line_no}: expected 'timestamp value step', got {text[:80]!r}; skipped",
                        )
                    )
                    continue
                walls.append(ts / 1000.0)
                values.append(v)
                steps.append(int(step))
                batch.records += 1
            n = len(values)
            batch.points = Points(
                [key], np.zeros(n, np.int32), np.array(steps, np.int64), np.array(walls), np.array(values)
            )
            batch.state = {"line": line_no}
            if batch.first_wall_time is None and walls:
                batch.first_wall_time = walls[0]
            yield batch


class MlflowRunMetaIngestor:
    name = "mlflow_meta"
    appendable = False
    needs_head = True
    is_config = True

    @staticmethod
    def sniff(path: Path, head: bytes) -> bool:
        return path.name == "meta.yaml" and b"run_id:" in head

    def read(self, path: Path, start: int, ctx: ReadContext) -> Iterator[Batch]:
        meta = flat_yaml(path.read_text(errors="replace"))
        run = path.parent
        status = (
            STATUS.get(int(meta["status"]), str(meta["status"])) if to_float(meta.get("status")) else None
        )
        yield Batch(
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
