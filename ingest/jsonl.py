"""JSON Lines metric logs (and JSON arrays of records).

One object per line: the step comes from the first key found in STEP_KEYS (the file's note
names it when it is not `step`), nested objects are
flattened with `/`, numbers given as strings ("0.00", "100%") are numbers, bare NaN/Infinity are
kept. Covers plain PyTorch loops, LLaMA-Factory's `trainer_log.jsonl` (`current_steps`), old
fairseq `--log-format json` lines (`num_updates`; validation records carry no step and take
the last one seen). A record without a step takes the last step seen earlier in the file; with
none seen yet it is counted and skipped. A `.json` file (one document, not lines) is a log only
when its first record carries a step: model, tokenizer and adapter configs sit beside logs in
real run folders and are skipped.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from ingest.base import Batch, Problem, ReadContext
from ingest.lines import (
    FAST_MIN_LINES,
    JsonError,
    LineIngestor,
    LineParser,
    head_text,
    loads_json,
    read_head,
    read_json_file,
    to_float,
    to_step,
)
from workbench.store.points import Points, PointsBuilder

STEP_KEYS = (
    "step",
    "global_step",
    "iteration",
    "iter",
    "it",
    "_step",
    "num_updates",
    "current_steps",
    "trainer/global_step",
    "update",
    "updates",
    "train/step",
    "batch",  # last: Keras counts batches within an epoch; custom loops log a global batch count
)
TIME_KEYS = ("wall_time", "_timestamp", "timestamp", "time")
NOT_METRICS = {"total_steps"}  # progress bookkeeping that would only clutter the tag list
HF_SPECIAL = ("trainer_state.json", "_results.json", "ds_config")
# JSON files that sit beside logs in real run folders and are no metrics log
NOT_LOGS = {
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "adapter_config.json",
    "preprocessor_config.json",
    "metadata.json",
    "pruned_blobs.json",
}


def flatten(obj: dict, prefix: str = "") -> Iterator[tuple[str, object]]:
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            yield from flatten(v, key + "/")
        else:
            yield key, v


def wall_time_of(record: dict) -> float | None:
    for k in TIME_KEYS:
        v = to_float(record.get(k))
        if v is not None and v > 1e9:
            return v / 1000.0 if v > 1e12 else v
    return None


def whole_step(v) -> int | None:
    """`to_step`, refusing a fractional step (1.5): cut to a whole one it would fall on another
    record's step and replace its points."""
    step = to_step(v)
    x = to_float(v) if step is not None and not isinstance(v, int) else None
    if x is not None and x != step:
        raise ValueError(f"step {v!r} is not a whole number (steps count updates)")
    return step


class RecordsToPoints:
    """Turns step-keyed records into Points, tracking the last step seen across batches."""

    def __init__(self, state: dict):
        self.last_step = state.get("last_step")
        self.no_step = state.get("no_step", 0)
        self.step_keys: list[str] = state.get("step_keys", [])  # the keys steps were taken from
        self.builder = PointsBuilder()

    def add(self, record: dict, step=None, wall=None, skip=()) -> bool:
        """Add one record's numeric fields; False when it has no step (counted)."""
        bad = None  # a step key whose value is no step (NaN, "12abc"): an error unless another key has one
        if step is None:
            for k in STEP_KEYS:
                try:
                    step = whole_step(record.get(k))
                except ValueError as e:
                    bad = bad or e
                    continue
                if step is not None:
                    skip = (*skip, k)
                    self.took(k)
                    break
        if step is None and bad is not None:
            raise bad
        if step is None:
            step = self.last_step
        if step is None:
            self.no_step += 1
            return False
        self.last_step = step
        wall = wall_time_of(record) if wall is None else wall
        for key, v in flatten(record):
            if key in skip or key in TIME_KEYS or key in NOT_METRICS:
                continue
            x = to_float(v)
            if x is None:
                continue
            self.builder.add(key, step, x, np.nan if wall is None else wall)
        return True

    def took(self, key: str) -> None:
        if key not in self.step_keys:
            self.step_keys.append(key)

    def points(self) -> Points:
        return self.builder.take()

    def note(self) -> str | None:
        """Which keys gave the steps (when not `step`), and what had no step."""
        notes = []
        if self.step_keys and self.step_keys != ["step"]:
            notes.append("step from " + ", ".join(f"`{k}`" for k in self.step_keys))
        if self.no_step:
            notes.append(
                f"{self.no_step} records before the first step were skipped (no step to place them at)"
            )
        return "; ".join(notes) or None

    def state(self) -> dict:
        return {"last_step": self.last_step, "no_step": self.no_step, "step_keys": self.step_keys}


