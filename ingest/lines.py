"""Line formats (JSON Lines, CSV, console text): whole lines only, `.gz` streamed, bounded
memory, and the shared reader (`LineIngestor` + a per-file `LineParser`); the safe JSON decode
every JSON reader uses.

Hostile input stays a per-line or per-file problem: a line longer than MAX_LINE_BYTES is skipped
and reported, a `.gz` stops at its decompressed-size cap, JSON nested past MAX_JSON_DEPTH or
not UTF-8 is a JsonError (a ValueError with `msg`, `lineno`, `colno` like json's own), and an
exception a parser raises for one line becomes a problem on that line.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import re
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv

from ingest.base import Batch, Ingestor, Problem, ReadContext
from workbench.store.points import Points

# a number as loggers print it, including nan/inf
NUM = r"(?:[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf|Infinity|NaN))"
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
BLOCK = 8 << 20
SETTLED_S = 60  # a file untouched this long is finished: its last line counts even without "\n"
MAX_LINE_BYTES = 16 << 20  # longer lines are skipped (a progress bar redrawn with \r is cut first)
GZ_MIN_CAP = 1 << 30  # a .gz may always expand to this many bytes ...
GZ_RATIO_CAP = 200  # ... or this many times its compressed size (bombs expand ~1000x)
MAX_JSON_DEPTH = 100  # real logs nest a few levels; deeper JSON is hostile
MAX_JSON_FILE_BYTES = 1 << 30  # whole-file JSON (trainer_state.json, arrays of records)
BOM = b"\xef\xbb\xbf"
INT64 = 1 << 63


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


def to_step(v) -> int | None:
    """A logged step as an int, or None when `v` is absent (None); raises ValueError, with a
    message for the problem row, when `v` is there but no step (NaN, Inf, 1e30, "12abc")."""
    if v is None:
        return None
    x = v if isinstance(v, int) and not isinstance(v, bool) else to_float(v)
    if x is None:
        raise ValueError(f"step {v!r} is not a number")
    if isinstance(x, float):
        if not math.isfinite(x):
            raise ValueError(f"step {v!r} is not a finite number")
        x = int(x)
    if not -INT64 <= x < INT64:
        raise ValueError(f"step {v!r} is outside the 64-bit range of steps")
    return x


def is_gz(path: Path) -> bool:
    return path.name.endswith(".gz")


def log_name(path: Path) -> str:
    """The file's name as its format names it: a `.gz` archive of `trainer_state.json` is one."""
    return path.name.removesuffix(".gz")


GZ_ERRORS = (OSError, EOFError, zlib.error)  # bad header, truncated stream, corrupt data


def read_head(path: Path, n: int) -> bytes:
    """The first `n` bytes of the file (decompressed for a `.gz`; empty for a damaged one)."""
    if is_gz(path):
        try:
            with gzip.open(path, "rb") as f:
                return f.read(n)
        except GZ_ERRORS:
            return b""
    with open(path, "rb") as f:
        return f.read(n)


def gz_damage(path: Path) -> str | None:
    """Why a `.gz` cannot be read from its start (not gzip, cut in its header), or None."""
    try:
        with gzip.open(path, "rb") as f:
            f.read(1)
    except GZ_ERRORS as e:
        return f"damaged .gz ({e or 'the file ends inside the compressed stream'}): not read"
    return None


def head_text(head: bytes) -> str:
    """The first bytes of a file as text: without a UTF-8 BOM; Latin-1 when not UTF-8 (a cut
    multi-byte character at the end of the head is dropped, not a reason to fall back)."""
    head = head.removeprefix(BOM)
    try:
        return head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start >= len(head) - 3 and e.reason == "unexpected end of data":
            return head[: e.start].decode("utf-8", errors="replace")
        return head.decode("latin-1")


def is_settled(path: Path, st: os.stat_result | None = None) -> bool:
    """Untouched for SETTLED_S seconds (`st`: its stat, if taken already): the writer is done
    (or gone). A `.gz` is a finished archive, never a growing log."""
    return is_gz(path) or time.time() - (st or path.stat()).st_mtime > SETTLED_S


