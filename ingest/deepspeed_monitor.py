"""DeepSpeed monitor CSVs: `<output_path>/<job_name>/Train_Samples_train_loss.csv`, header
`step,<name>`, one file per metric.

The x axis counts *samples*. With the run's `train_batch_size` (see `ingest.ds_config`) the x
becomes the optimizer step and the sample count is kept as the series `samples`; without one
the x is stored as is and the file's note says so. The file is read again when the run's batch
size becomes known later (another file of the run states it). A restarted job appends a second
header mid-file: it is skipped, and the re-logged steps supersede the old ones.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ingest.base import Batch, Problem, ReadContext
from ingest.ds_config import batch_size_of
from ingest.lines import LineIngestor, LineParser, csv_numbers, log_name, to_float, whole_steps
from workbench.store.points import Points

EVENT_PREFIXES = {"Train_Samples_": "Train/Samples/", "Train_Eigenvalues_": "Train/Eigenvalues/"}


class _MonitorCsvParser(LineParser):
    def __init__(self, path: Path, ctx: ReadContext):
        super().__init__(path, ctx)
        stem = path.stem
        self.tag = next(
            (new + stem[len(old) :] for old, new in EVENT_PREFIXES.items() if stem.startswith(old)), stem
        )
        self.tbs, self.how = batch_size_of(ctx.run_config)
        self.samples: list[int] = []
        self.values: list[float] = []

    def feed_block(self, lines: list, batch: Batch) -> bool:
        """`step,value` rows at once (headers and empty lines skipped as `feed` skips them)."""
        rows = [
            t for t in lines if type(t) is not str or (t.strip() and t.strip().split(",", 1)[0] != "step")
        ]
        got = csv_numbers(rows, 2, quoted=False)
        if got is None or not got[1].all() or (x := whole_steps(got[0][:, 0])) is None:
            return False
        self.samples.extend(x.tolist())
        self.values.extend(got[0][:, 1].tolist())
        batch.records += len(rows)
        return True

    def feed(self, text: str, batch: Batch) -> None:
        parts = text.strip().split(",")
        if not text.strip() or parts[0] == "step":  # a restarted job writes the header again
            return
        x, v = (to_float(parts[0]), to_float(parts[1])) if len(parts) == 2 else (None, None)
        if x is None or v is None:
            batch.problems.append(
                Problem(
                    self.line,
                    "bad_row",
                    f"line {self.line}: expected 'step,value', got {text.strip()[:80]!r}; skipped",
                )
            )
            return
        self.samples.append(int(x))
        self.values.append(v)
        batch.records += 1

    def end_block(self, batch: Batch, last: bool) -> None:
        samples = np.array(self.samples, np.int64)
        values = np.array(self.values, np.float64)
        n = len(values)
        if self.tbs:
            tags = [self.tag, "samples"]
            codes = np.r_[np.zeros(n, np.int32), np.ones(n, np.int32)]
            steps = np.r_[samples // self.tbs, samples // self.tbs]
            values = np.r_[values, samples.astype(np.float64)]
            if "assumed" in self.how or "learned" in self.how:  # say so where it is not stated in the run
                batch.note = f"x axis: samples / {self.how}"
        else:
            tags, codes, steps = [self.tag], np.zeros(n, np.int32), samples
            batch.note = f"x axis kept in samples: {self.how}"
        batch.points = Points(tags, codes, steps, np.full(len(codes), np.nan), values)
        self.samples, self.values = [], []


class DeepSpeedMonitorCsvIngestor(LineIngestor):
    name = "deepspeed_monitor_csv"
    precedence = 60
    sub_source = True
    parser = _MonitorCsvParser

    def config_used(self, run_config: dict, state: dict) -> str | None:
        return str(batch_size_of(run_config)[0])

    def sniff(self, path: Path, head: bytes) -> bool:
        if not log_name(path).endswith(".csv"):
            return False
        first = head.split(b"\n", 1)[0].strip().split(b",")
        return len(first) == 2 and first[0] == b"step" and bool(first[1])