_DIGITS = r"(?i)[0-9]|nan|inf"  # a string that may be a number as `to_float` reads it


DENSE_CELLS = 1 << 20  # a block's table may hold this many cells whatever its points


def _wide(lines: list[str], n: int) -> bool:
    """Whether the block's records name so many different keys that its table (a column per
    key, a row per record) would hold far more cells than points: a tag explosion (new keys in
    every record), which the line path reads point by point. Judged on two samples of lines:
    the keys of the second the first has not seen tell how fast keys keep coming."""
    stride = max(2, len(lines) // 16)
    try:
        seen = [_keys(t) for t in lines[::stride][:16]]
        held_out = [_keys(t) for t in lines[stride // 2 :: stride][:16]]
    except JsonError:
        return False  # the block parse refuses it
    union = set().union(*seen)
    pairs = sum(map(len, seen + held_out)) / max(1, len(seen) + len(held_out))
    new = sum(len(k - union) for k in held_out) / max(1, len(held_out))  # unseen keys per record
    cells = n * (len(union) + new * n)
    return cells > max(DENSE_CELLS, 8 * n * pairs)


def _keys(line: str) -> set[str]:
    rec = loads_json(line) if line.strip() else {}
    return set(rec) if isinstance(rec, dict) else set()


def _numeric(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind)


def _floats(col: pa.ChunkedArray) -> np.ndarray:
    """A numeric column as float64, null as NaN."""
    return col.cast(pa.float64()).to_numpy()


def block_points(lines: list) -> tuple[Points, int, str, int] | None:
    """A block of flat JSON records with an integer step in every record, read at once with
    pyarrow: its points (in logged order, as `RecordsToPoints.add` would give them), its last
    step, the key the steps came from and its records; None for a block this cannot take as the
    line path would (nested objects, numbers in strings, bare NaN, a record without a step,
    anything not JSON), read line by line instead."""
    if len(lines) < FAST_MIN_LINES or set(map(type, lines)) != {str}:  # (a LongLine is no str)
        return None
    blank = "" in map(str.strip, lines)
    text = "\n".join(t for t in lines if t.strip()) if blank else "\n".join(lines)
    n = text.count("\n") + 1
    if text.count("{") != n:  # one flat object a line, nothing nested
        return None
    if "NaN" in text or "Infinity" in text:  # bare non-finite numbers: the line path's business
        return None
    if _wide(lines, n):
        return None
    data = text.encode()
    try:  # one block: types inferred from every record; pyarrow's reader is the faster here
        opts = pa_json.ReadOptions(use_threads=False, block_size=len(data) + 1)
        table = pa_json.read_json(io.BytesIO(data), read_options=opts)
    except Exception:  # noqa: BLE001 - anything pyarrow refuses goes the line-by-line way
        return None
    cols = dict(zip(table.column_names, table.columns, strict=True))
    if table.num_rows != n or len(cols) != table.num_columns:  # (a key twice in a record)
        return None
    step_key = next((k for k in STEP_KEYS if k in cols), None)
    if step_key is None or not pa.types.is_integer(cols[step_key].type) or cols[step_key].null_count:
        return None
    if any(k in cols for k in STEP_KEYS[: STEP_KEYS.index(step_key)]):
        return None  # an earlier step key present in some records only
    wall = np.full(n, np.nan)
    unset = np.ones(n, bool)
    names, values, valid = [], [], []
    for name, col in cols.items():
        kind = col.type
        if pa.types.is_string(kind):
            if pc.any(pc.match_substring_regex(col, _DIGITS)).as_py():
                return None
            continue
        if not (_numeric(kind) or pa.types.is_boolean(kind) or pa.types.is_null(kind)):
            return None  # objects, lists, timestamps: the line path flattens, skips or reads them
        if not _numeric(kind) or name == step_key or name in NOT_METRICS or name in TIME_KEYS:
            continue
        x = _floats(col)
        ok = ~np.isnan(x)  # JSON has no NaN (the scan above sent bare NaN away): NaN here is null
        if ok.any():
            names.append(name)
            values.append(x)
            valid.append(ok)
    for name in (k for k in TIME_KEYS if k in cols and _numeric(cols[k].type)):
        x = _floats(cols[name])  # a record's first time key above 1e9
        take = unset & (x > 1e9)
        wall[take] = np.where(x[take] > 1e12, x[take] / 1000.0, x[take])
        unset &= ~take
    try:
        step = cols[step_key].cast(pa.int64()).to_numpy()
    except pa.ArrowInvalid:  # a step past int64: the line path says so
        return None
    if not names:
        return Points.empty(), int(step[-1]), step_key, n
    m = len(names)
    mask = np.stack(valid, axis=1).ravel()  # record-major: the order the records logged them
    return (
        Points(
            names,
            np.tile(np.arange(m, dtype=np.int32), n)[mask],
            np.repeat(step, m)[mask],
            np.repeat(wall, m)[mask],
            np.stack(values, axis=1).ravel()[mask],
        ),
        int(step[-1]),
        step_key,
        n,
    )


class _JsonLinesParser(LineParser):
    def __init__(self, path: Path, ctx: ReadContext):
        super().__init__(path, ctx)
        self.conv = RecordsToPoints(ctx.state)
        self.fast: list[Points] = []

    def feed_block(self, lines: list, batch: Batch) -> bool:
        got = block_points(lines)
        if got is None:
            return False
        points, last, key, records = got
        self.fast.append(points)
        self.conv.last_step = last
        self.conv.took(key)
        batch.records += records
        return True

    def feed(self, text: str, batch: Batch) -> None:
        text = text.strip()
        if not text:
            return
        try:
            rec = loads_json(text)
        except JsonError as e:
            why = f"not JSON ({e.msg} at column {e.colno}); line skipped"
            batch.problems.append(Problem(self.line, "bad_json", f"line {self.line}: {why}"))
            return
        if not isinstance(rec, dict):
            why = f"a JSON {type(rec).__name__}, not an object; skipped"
            batch.problems.append(Problem(self.line, "bad_json", f"line {self.line}: {why}"))
            return
        batch.records += 1
        self.conv.add(rec)

    def end_block(self, batch: Batch, last: bool) -> None:
        batch.points = Points.concat([*self.fast, self.conv.points()]) if self.fast else self.conv.points()
        self.fast = []
        batch.note = self.conv.note()

    def state(self) -> dict:
        return {**self.conv.state(), "line": self.line}


class JsonLinesIngestor(LineIngestor):
    name = "jsonl"
    precedence = 20
    parser = _JsonLinesParser

    def sniff(self, path: Path, head: bytes) -> bool:
        name = path.name.lower()
        if any(s in name for s in HF_SPECIAL) or not (".json" in name or name.endswith((".log", ".txt"))):
            return False
        if name.removesuffix(".gz") in NOT_LOGS:
            return False
        text = head_text(read_head(path, 4096) if path.name.endswith(".gz") else head).lstrip()
        first = text[:1]
        whole_json = name.endswith((".json", ".json.gz"))  # one document: a log only if it has steps
        if first == "[":
            return whole_json and any(f'"{k}"' in text for k in STEP_KEYS)
        if first != "{":
            return False
        line = text.split("\n", 1)[0]
        try:
            rec = loads_json(line)
        except JsonError:
            return len(line) >= len(text) - 1  # a first line longer than the head
        if not isinstance(rec, dict) or not any(to_float(v) is not None for _, v in flatten(rec)):
            return False
        return not whole_json or any(k in rec for k in STEP_KEYS)

    def read(self, path: Path, start: int, ctx: ReadContext) -> Iterator[Batch]:
        if head_text(read_head(path, 64)).lstrip()[:1] == "[":
            yield from self._read_array(path)
        else:
            yield from super().read(path, start, ctx)

    def _read_array(self, path: Path) -> Iterator[Batch]:
        batch = Batch(start=0, end=path.stat().st_size)
        try:
            records = read_json_file(path)
        except JsonError as e:
            batch.problems.append(
                Problem(e.lineno, "bad_json", f"line {e.lineno} column {e.colno}: {e.msg}; file skipped")
            )
            yield batch
            return
        conv = RecordsToPoints({})
        for i, rec in enumerate(records if isinstance(records, list) else []):
            if isinstance(rec, dict):
                batch.records += 1
                try:
                    conv.add(rec)
                except ValueError as e:
                    batch.problems.append(Problem(0, "bad_record", f"record [{i}]: {e}; skipped"))
        batch.points = conv.points()
        batch.note = conv.note()
        yield batch
