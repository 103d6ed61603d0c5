"""MLPerf training logs: `:::MLLOG {json}` lines (mlperf-logging's `mllog`), as published in
mlcommons' training_results repositories (`results/<system>/<benchmark>/result_N.txt`).

Each line is one event: `{"namespace", "time_ms", "event_type", "key", "value", "metadata"}`
(`mlperf_logging/mllog/mllog.py`); the lines sit among the job's other console output, and
multi-node launchers put a rank prefix before them (`0: :::MLLOG {...}`). What is read:

- numeric values of the keys a run logs over time (`eval_accuracy`, `train_loss`, and any key
  logged more than once; a dict value such as `tracked_stats` gives `tracked_stats/<name>`) are
  points, `time_ms` their wall time. Their step is the event's own position in training, the
  first of metadata `step`, `samples_count`, `step_num`, `epoch_num` it carries; when that
  position does not advance for a key (BERT v1.0 logs every `eval_accuracy` at `epoch_num` 1),
  the key's points are numbered in the order they were logged instead, and the file's note
  says so;
- every `eval_accuracy` is also an `eval` event;
- keys logged once with a plain value (`submission_*`, `seed`, `global_batch_size`, `opt_*`)
  are the run's configuration (`config["mlperf"]`);
- `run_stop` is how the run ended: status `success` is `completed` evidence; `aborted` (the
  benchmark stopped without reaching its quality target) is `incomplete`. A log without
  `run_stop` says nothing about how the run ended.

Not read: the pre-2019 `:::MLPv0.5.0 <benchmark> <time> (<file>:<line>) <key>: <value>` lines.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ingest.base import Batch, Evidence, Ingestor, Problem, ReadContext, event
from ingest.lines import (
    GZ_ERRORS,
    MAX_JSON_FILE_BYTES,
    head_text,
    is_gz,
    read_head,
    strip_line,
    to_float,
    to_step,
)
from workbench.store.points import PointsBuilder

MARK = ":::MLLOG "
MARK_RE = re.compile(r":::MLLOG\s*\{")
SNIFF_BYTES = 1 << 16  # published logs print the launch command and environment first
SUFFIXES = (".txt", ".log", ".out", ".txt.gz", ".log.gz")
AXES = ("step", "samples_count", "step_num", "epoch_num")  # most to least specific
SERIES = {"eval_accuracy", "train_loss", "loss", "eval_loss", "tracked_stats", "throughput"}
NOT_SERIES = {"run_stop", "run_start", "init_start", "init_stop"}
_DECODER = json.JSONDecoder()


def parse_line(text: str) -> dict | None:
    """The event of one `:::MLLOG` line, or None for any other line; raises ValueError when the
    marker is there but no JSON object follows it."""
    m = MARK_RE.search(text)
    if m is None:
        return None
    try:
        obj, _ = _DECODER.raw_decode(text, m.end() - 1)
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{MARK.strip()} line whose JSON does not decode ({e.msg} at column {e.colno})"
        ) from None
    if not isinstance(obj, dict) or not isinstance(obj.get("key"), str):
        raise ValueError(f"{MARK.strip()} line without a key")
    return obj


def _axis(meta: dict) -> tuple[str, int] | None:
    for name in AXES:
        try:
            step = to_step(meta.get(name))
        except ValueError:
            continue
        if step is not None:
            return name, step
    return None


def _values(key: str, value) -> list[tuple[str, float]]:
    if isinstance(value, dict):
        out = []
        for k, v in value.items():
            x = to_float(v) if not isinstance(v, str) else None
            if x is not None:
                out.append((f"{key}/{k}", x))
        return out
    x = to_float(value) if not isinstance(value, str) else None
    return [] if x is None else [(key, x)]


class MlperfIngestor(Ingestor):
    name = "mlperf"
    precedence = 45
    needs_head = True

    def sniff(self, path: Path, head: bytes) -> bool:
        if not path.name.lower().endswith(SUFFIXES):
            return False
        if MARK.encode() in head:
            return True
        return MARK in head_text(read_head(path, SNIFF_BYTES))

    def read(self, path: Path, start: int, ctx: ReadContext) -> Iterator[Batch]:
        batch = Batch(start=0, end=path.stat().st_size)
        try:
            text = _read_text(path)
        except (OSError, *GZ_ERRORS) as e:
            batch.problems.append(Problem(0, "unreadable", f"cannot read the file ({e}); file skipped"))
            yield batch
            return
        events: list[tuple[int, dict]] = []
        for i, raw in enumerate(text.split("\n"), 1):
            try:
                ev = parse_line(strip_line(raw))
            except ValueError as e:
                batch.problems.append(Problem(i, "bad_record", f"line {i}: {e}; line skipped"))
                continue
            if ev is not None:
                events.append((i, ev))
        batch.records = len(events)
        counts: dict[str, int] = {}
        for _, ev in events:
            counts[ev["key"]] = counts.get(ev["key"], 0) + 1
        # a key logged again and again at advancing positions is a series; one every rank logs
        # once (a hyperparameter printed by 8 processes) is configuration
        timed = {ev["key"] for _, ev in events if _axis(ev.get("metadata") or {})}
        series: dict[str, list[tuple[int, dict]]] = {}
        config: dict = {}
        for line, ev in events:
            key, value = ev["key"], ev.get("value")
            if key in NOT_SERIES:
                continue
            if (key in SERIES or (counts[key] > 1 and key in timed)) and _values(key, value):
                series.setdefault(key, []).append((line, ev))
            elif value is not None and not isinstance(value, dict | list):
                config.setdefault(key, value)
        builder = PointsBuilder()
        notes = []
        for key, evs in series.items():
            axes = [_axis(ev.get("metadata") or {}) for _, ev in evs]
            steps = [a[1] for a in axes if a]
            if len(steps) < len(evs) or any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
                steps = list(range(1, len(evs) + 1))
                named = {a[0] for a in axes if a}
                why = f"its {'/'.join(sorted(named))} does not advance" if named else "it carries no step"
                notes.append(f"{key}: {why}; its {len(evs)} points are numbered in logged order")
            for (line, ev), step in zip(evs, steps, strict=True):
                wall = to_float(ev.get("time_ms"))
                wall = np.nan if wall is None else wall / 1000.0
                for tag, x in _values(key, ev.get("value")):
                    builder.add(tag, step, x, wall)
                if key == "eval_accuracy":
                    batch.events.append(
                        event(
                            step, wall, "eval", "MLPerf evaluation", {"eval_accuracy": ev.get("value")}, line
                        )
                    )
        batch.points = builder.take()
        if config:
            batch.config = {"mlperf": config}
        batch.evidence = _end_of_run(events, batch.points)
        if notes:
            batch.note = "; ".join(notes)
        batch.counts = {"mllog_events": len(events)}
        yield batch


def _read_text(path: Path) -> str:
    if is_gz(path):
        import gzip

        with gzip.open(path, "rb") as f:
            data = f.read(MAX_JSON_FILE_BYTES + 1)
    else:
        data = path.read_bytes()
    return data.decode("utf-8", errors="replace")


def _end_of_run(events: list[tuple[int, dict]], points) -> list[Evidence]:
    stops = [ev for _, ev in events if ev["key"] == "run_stop"]
    if not stops:
        return []
    ev = stops[-1]
    status = str((ev.get("metadata") or {}).get("status", "")).lower()
    wall = to_float(ev.get("time_ms"))
    wall = None if wall is None else wall / 1000.0
    step = int(points.step.max()) if len(points) else None
    if status == "success":
        return [
            Evidence(
                "completed", "MLPerf run_stop: status success (quality target reached)", step, wall_time=wall
            )
        ]
    if status == "aborted":
        message = "MLPerf run_stop: status aborted (stopped before reaching its quality target)"
        return [Evidence("incomplete", message, step, wall_time=wall)]
    return []
