"""DeepSpeed's files besides its console: monitor CSVs and `ds_config.json` (FORMATS.md §3.5).

Monitor CSVs (`<output_path>/<job_name>/Train_Samples_train_loss.csv`, header `step,<name>`)
count *samples* on their x axis. With the run's `train_batch_size` (from its ds_config) the
x becomes the optimizer step and the sample count is kept as the series `samples`; without a
config the x is stored as is and the run's notes say so. A restarted job appends a second
header mid-file: it is skipped, and the re-logged steps supersede the old ones.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ingest.base import Batch, Problem, ReadContext
from ingest.textio import line_blocks, to_float
from workbench.points import Points

CONFIG_KEYS = (b'"train_batch_size"', b'"train_micro_batch_size_per_gpu"', b'"zero_optimization"', b'"fp16"')
EVENT_PREFIXES = {"Train_Samples_": "Train/Samples/", "Train_Eigenvalues_": "Train/Eigenvalues/"}


def batch_size_of(config: dict) -> int | None:
    ds = config.get("ds_config") or {}
    tbs = to_float(ds.get("train_batch_size"))
    return int(tbs) if tbs else None


class DeepSpeedConfigIngestor:
    name = "ds_config"
    appendable = False
    needs_head = True
    is_config = True

    @staticmethod
    def sniff(path: Path, head: bytes) -> bool:
        if not path.name.endswith(".json"):
            return False
        return head.lstrip()[:1] == b"{" and (
            "ds_config" in path.name or sum(k in head for k in CONFIG_KEYS) >= 2
        )

    def read(self, path: Path, start: int, ctx: ReadContext) -> Iterator[Batch]:
        batch = Batch(start=0, end=path.stat().st_size, records=1)
        try:
            batch.config = {"ds_config": json.loads(path.read_bytes())}
        except ValueError as e:
            batch.problems.append(
                Problem(e.lineno, "bad_json", f"line {e.lineno} column {e.colno}: {e.msg}; file skipped")
            )
        yield batch


class DeepSpeedMonitorCsvIngestor:
    name = "deepspeed_monitor_csv"
    appendable = True
    needs_head = True

    @staticmethod
    def sniff(path: Path, head: bytes) -> bool:
        if not path.name.endswith(".csv"):
            return False
        first = head.split(b"\n", 1)[0].strip().split(b",")
        return len(first) == 2 and first[0] == b"step" and bool(first[1])

    def read(self, path: Path, start: int, ctx: ReadContext) -> Iterator[Batch]:
        stem = path.stem
        tag = next(
            (new + stem[len(old) :] for old, new in EVENT_PREFIXES.items() if stem.startswith(old)), stem
        )
        tbs = batch_size_of(ctx.run_config)
        line_no = ctx.state.get("line", 0)
        for b0, b1, lines in line_blocks(path, start):
            batch = Batch(start=b0, end=b1)
            samples, values = [], []
            for text in lines:
                line_no += 1
                parts = text.strip().split(",")
                if not text.strip() or parts[0] == "step":  # a restarted job writes the header again
                    continue
                x, v = (to_float(parts[0]), to_float(parts[1])) if len(parts) == 2 else (None, None)
                if x is None or v is None:
                    batch.problems.append(
                        Problem(
                            line_no,
                            "bad_row",
                            f"line {line_no}: expected 'step,value', got {text.strip()[:80]!r}; skipped",
                        )
                    )
                    continue
                samples.append(int(x))
                values.append(v)
                batch.records += 1
            samples_arr = np.array(samples, np.int64)
            steps = samples_arr // tbs if tbs else samples_arr
            n = len(values)
            tags = [tag] + (["samples"] if tbs else [])
            codes = np.zeros(n, np.int32)
            if tbs:
                codes = np.r_[codes, np.ones(n, np.int32)]
                steps = np.r_[steps, steps]
                values = values + samples
            batch.points = Points(
                tags, codes, steps, np.full(len(codes), np.nan), np.array(values, np.float64)
            )
            batch.state = {"line": line_no}
            if not tbs:
                batch.note = (
                    "x axis is samples: no ds_config with train_batch_size in this run to turn it into steps"
                )
            yield batch