@dataclass(frozen=True)
class LongLine:
    """Stands in a block's lines for a line longer than MAX_LINE_BYTES (skipped, reported)."""

    nbytes: int


def _decode(body: bytes) -> list:
    """Complete lines (each ending in \\n) as text: UTF-8, or Latin-1 for a line that is not;
    a line longer than MAX_LINE_BYTES as a LongLine."""
    if len(body) > MAX_LINE_BYTES:  # only a block that follows a long carry can hold one
        return [
            LongLine(len(b) + 1) if len(b) >= MAX_LINE_BYTES else _decode_line(b)
            for b in body.split(b"\n")[:-1]
        ]
    try:
        return body.decode("utf-8").split("\n")[:-1]
    except UnicodeDecodeError:
        return [_decode_line(b) for b in body.split(b"\n")[:-1]]


def _decode_line(b: bytes) -> str:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b.decode("latin-1")


def _cut_redraws(carry: bytes) -> bytes:
    """A line redrawn with \\r (a progress bar) as a terminal shows it: its last drawing."""
    k = carry.rstrip(b"\r").rfind(b"\r")
    return carry[k:] if k > 0 else carry


def line_blocks(path: Path, start: int) -> Iterator[tuple[int, int, list, tuple[str, str] | None]]:
    """Yield (start, end, lines, stop) for the complete lines after byte `start`, a block at a time.

    A trailing line without a newline is held back (the writer may be mid-line) unless the
    file has not changed for SETTLED_S seconds or is a `.gz`. A line longer than MAX_LINE_BYTES is a LongLine
    in `lines`. A `.gz` is streamed whole from 0 (offsets are compressed bytes); when it is
    damaged or expands past its cap, the lines before are kept and `stop` (kind, message) of the
    last block says why reading stopped.
    """
    settled = is_settled(path)
    with open(path, "rb") as raw:
        if is_gz(path):
            start = 0
            cap = max(GZ_MIN_CAP, GZ_RATIO_CAP * os.fstat(raw.fileno()).st_size)
            stream: io.BufferedIOBase = gzip.GzipFile(fileobj=raw, mode="rb")
        else:
            raw.seek(start)
            cap, stream = None, raw
        pos, carry, skipped, total = start, b"", -1, 0  # skipped >= 0: inside a long line
        while True:
            chunk, stop = _read_block(stream, cap is not None)
            total += len(chunk)
            if cap is not None and total > cap and stop is None:
                chunk = chunk[: len(chunk) - (total - cap)]
                stop = (
                    "gz_too_large",
                    f"decompressed size passed {cap >> 20} MiB ({GZ_RATIO_CAP}x the compressed size): "
                    "read up to there; a damaged file or a decompression bomb",
                )
            if start == 0 and total == len(chunk):
                chunk = chunk.removeprefix(BOM)
            last = not chunk or stop is not None
            lines: list = []
            if skipped >= 0:  # the rest of a long line: drop it up to its newline
                nl = chunk.find(b"\n")
                skipped += len(chunk) if nl < 0 else nl + 1
                if nl >= 0:
                    lines.append(LongLine(skipped))
                    skipped = -1
                chunk = b"" if nl < 0 else chunk[nl + 1 :]
            data = carry + chunk
            cut = data.rfind(b"\n")
            body, carry = (data[: cut + 1], data[cut + 1 :]) if cut >= 0 else (b"", data)
            lines += _decode(body)
            if len(carry) > MAX_LINE_BYTES:
                carry = _cut_redraws(carry)
                if len(carry) > MAX_LINE_BYTES:
                    skipped, carry = len(carry), b""
            held = len(carry) + max(skipped, 0)  # bytes of an unfinished last line
            if last and settled and held:
                if stop is None:  # a line cut by damage or the cap is not read
                    lines.append(_decode_line(carry) if carry else LongLine(skipped))
                held = 0
            end = raw.tell() if cap is not None else start + total - held
            if lines or stop:
                yield pos, end, lines, stop
                pos = end
            if last:
                return


