"""Line formats (JSON Lines, CSV, console text): whole lines only, `.gz` transparently, bounded
memory, and the shared reader (`LineIngestor` + a per-file `LineParser`)."""

from __future__ import annotations

import gzip
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

from ingest.base import Batch, Ingestor, ReadContext

# a number as loggers print it, including nan/inf
NUM = r"(?:[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf|Infinity|NaN))"
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
BLOCK = 8 << 20
SETTLED_S = 60  # a file untouched this long is finished: its last line counts even without "\n"


def strip_line(raw: str) -> str:
    """What a terminal would show: text after the last carriage return, ANSI codes removed."""
    if "\r" in raw:
        raw = raw.rsplit("\r", 1)[1] or raw.rstrip("\r").rsplit("\r", 1)[-1]
    return ANSI.sub("", raw) if "\x1b" in raw else raw


def to_float(v) -> float | None:
    """A logged value as a float: numbers, numeric strings ("0.00", "100%", "NaN"); else None."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str):
        s = v.strip().rstrip("%")
        try:
            return float(s)
        except ValueError:
            return None
    return None


def is_gz(path: Path) -> bool:
    return path.name.endswith(".gz")


def read_head(path: Path, n: int) -> bytes:
    if is_gz(path):
        try:
            with gzip.open(path, "rb") as f:
                return f.read(n)
        except (OSError, EOFError):
            return b""
    with open(path, "rb") as f:
        return f.read(n)


def is_settled(path: Path) -> bool:
    """Untouched for SETTLED_S seconds: the writer is done (or gone)."""
    return time.time() - path.stat().st_mtime > SETTLED_S


def line_blocks(path: Path, start: int) -> Iterator[tuple[int, int, list[str]]]:
    """Yield (start, end, lines) for the complete lines after byte `start`, a block at a time.

    A trailing line without a newline is held back (the writer may be mid-line) unless the
    file has not changed for SETTLED_S seconds. A `.gz` file is read whole from 0.
    """
    settled = is_settled(path)
    if is_gz(path):
        with gzip.open(path, "rb") as f:
            data = f.read()
        lines = data.decode("utf-8", errors="replace").split("\n")
        if data.endswith(b"\n"):
            lines.pop()
        if lines:
            yield 0, path.stat().st_size, lines
        return
    with open(path, "rb") as f:
        f.seek(start)
        pos = start
        carry = b""
        while True:
            chunk = f.read(BLOCK)
            if not chunk:
                if carry and settled:
                    yield pos, pos + len(carry), [carry.decode("utf-8", errors="replace")]
                return
            data = carry + chunk
            cut = data.rfind(b"\n")
            if cut < 0:
                carry = data
                continue
            body, carry = data[: cut + 1], data[cut + 1 :]
            yield pos, pos + len(body), body.decode("utf-8", errors="replace").split("\n")[:-1]
            pos += len(body)


def flat_yaml(text: str) -> dict:
    """`key: value` lines of a flat YAML file (Lightning hparams.yaml, MLflow meta.yaml).

    Nested blocks are kept as their raw text; values that read as numbers become numbers.
    """
    out: dict = {}
    key = None
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line[:1] in (" ", "-", "\t") and key is not None:
            out[key] = (str(out[key] or "") + "\n" + line).strip()
            continue
        k, sep, v = line.partition(":")
        if not sep:
            continue
        key = k.strip().strip("'\"")
        v = v.strip().strip("'\"")
        num = to_float(v) if v and not v.endswith("%") else None
        out[key] = (
            num
            if num is not None and v.lower() not in ("nan", "inf", "-inf")
            else (None if v in ("", "null", "~") else v)
        )
    return out


def list_ahead(items: Iterator) -> Iterator[tuple[object, bool]]:
    """(item, is_last) pairs, looking one item ahead."""
    it = iter(items)
    try:
        prev = next(it)
    except StopIteration:
        return
    for item in it:
        yield prev, False
        prev = item
    yield prev, True


class LineParser:
    """One file's reading state in a line format, carried between ingests in the file's state.

    The reader calls `feed` for every line (after advancing `line`, the 1-based line number),
    then `end_block` once per block of lines, which fills the batch's points.
    """

    def __init__(self, path: Path, ctx: ReadContext):
        self.path = path
        self.ctx = ctx
        self.line = ctx.state.get("line", 0)

    def feed(self, text: str, batch: Batch) -> None:
        raise NotImplementedError

    def end_block(self, batch: Batch, last: bool) -> None:
        """The block's lines are all fed; `last`: no more complete lines follow (for now)."""

    def state(self) -> dict:
        return {"line": self.line}


class LineIngestor(Ingestor):
    """A format read line by line, resuming at the last complete line (see `line_blocks`)."""

    appendable = True
    needs_head = True
    parser: ClassVar[type[LineParser]]

    def read(self, path: Path, start: int, ctx: ReadContext) -> Iterator[Batch]:
        parser = self.parser(path, ctx)
        for (b0, b1, lines), last in list_ahead(line_blocks(path, start)):
            batch = Batch(start=b0, end=b1)
            for text in lines:
                parser.line += 1
                parser.feed(text, batch)
            parser.end_block(batch, last)
            batch.state = parser.state()
            yield batch
