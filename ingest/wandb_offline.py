"""W&B run folders on disk: `wandb/offline-run-<date>_<time>-<id>/` (`WANDB_MODE=offline`) and
`wandb/run-<date>_<time>-<id>/`, with the run's transaction log `run-<id>.wandb` and `files/`
(`wandb-summary.json`, `output.log`, `config.yaml`, `wandb-metadata.json`).

The `.wandb` file is read with the `wandb` package's own reader, never decoded here: the
package's `wandb.sdk.internal.datastore` + `wandb.proto.wandb_internal_pb2` where it has them
(wandb < 0.2x), else its record printer `wandb leet inspect --json` (wandb-core, 0.31). What
is taken from it:

- each `history` record's numeric items are points at its step (`history.step.num`, else the
  item `_step`), wall time the item `_timestamp`; `_step`, `_runtime`, `_timestamp` are axes,
  not series; non-numeric items (media, histograms, tables) are counted, not stored;
- the `run` record's config (`config.update`) and project, name, id go to the run's
  configuration;
- the `exit` record is how the run ended: exit code 0 is `completed`, any other `crashed`; a
  log without one (the process was killed, or is still running) says nothing.

Without the package (an optional extra: `pip install -e '.[wandb]'`) the history is not read:
the `.wandb` file is a listed problem that says so, and `files/wandb-summary.json`, when it
holds metrics at a `_step`, gives their last values as points. With the package the summary
adds nothing the history does not have. `files/output.log` is the run's console, left to the
console readers; files of the run's `files/`, `logs/` and `tmp/` belong to the run folder.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ingest.base import Batch, Evidence, Ingestor, Problem, ReadContext
from ingest.lines import JsonError, read_json_file, to_float, to_step
from workbench.store.points import PointsBuilder

RUN_DIR = re.compile(r"(?:offline-)?run-\d{8}_\d{6}-[A-Za-z0-9]+")
WANDB_FILE = re.compile(r"run-[A-Za-z0-9]+\.wandb")
AXES = ("_step", "_runtime", "_timestamp")
INSTALL = "pip install -e '.[wandb]'"
LEET_TIMEOUT_S = 600


class NoReader(RuntimeError):
    """The installed wandb (or its absence) offers no reader for `.wandb` files."""


def _datastore_records(path: Path) -> Iterator[tuple[str, dict]]:
    """(type, fields) of each record, with the package's Python datastore and protobufs."""
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    ds = datastore.DataStore()
    ds.open_for_scan(str(path))
    while True:
        try:
            data = ds.scan_data()
        except AssertionError:  # the last block is unfinished: a run still writing, or killed
            yield "unfinished", {}
            return
        if data is None:
            return
        pb = wandb_internal_pb2.Record()  # type: ignore[attr-defined]  # wandb re-exports its versioned pb2 by star import
        pb.ParseFromString(data)
        kind = pb.WhichOneof("record_type")
        if kind == "history":
            item = {}
            for it in pb.history.item:
                key = it.key or "/".join(it.nested_key)
                try:
                    item[key] = json.loads(it.value_json)
                except ValueError:
                    continue
            step = pb.history.step.num if pb.history.HasField("step") else None
            yield "history", {"item": item, "step": step}
        elif kind == "exit":
            yield "exit", {"exit_code": pb.exit.exit_code}
        elif kind == "run":
            config = {}
            for it in pb.run.config.update:
                key = it.key or "/".join(it.nested_key)
                try:
                    config[key] = json.loads(it.value_json)
                except ValueError:
                    continue
            yield "run", {"config": config, "project": pb.run.project, "run_id": pb.run.run_id}
        else:
            yield kind or "unknown", {}