def _read_block(stream, gz: bool) -> tuple[bytes, tuple[str, str] | None]:
    """Up to BLOCK bytes; for a `.gz`, what decompressed before damage, and the damage."""
    if not gz:
        return stream.read(BLOCK), None
    parts, n = [], 0
    try:
        while n < BLOCK:
            b = stream.read1(BLOCK - n)
            if not b:
                break
            parts.append(b)
            n += len(b)
    except GZ_ERRORS as e:
        why = "the file ends inside the compressed stream" if isinstance(e, EOFError) else str(e)
        return b"".join(parts), ("bad_gzip", f"damaged .gz ({why}): kept the lines before the damage")
    return b"".join(parts), None


# ---- JSON: one safe decode for every JSON reader ------------------------------------------
class JsonError(ValueError):
    """JSON that does not decode, with json's own `msg`, `lineno` and `colno`."""

    def __init__(self, msg: str, lineno: int = 1, colno: int = 1):
        super().__init__(f"{msg}: line {lineno} column {colno}")
        self.msg, self.lineno, self.colno = msg, lineno, colno


_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NESTING = np.zeros(256, np.int8)
_NESTING[[ord("["), ord("{")]] = 1
_NESTING[[ord("]"), ord("}")]] = -1


def json_depth(text: str) -> int:
    """How deeply JSON text nests arrays and objects (brackets inside strings do not count)."""
    b = np.frombuffer(_JSON_STRING.sub('""', text).encode("utf-8", "surrogatepass"), np.uint8)
    steps = _NESTING[b]
    steps = steps[steps != 0]
    return int(np.cumsum(steps, dtype=np.int64).max()) if len(steps) else 0


def loads_json(text: str | bytes):
    """json.loads for untrusted logs: bare NaN/Infinity kept (HF writes them); nesting bounded by
    MAX_JSON_DEPTH; bytes decoded as UTF-8 (a BOM allowed). Raises JsonError."""
    if isinstance(text, bytes):
        data = text.removeprefix(BOM)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            line = data.count(b"\n", 0, e.start) + 1
            raise JsonError(
                f"not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})", line
            ) from None
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and json_depth(text) > MAX_JSON_DEPTH:
        raise JsonError(f"nested more than {MAX_JSON_DEPTH} levels deep")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise JsonError(e.msg, e.lineno, e.colno) from None
    except RecursionError:
        raise JsonError(f"nested more than {MAX_JSON_DEPTH} levels deep") from None


def read_json_file(path: Path):
    """A whole JSON file (a `.gz` decompressed), at most MAX_JSON_FILE_BYTES. Raises JsonError."""
    size = path.stat().st_size
    if size > MAX_JSON_FILE_BYTES:
        raise JsonError(
            f"{size >> 20} MiB is more than a JSON log file holds ({MAX_JSON_FILE_BYTES >> 20} MiB)"
        )
    if not is_gz(path):
        return loads_json(path.read_bytes())
    try:
        with gzip.open(path, "rb") as f:
            data = f.read(MAX_JSON_FILE_BYTES + 1)
    except GZ_ERRORS as e:
        raise JsonError(f"damaged .gz ({e or 'the file ends inside the compressed stream'})") from None
    if len(data) > MAX_JSON_FILE_BYTES:
        raise JsonError(f"decompresses to more than {MAX_JSON_FILE_BYTES >> 20} MiB")
    return loads_json(data)


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


T = TypeVar("T")


def list_ahead(items: Iterator[T]) -> Iterator[tuple[T, bool]]:
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


FAST_MIN_LINES = 64  # below this, a vectorised block costs more than the line-by-line path


