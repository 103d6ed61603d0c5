"""PyTorch Lightning CSVLogger: `<name>/version_N/metrics.csv` + `hparams.yaml` (FORMATS.md §5.1).

The header is the sorted union of keys logged so far (the file is rewritten when a key is new,
which the fingerprint sees as a rewrite); an empty cell means the key was not logged in that
row. `step` is the step; every other non-empty cell is a point.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

from ingest.base import Batch, Problem, ReadContext
from ingest.textio import flat_yaml, line_blocks, to_float
from workbench.points import PointsBuilder


class LightningCsvIngestor:
    name = "lightning_csv"
    appendable = True
    needs_head = True

    @staticmethod
    def sniff(path: Path, head: bytes) -> bool:
        if not path.name.endswith(".csv"):
            return False
        cols = head.split(b"\n", 1)[0].strip().split(b",")
        return b"step" in cols and len(cols) > 2

    def read(self, path: Path, start: int, ctx: ReadContext) -> Iterator[Batch]:
        header = ctx.state.get("header")
        line_no = ctx.state.get("line", 0)
        for b0, b1, lines in line_blocks(path, start):
            batch = Batch(start=b0, end=b1)
            points = PointsBuilder()
            for row in csv.reader(lines):
                line_no += 1
                if header is None:
                    header = row
                    continue
                if not row:
                    continue
                if len(row) != len(header):
                    batch.problems.append(
                        Problem(
                            line_no,
                            "bad_row",
                            f"line {line_no}: {len(row)} cells for {len(header)} columns; skipped",
                        )
                    )
                    continue
                rec = dict(zip(header, row, strict=True))
                step = to_float(rec.get("step"))
                if step is None:
                    batch.problems.append(Problem(line_no, "no_step", f"line {line_no}: no step; skipped"))
                    continue
                batch.records += 1
                for k, cell in rec.items():
                    if k == "step" or cell == "":
                        continue
                    v = to_float(cell)
                    if v is not None:
                        points.add(k, int(step), v)
            batch.points = points.take()
            batch.state = {"header": header, "line": line_no}
            yield batch


class LightningHparamsIngestor:
    name = "lightning_hparams"
    appendable = False
    needs_head = False
    is_config = True

    @staticmethod
    def sniff(path: Path, head: bytes) -> bool:
        return path.name == "hparams.yaml"

    def read(self, path: Path, start: int, ctx: ReadContext) -> Iterator[Batch]:
        yield Batch(
            start=0,
            end=path.stat().st_size,
            records=1,
            config={"hparams": flat_yaml(path.read_text(errors="replace"))},
        )
