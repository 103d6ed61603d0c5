"""Keras `CSVLogger` files: `epoch,<metric>,...` rows, one per epoch (`training.log` in Keras'
docs; `*.csv` as often). keras/src/callbacks/csv_logger.py writes the header once, when the file
is new, then one row per epoch with `csv.writer` (CRLF line ends); the columns are the sorted
logs of the first epoch (`accuracy, learning_rate, loss, val_*` in Keras 3; `acc`, `lr` in
Keras 2), an empty cell where a later epoch lacks one.

With `append=True` every `fit` appends its epochs to the same file and its epoch count restarts
at 0 (unless `initial_epoch` continues it). Each such restart is a new fit of the same model, so
its epochs continue the run's step axis (step = epochs trained before it + epoch) instead of
overwriting the earlier fit's; the logged epoch is kept as the series `epoch`, and each restart is
a `restart` event.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from ingest.base import Batch, Problem, ReadContext, event
from ingest.lines import LineIngestor, LineParser, csv_numbers, log_name, row_points, to_float, whole_steps
from workbench.store.points import Points, PointsBuilder

SUFFIXES = (".csv", ".log", ".txt")


class _CsvLoggerParser(LineParser):
    def __init__(self, path: Path, ctx: ReadContext):
        super().__init__(path, ctx)
        self.header = ctx.state.get("header")
        self.last_epoch = ctx.state.get("last_epoch")
        self.offset = ctx.state.get("offset", 0)  # epochs trained by earlier fits
        self.fits = ctx.state.get("fits", 1)
        self.points = PointsBuilder()
        self.fast: list[Points] = []

    def feed_block(self, lines: list, batch: Batch) -> bool:
        """Rows of numbers at once, while the epochs count up (a restart, a second header, a cell
        that is no number: the block goes line by line)."""
        rows = [t.rstrip("\r") if type(t) is str else t for t in lines]
        rows = [t for t in rows if t != ""]  # what csv.reader reads as no row
        header = self.header
        if header is None and rows and type(rows[0]) is str:
            header, rows = next(csv.reader([rows[0]])), rows[1:]
        if not header:
            return False
        got = csv_numbers(rows, len(header))
        if got is None or not got[1][:, 0].all() or (epochs := whole_steps(got[0][:, 0])) is None:
            return False
        if (np.diff(epochs) <= 0).any() or (self.last_epoch is not None and epochs[0] <= self.last_epoch):
            return False
        values, present = got
        values[:, 0] = epochs  # the epoch series holds the logged epoch as an integer
        self.fast.append(row_points(["epoch", *header[1:]], self.offset + epochs, values, present))
        self.header, self.last_epoch = header, int(epochs[-1])
        batch.records += len(rows)
        return True

    def feed(self, text: str, batch: Batch) -> None:
        row = next(csv.reader([text.rstrip("\r")]), [])
        if not row:
            return
        if self.header is None:
            self.header = row
            return
        if row == self.header:  # a second file header, as a fit with append=False to a copied file writes
            return
        epoch = to_float(row[0])
        if len(row) != len(self.header) or epoch is None:
            why = f"{len(row)} cells for {len(self.header)} columns" if epoch is not None else "no epoch"
            batch.problems.append(Problem(self.line, "bad_row", f"line {self.line}: {why}; skipped"))
            return
        epoch = int(epoch)
        if self.last_epoch is not None and epoch <= self.last_epoch:
            self.offset += self.last_epoch + 1 - epoch
            self.fits += 1
            batch.events.append(
                event(
                    self.offset + epoch,
                    None,
                    "restart",
                    f"Keras fit #{self.fits} starts: its epoch {epoch} is step {self.offset + epoch}",
                    {"fit": self.fits, "epoch": epoch},
                    self.line,
                )
            )
        self.last_epoch = epoch
        step = self.offset + epoch
        batch.records += 1
        self.points.add("epoch", step, float(epoch))
        for name, cell in zip(self.header[1:], row[1:], strict=True):
            v = to_float(cell) if cell != "" else None
            if v is not None:
                self.points.add(name, step, v)

    def end_block(self, batch: Batch, last: bool) -> None:
        batch.points = Points.concat([*self.fast, self.points.take()]) if self.fast else self.points.take()
        self.fast = []

    def state(self) -> dict:
        return {
            "header": self.header,
            "last_epoch": self.last_epoch,
            "offset": self.offset,
            "fits": self.fits,
            "line": self.line,
        }


class KerasCsvLoggerIngestor(LineIngestor):
    name = "keras_csv"
    precedence = 55
    parser = _CsvLoggerParser

    def sniff(self, path: Path, head: bytes) -> bool:
        if not log_name(path).lower().endswith(SUFFIXES):
            return False
        lines = head.decode("utf-8", errors="replace").splitlines()
        if len(lines) < 2:
            return False
        cols = next(csv.reader([lines[0]]), [])
        first = next(csv.reader([lines[1]]), [])
        return (
            len(cols) >= 2
            and cols[0] == "epoch"
            and "step" not in cols  # Lightning's CSVLogger has a step column
            and len(first) == len(cols)
            and first[0].isdigit()
        )
