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
from ingest.lines import LineIngestor, LineParser, flat_yaml, to_float
from workbench.store.points import PointsBuilder


class _CsvParser(LineParser):
    def __init__(self, path: Path, ctx: ReadContext):
        super().__init__(path, ctx)
        self.header = ctx.state.get("header")
        self.points = PointsBuilder()

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
        batch.points = self.points.take()

    def state(self) -> dict:
        return {"header": self.header, "line": self.line}


class LightningCsvIngestor(LineIngestor):
    name = "lightning_csv"
    precedence = 50
    parser = _CsvParser

    def sniff(self, path: Path, head: bytes) -> bool:
        if not path.name.endswith(".csv"):
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
