"""PyTorch Lightning CSVLogger: `<name>/version_N/metrics.csv` + `hparams.yaml`.

The header is the sorted union of keys logged so far (the file is rewritten when a key is new,
which the fingerprint sees as a rewrite); an empty cell means the key was not logged in that
row. `step` is the step; every other non-empty cell is a point.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

from ingest.base import Batch, Ingestor, Problem, ReadContext
from ingest.lines import (
    LineIngestor,
    LineParser,
    csv_numbers,
    flat_yaml,
    log_name,
    row_points,
    to_float,
    whole_steps,
)
from workbench.store.points import Points, PointsBuilder


class _CsvParser(LineParser):
    def __init__(self, path: Path, ctx: ReadContext):
        super().__init__(path, ctx)
        self.header = ctx.state.get("header")
        self.points = PointsBuilder()
        self.fast: list[Points] = []

    def feed_block(self, lines: list, batch: Batch) -> bool:
        """Rows of numbers at once (a cell that is no number, a row without a step: line by line)."""
        header = self.header
        if header is None and lines and type(lines[0]) is str:  # the first line, even an empty one
            header, lines = next(csv.reader([lines[0]]), []), lines[1:]
        rows = [t for t in lines if type(t) is not str or t.rstrip("\r") != ""]  # csv.reader: no row
        if not header or "step" not in header or len(set(header)) != len(header):
            return False
        got = csv_numbers(rows, len(header))
        at = header.index("step")
        if got is None or not got[1][:, at].all() or (steps := whole_steps(got[0][:, at])) is None:
            return False
        values, present = got
        cols = [i for i in range(len(header)) if i != at]
        self.fast.append(row_points([header[i] for i in cols], steps, values[:, cols], present[:, cols]))
        self.header = header
        batch.records += len(rows)
        return True

    def feed(self, text: str, batch: Batch) -> None:
        row = next(csv.reader([text]), [])
        if self.header is None:
            self.header = row
            return
        if not row:
            return
        if len(row) != len(self.header):
            why = f"{len(row)} cells for {len(self.header)} columns; skipped"
            batch.problems.append(Problem(self.line, "bad_row", f"line {self.line}: {why}"))
            return
        rec = dict(zip(self.header, row, strict=True))
        step = to_float(rec.get("step"))
        if step is None:
            batch.problems.append(Problem(self.line, "no_step", f"line {self.line}: no step; skipped"))
            return
        batch.records += 1
        for k, cell in rec.items():
            if k == "step" or cell == "":
                continue
            v = to_float(cell)
            if v is not None:
                self.points.add(k, int(step), v)

    def end_block(self, batch: Batch, last: bool) -> None:
        batch.points = Points.concat([*self.fast, self.points.take()]) if self.fast else self.points.take()
        self.fast = []

    def state(self) -> dict:
        return {"header": self.header, "line": self.line}


class LightningCsvIngestor(LineIngestor):
    name = "lightning_csv"
    precedence = 50
    parser = _CsvParser

    def sniff(self, path: Path, head: bytes) -> bool:
        if not log_name(path).endswith(".csv"):
            return False
        cols = head.split(b"\n", 1)[0].strip().split(b",")
        return b"step" in cols and len(cols) > 2


class LightningHparamsIngestor(Ingestor):
    name = "lightning_hparams"
    is_config = True

    def sniff(self, path: Path, head: bytes) -> bool:
        return path.name == "hparams.yaml"

    def read(self, path: Path, start: int, ctx: ReadContext) -> Iterator[Batch]:
        yield Batch(
            start=0,
            end=path.stat().st_size,
            records=1,
            config={"hparams": flat_yaml(path.read_text(errors="replace"))},
        )