def _leet_records(path: Path) -> Iterator[tuple[str, dict]]:
    """(type, fields) of each record, printed by the package's `wandb leet inspect --json`."""
    cmd = [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(path)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=LEET_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise NoReader(f"`wandb leet inspect` did not finish in {LEET_TIMEOUT_S} s") from None
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()
        raise NoReader(f"`wandb leet inspect` failed: {why[-1] if why else f'exit code {done.returncode}'}")
    for line in done.stdout.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        kind = rec.get("type", "unknown")
        body = rec.get(kind) if isinstance(rec.get(kind), dict) else {}
        if kind == "history":
            step = (body.get("step") or {}).get("num")
            yield "history", {"item": body.get("item") or {}, "step": step}
        elif kind == "exit":
            yield "exit", {"exit_code": body.get("exit_code", 0)}
        elif kind == "run":
            config = (body.get("config") or {}).get("update") or {}
            yield "run", {"config": config, "project": body.get("project"), "run_id": body.get("run_id")}
        else:
            yield kind, {}


def records(path: Path) -> tuple[str, Iterator[tuple[str, dict]]]:
    """(which reader, its records) for one `.wandb` file; raises NoReader without the package."""
    try:
        import wandb
    except ImportError:
        raise NoReader(f"the wandb package is not installed ({INSTALL})") from None
    version = getattr(wandb, "__version__", "?")
    try:
        import wandb.sdk.internal.datastore  # noqa: F401
    except ImportError:
        return f"wandb {version} (leet inspect)", _leet_records(path)
    return f"wandb {version} (datastore)", _datastore_records(path)


def _numbers(item: dict) -> Iterator[tuple[str, float]]:
    for key, v in item.items():
        if isinstance(v, dict) and "_type" not in v:  # a nested dict of metrics, as W&B names them
            for sub, x in _numbers(v):
                yield f"{key}.{sub}", x
        elif key not in AXES and not isinstance(v, bool | str):
            num = to_float(v)
            if num is not None:
                yield key, num


def _plain(value):
    """A config value as W&B stores it: `{"value": x}` in config.yaml, plain in the run record."""
    if isinstance(value, dict) and set(value) <= {"value", "desc"}:
        return value.get("value")
    return value


class WandbRunIngestor(Ingestor):
    name = "wandb"
    precedence = 25
    needs_head = False

    def sniff(self, path: Path, head: bytes) -> bool:
        if WANDB_FILE.fullmatch(path.name):
            return True
        return path.name == "wandb-summary.json" and path.parent.name == "files"

    def run_folder(self, folder: Path) -> Path | None:
        if RUN_DIR.fullmatch(folder.name):
            return folder
        parts = folder.parts  # (names, not a Path per parent: this runs for every folder of an ingest)
        for i in range(len(parts) - 2, -1, -1):
            if parts[i + 1] in ("files", "logs", "tmp") and RUN_DIR.fullmatch(parts[i]):
                return Path(*parts[: i + 1])
        return None

    def read(self, path: Path, start: int, ctx: ReadContext) -> Iterator[Batch]:
        if path.suffix == ".wandb":
            yield self._read_history(path)
        else:
            yield self._read_summary(path)

    def _read_history(self, path: Path) -> Batch:
        batch = Batch(start=0, end=path.stat().st_size)
        try:
            reader, found = records(path)
            recs = list(found)
        except NoReader as e:
            batch.problems.append(Problem(0, "needs_package", f"W&B history not read: {e}"))
            return batch
        except Exception as e:  # noqa: BLE001 - a damaged log is a problem of its own file
            batch.problems.append(
                Problem(0, "bad_record", f"W&B transaction log not read ({type(e).__name__}: {e})")
            )
            return batch
        builder = PointsBuilder()
        exit_code, skipped = None, 0
        counts: dict[str, int] = {}
        for kind, body in recs:
            counts[kind] = counts.get(kind, 0) + 1
            if kind == "history":
                item = body["item"]
                try:
                    step = to_step(body.get("step"))
                    if step is None:
                        step = to_step(item.get("_step"))
                except ValueError:
                    step = None
                if step is None:
                    skipped += 1
                    continue
                wall = to_float(item.get("_timestamp"))
                for key, x in _numbers(item):
                    builder.add(key, step, x, np.nan if wall is None or not math.isfinite(wall) else wall)
            elif kind == "run":
                batch.config["wandb"] = {
                    "project": body.get("project"),
                    "run_id": body.get("run_id"),
                    "config": {k: _plain(v) for k, v in (body.get("config") or {}).items() if k != "_wandb"},
                }
            elif kind == "exit":
                exit_code = int(body.get("exit_code") or 0)
        batch.points = builder.take()
        if exit_code is not None:  # wandb 0.17 writes the last history record after the exit record
            last = int(batch.points.step.max()) if len(batch.points) else None
            if exit_code == 0:
                batch.evidence = [Evidence("completed", "W&B run exited with code 0", last)]
            else:
                message = f"W&B run exited with code {exit_code}"
                batch.evidence = [Evidence("crashed", message, last, failure="crash")]
        batch.records = counts.get("history", 0)
        batch.counts = {f"wandb_{k}": v for k, v in counts.items() if k != "history"}
        notes = [f"read with {reader}"]
        if skipped:
            notes.append(f"{skipped} history records without a step skipped")
        if counts.get("unfinished"):
            notes.append("the log ends in an unfinished block (the run was still writing, or was killed)")
        batch.note = "; ".join(notes)
        return batch

    def _read_summary(self, path: Path) -> Batch:
        """The last values, only where the history cannot be read (no package, no .wandb)."""
        batch = Batch(start=0, end=path.stat().st_size)
        log = next((p for p in path.parent.parent.glob("run-*.wandb") if WANDB_FILE.fullmatch(p.name)), None)
        if log is not None:
            try:
                records(log)  # only finds the reader; reads nothing yet
                batch.note = "the run's history is read from its .wandb log; the summary adds nothing"
                return batch
            except NoReader:
                pass
        try:
            summary = read_json_file(path)
        except JsonError as e:
            batch.problems.append(Problem(e.lineno, "bad_json", f"line {e.lineno}: {e.msg}; file skipped"))
            return batch
        if not isinstance(summary, dict):
            return batch
        try:
            step = to_step(summary.get("_step"))
        except ValueError:
            step = None
        if step is None:
            batch.note = "wandb-summary.json has no _step: nothing to place on the run's steps"
            return batch
        builder = PointsBuilder()
        wall = to_float(summary.get("_timestamp"))
        for key, x in _numbers({k: v for k, v in summary.items() if k != "_wandb"}):
            builder.add(key, step, x, np.nan if wall is None else wall)
        batch.points = builder.take()
        batch.records = 1
        batch.note = f"last values only (wandb-summary.json); for the history: {INSTALL}"
        return batch
