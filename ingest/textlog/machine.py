"""The text-log state machine: where each value of a console line lands.

Dialects (`ingest/textlog/<dialect>.py`) say what a line holds; this module decides the step it
belongs to, its wall time, what waits for a later line, the run's events and how it ended:
- Each line is cleaned as a terminal shows it (text after the last `\\r`, no ANSI codes) and
  patterns are *searched*, because tqdm bars are glued to the front of records.
- The current step is the last step a line stated; lines with no step take it; before any step
  their values are counted and skipped, except where a dialect counts steps itself.
- What belongs to the step in progress but arrives before it is stated (DeepSpeed's OVERFLOW
  notices and ZeRO/micro-step timers) waits for the next line that states a step; when the log
  is finished it goes to the last step seen. DeepSpeed's engine-start `step=0` report is held
  until we know whether a checkpoint load follows it (then it described the engine before the
  load and is dropped).
- Lines with a timestamp prefix (`[YYYY-MM-DD HH:MM:SS,mmm]` of DeepSpeed, fairseq's and
  loguru's, Megatron's `[YYYY-MM-DD HH:MM:SS]`) give their points a wall time (read as local
  time); the file's first timestamp orders it among the run's other files.
- A line is offered to the dialects in the order of `DIALECTS` (`ingest/textlog/ingestor.py`),
  slot by slot: the first dialect that reads it as `values` wins, then the same for `notice`
  and `event`; a dialect's open multi-line `block` takes its lines before anything else.
The parser state (current step, pending notices, line number) is kept per file between ingests,
so a growing log is read from where the last ingest stopped.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import ClassVar

from ingest.base import Batch, Evidence, Problem, ReadContext, event
from ingest.lines import LineParser, is_settled, strip_line, to_float
from workbench.store.points import PointsBuilder

LINE_TIME = re.compile(r"^\[?(?:[A-Z]+\|)?(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:[,.](\d{1,6}))?")
ENDINGS = ("min_loss_scale", "crash", "oom", "finished")  # event kinds that say how a run ended

# a dialect's reading of one line: the kind of record it found (counted in the file's
# contents), or None when the line is not one of its own
Handler = Callable[["TextParser", str], str | None]


@dataclass(frozen=True)
class Dialect:
    """One family of console lines: how to tell a file of it, and how to read its lines.

    `sniff`: patterns one of which some line near the top of its files matches (the text-log
    reader claims such a file). `triggers`: regex alternatives one of which every line it reads
    contains (a line with none of any dialect's is skipped in one search; keep them literal
    words: one anchored or patterned alternative makes that search of every line slower). A
    line shaped like no word at all (indented metrics) is a `block`. The handlers get the
    parser and the cleaned line: `values` reads logged values (most state a step), `notice` a
    line that waits for the step in progress, `event` a line about the run (a checkpoint, a
    crash, its configuration); `block` continues a multi-line block the dialect opened and
    returns True when it took the line whole."""

    name: str
    sniff: tuple[re.Pattern, ...] = ()
    triggers: tuple[str, ...] = ()
    values: Handler | None = None
    notice: Handler | None = None
    event: Handler | None = None
    block: Callable[[TextParser, str], bool] | None = None


@dataclass(frozen=True)
class _Slots:
    """The dialects' handlers, slot by slot, in the dialects' order."""

    blocks: tuple
    values: tuple
    notices: tuple
    events: tuple
    trigger: re.Pattern


@functools.cache
def _slots(dialects: tuple[Dialect, ...]) -> _Slots:
    triggers = dict.fromkeys(t for d in dialects for t in d.triggers)
    return _Slots(
        tuple(d.block for d in dialects if d.block),
        tuple(d.values for d in dialects if d.values),
        tuple(d.notice for d in dialects if d.notice),
        tuple(d.event for d in dialects if d.event),
        re.compile("|".join(triggers)),
    )


@functools.lru_cache(maxsize=4096)
def _epoch_seconds(day: str, clock: str) -> float:
    return datetime.strptime(f"{day} {clock}", "%Y-%m-%d %H:%M:%S").timestamp()


def line_time(line: str) -> float | None:
    """The wall time of a line with a timestamp prefix (local time), else None."""
    if not (line[:1].isdigit() or line[:1] == "[") or not (m := LINE_TIME.match(line)):
        return None
    frac = float("0." + m[3]) if m[3] else 0.0
    return _epoch_seconds(m[1], m[2]) + frac


class TextParser(LineParser):
    """Per-file parser state; `feed` one line at a time. A subclass names its `dialects`."""

    dialects: ClassVar[tuple[Dialect, ...]] = ()

    def __init__(self, path: Path, ctx: ReadContext):
        super().__init__(path, ctx)
        self.slots = _slots(self.dialects)
        state = ctx.state
        self.step = state.get("step")
        self.no_step = state.get("no_step", 0)
        self.pending = state.get("pending", [])  # overflow notices waiting for their step
        # [tag, value, wall]: timers waiting for their step
        self.pending_values = state.get("pending_values", [])
        self.explicit = state.get("explicit", False)  # a progress line stated a step (not the init report)
        # the engine-start `step=0` report, kept until we know
        self.init_values = state.get("init_values", [])
        self.timer_step = state.get("timer_step")  # the step DeepSpeed's global timer lines count
        self.awaiting_global = state.get("awaiting_global", False)
        self.timer_rank = state.get("timer_rank")
        self.counted = state.get("counted", 0)  # HF dicts placed by counting
        self.timers_counted = state.get("timers_counted", False)  # steps counted from global timer lines
        self.logging_steps = logging_steps(ctx.run_config)
        self.wall = float("nan")  # of the line being read
        self.first_wall = state.get("first_wall")
        self.builder = PointsBuilder()
        self.events: list[dict] = []
        self.problems: list[Problem] = []
        self.config: dict = {}
        self.records = 0
        self.flops: dict | None = None  # a DeepSpeed flops profile being read
        self.last_crash: dict | None = None  # a traceback being read: its exception names the crash
        self.kinds: dict[str, int] = {}  # records parsed, by kind (kept in the file's contents)
        self.no_step_reported = self.no_step
        self.placed = state.get("placed", 0)  # points stored from this file so far
        self.marks: dict = state.get("marks", {})  # what a dialect keeps between lines (JSON values)
        self.last_load = state.get("last_load")  # [checkpoint, step] of the last checkpoint load

    def state(self) -> dict:
        return {
            "step": self.step,
            "line": self.line,
            "no_step": self.no_step,
            "pending": self.pending,
            "pending_values": self.pending_values,
            "explicit": self.explicit,
            "init_values": self.init_values,
            "timer_step": self.timer_step,
            "awaiting_global": self.awaiting_global,
            "timer_rank": self.timer_rank,
            "counted": self.counted,
            "timers_counted": self.timers_counted,
            "placed": self.placed,
            "first_wall": self.first_wall,
            "marks": self.marks,
            "last_load": self.last_load,
        }

    # ---- placing values and events ---------------------------------------------------------
    def point(
        self, tag: str, value: float | None, step: int | None = None, wall: float | None = None
    ) -> None:
        step = self.step if step is None else step
        if value is None:
            return
        if step is None:
            self.no_step += 1
            return
        self.builder.add(tag, step, value, self.wall if wall is None else wall)

    def add_event(self, step: int | None, kind: str, message: str, attrs: dict | None = None) -> dict:
        """An event of the line being read; returned, so a later line can complete it."""
        e = event(step, self.wall, kind, message, attrs or {}, self.line)
        self.events.append(e)
        return e

    def line_wall(self, wall: float | None) -> None:
        """The wall time of the line being read, from a timestamp a dialect found inside it."""
        if wall is not None:
            self.wall = wall
            if self.first_wall is None:
                self.first_wall = wall

    def wait_for_step(self, message: str, attrs: dict) -> None:
        """A notice of the step in progress: it is placed when the next line states a step."""
        self.pending.append(
            {"message": message, "attrs": attrs, "line": self.line, "wall": _finite(self.wall)}
        )

    def at_step(self, step: int) -> None:
        """A line stated the step in progress: place what was waiting for it."""
        self.step = step
        self._release_init()
        for p in self.pending:
            self.events.append(event(step, p.get("wall"), "overflow", p["message"], p["attrs"], p["line"]))
            if p["attrs"].get("new_scale") is not None:
                self.point("derived/loss_scale", p["attrs"]["new_scale"], step, p.get("wall"))
        self.pending = []
        self._place_values(step)

    def _place_values(self, step: int | None) -> None:
        for tag, value, wall in self.pending_values:
            self.point(tag, value, step, float("nan") if wall is None else wall)
        self.pending_values = []

    def _release_init(self) -> None:
        """The engine-start report is step 0 of a fresh run (no checkpoint was loaded after it)."""
        for tag, value, wall in self.init_values:
            self.point(tag, value, 0, float("nan") if wall is None else wall)
        self.init_values = []

    def checkpoint_loaded(self, step: int | None) -> None:
        """A checkpoint load after DeepSpeed's engine-start report: the report described the
        engine before this load, and the timers count on from the loaded step."""
        if not self.explicit and self.timer_step is not None:
            self.init_values = []
            if step is not None:
                self.timer_step, self.awaiting_global = step, False

    def place_pending_at_end(self) -> None:
        """The log is finished: what still waits for a step belongs to the last step seen."""
        last = self.step if self.timer_step is None else max(self.step or 0, self.timer_step)
        for p in self.pending:
            attrs = {**p["attrs"], "step_placed": "last step before the notice (no later step line came)"}
            self.events.append(event(last, p.get("wall"), "overflow", p["message"], attrs, p["line"]))
            if p["attrs"].get("new_scale") is not None and last is not None:
                self.point("derived/loss_scale", p["attrs"]["new_scale"], last, p.get("wall"))
        self.pending = []
        self._release_init()
        self._place_values(last)

    # ---- a block of lines --------------------------------------------------------------------
    def end_block(self, batch: Batch, last: bool) -> None:
        if last and (self.pending or self.pending_values or self.init_values) and is_settled(self.path):
            self.place_pending_at_end()
        batch.first_wall_time = self.first_wall
        batch.points = self.builder.take()
        batch.events, self.events = self.events, []
        batch.problems, self.problems = self.problems, []
        batch.config, self.config = self.config, {}
        batch.records, self.records = self.records, 0
        batch.evidence = [_evidence(e) for e in batch.events if e["kind"] in ENDINGS]
        batch.note = self._note()
        batch.counts, self.kinds = self.kinds, {}
        if self.no_step > self.no_step_reported:
            batch.counts["values_before_first_step"] = self.no_step - self.no_step_reported
            self.no_step_reported = self.no_step
        self.placed += len(batch.points)
        if last and self.no_step and not self.placed and is_settled(self.path):
            # a log full of values and no step to put them on: say so, never store silently nothing
            batch.problems.append(
                Problem(
                    self.line,
                    "no_step",
                    f"{self.no_step} values in this log but no line states or counts a step; none stored "
                    "(a step per line, DeepSpeed's step= lines or its timers, or HF dicts are needed)",
                )
            )

    def _note(self) -> str | None:
        """What the reader assumed in placing this file's values (the file's note)."""
        if self.pending:
            return f"{len(self.pending)} OVERFLOW notices wait for the next line that states a step"
        if self.counted and not self.explicit:
            per = (
                f"x logging_steps {self.logging_steps}"
                if self.logging_steps
                else "(logging_steps unknown: step = count)"
            )
            return f"no line states a step: {self.counted} console dicts placed by counting {per}"
        if self.timers_counted:
            return "no line states a step: steps counted from DeepSpeed's global timer lines"
        return None

    def feed(self, raw: str, batch: Batch) -> None:
        line = strip_line(raw)
        if not line.strip():
            return
        wall = line_time(line)
        self.wall = float("nan") if wall is None else wall
        if wall is not None and self.first_wall is None:
            self.first_wall = wall
        slots = self.slots
        for block in slots.blocks:
            if block(self, line):
                return
        if not slots.trigger.search(line):
            return
        for handlers in (slots.values, slots.notices, slots.events):
            for handle in handlers:
                if kind := handle(self, line):
                    self.records += 1
                    self.kinds[kind] = self.kinds.get(kind, 0) + 1
                    break


def _evidence(e: dict) -> Evidence:
    """How a run ended: a min-loss-scale exit, a traceback, an out-of-memory line, or a clean end
    (the launcher's `exits successfully`, HF's final summary)."""
    step, wall = e["step"], e["wall_time"]
    if e["kind"] == "finished":
        return Evidence("completed", f"the log says it finished: {e['message']}", step, None, wall)
    if e["kind"] == "min_loss_scale":
        where = "?" if step is None else step
        message = f"loss scale hit its minimum (DeepSpeed exit) at step {where}"
        return Evidence("diverged", message, step, "fp16_overflow", wall)
    return Evidence("crashed", f"crash in the log: {e['message']}", step, e["kind"], wall)


def _finite(x: float) -> float | None:
    return None if x != x else x


def logging_steps(run_config: dict) -> int | None:
    """The HF Trainer's logging_steps, when the run's trainer_state.json has been read."""
    value = to_float((run_config.get("trainer_state") or {}).get("logging_steps"))
    return int(value) if value and value >= 1 else None