def csv_numbers(lines: list, ncols: int, quoted: bool = True) -> tuple[np.ndarray, np.ndarray] | None:
    """Comma-separated rows of `ncols` numbers read at once with pyarrow: (values, present), both
    [rows, ncols], an empty cell absent. None, for the line path to read them, when a cell is no
    number as pyarrow reads it (text, "100%", "NA"), a row has other cells, or the lines are
    few; `quoted=False`: a quote is no CSV quote but part of a cell (a reader that splits on
    commas). Callers drop the empty lines their line path skips."""
    if len(lines) < FAST_MIN_LINES or not all(type(t) is str for t in lines):
        return None
    data = "\n".join(lines).encode()
    names = [f"c{i}" for i in range(ncols)]
    try:
        table = pa_csv.read_csv(
            io.BytesIO(data),
            read_options=pa_csv.ReadOptions(column_names=names, use_threads=False, block_size=len(data) + 1),
            parse_options=pa_csv.ParseOptions(quote_char='"' if quoted else False),
            convert_options=pa_csv.ConvertOptions(
                column_types=dict.fromkeys(names, pa.float64()),
                null_values=[""],
                quoted_strings_can_be_null=False,
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if table.num_rows != len(lines):  # a line pyarrow split in two (a bare carriage return)
        return None
    values = np.empty((table.num_rows, ncols))
    present = np.empty((table.num_rows, ncols), bool)
    for i, col in enumerate(table.columns):
        present[:, i] = col.is_valid().to_numpy(zero_copy_only=False)
        values[:, i] = col.to_numpy(zero_copy_only=False)
    return values, present


def row_points(names: list[str], steps: np.ndarray, values: np.ndarray, present: np.ndarray) -> Points:
    """Points of rows of cells (record-major, as a line reader adds them), the absent left out."""
    keep = present.any(axis=0)
    names = [n for n, k in zip(names, np.asarray(keep), strict=True) if k]
    values, present = values[:, keep], present[:, keep]
    n, m = values.shape
    mask = present.ravel()
    return Points(
        names,
        np.tile(np.arange(m, dtype=np.int32), n)[mask],
        np.repeat(steps, m)[mask],
        np.full(int(mask.sum()), np.nan),
        values.ravel()[mask],
    )


def whole_steps(x: np.ndarray) -> np.ndarray | None:
    """Cells that are steps as `int(to_float(cell))` makes them (truncated), or None when one
    cannot be (NaN, Inf, beyond 64 bits): the line path reports those."""
    if not np.isfinite(x).all() or (np.abs(x) >= 2.0**63).any():
        return None
    return x.astype(np.int64)


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

    def feed_block(self, lines: list, batch: Batch) -> bool:
        """Take a whole block of lines at once (a vectorised reader), or return False, having
        changed nothing, to have them fed line by line (the block holds a line it cannot take)."""
        return False

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
        blocks = 0
        for (b0, b1, lines, stop), last in list_ahead(line_blocks(path, start)):
            blocks += 1
            batch = Batch(start=b0, end=b1)
            refused = []  # lines the reader never saw, or that raised in it
            if parser.feed_block(lines, batch):
                parser.line += len(lines)
                lines = []
            for text in lines:
                parser.line += 1
                if isinstance(text, LongLine):
                    why = f"{text.nbytes:,} bytes, more than {MAX_LINE_BYTES >> 20} MiB; line skipped"
                    refused.append(Problem(parser.line, "line_too_long", f"line {parser.line}: {why}"))
                    continue
                try:
                    parser.feed(text, batch)
                except Exception as e:  # noqa: BLE001 - one odd line never costs the rest of its file
                    refused.append(_line_problem(parser.line, e))
            parser.end_block(batch, last)
            if stop:
                refused.append(Problem(parser.line, stop[0], f"after line {parser.line}: {stop[1]}"))
            batch.problems = sorted(batch.problems + refused, key=lambda p: p.offset)
            batch.state = parser.state()
            yield batch
        if not blocks:  # no new line: what the parser held for the end of the log (a settled log)
            batch = Batch(start=start, end=start)
            parser.end_block(batch, True)
            if len(batch.points) or batch.events or batch.problems or batch.evidence:
                batch.state = parser.state()
                yield batch


def _line_problem(line: int, e: Exception) -> Problem:
    """A problem row for a line its parser refused: a ValueError says why in words; anything
    else is a reader bug, named so that it can be reported."""
    why = str(e) if type(e) is ValueError or isinstance(e, JsonError) else f"{type(e).__name__}: {e}"
    return Problem(line, "bad_record", f"line {line}: {why}; line skipped")
