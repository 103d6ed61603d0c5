"""Live evaluation: rules over runs that are still being written, a few new steps at a time,
raising exactly the alerts a replay over the finished logs raises.

A rule's condition at a step depends on a bounded stretch of each series it reads (its longest
window) and on small states carried from everything before: ema and max_first seeds, and the
streak state of the alert interval (run length, latest alert, rows seen for warm-up). So per
run the evaluator keeps, for every tag, the current points not yet evaluated by every rule plus
the last C evaluated ones (C: the longest window of the rules that read the tag, plus one), the
seeds of the points it let go, and per rule and unit the streak state; each poll evaluates the
engine (`detectors.engine`, the code a replay runs) over those points and keeps the rows after
the rule's frontier. Nothing per poll grows with the length of the run.

A step is evaluated once it is final: every tag the rule read has, from every source that logs
it, a point at that step or later (a series logged by two writers waits for the slower one;
a sparse series, e.g. eval loss, holds back the rules that read it until its next point), or
the run is finished. Data that arrives for a step already evaluated (a resumed writer logging
step 100 again, a rotated or rewritten file, a name that now resolves to another tag) makes
`add` answer False: the caller reloads the run's current points from the store and the run is
evaluated again from its start (`reset`); alerts found again keep the time they were raised,
those on superseded steps are withdrawn.

Code detectors declare nothing: the ones whose state is bounded are listed in `_code_context`;
any other keeps its run whole in memory (its cost per poll grows with the run).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import polars as pl

from detectors.builtins.gradients import ClipSaturation, GradientFlow
from detectors.builtins.nonfinite import LossScaleCollapse
from detectors.compiler import rule_conditions
from detectors.language import Binary, Call, Name, Unary
from detectors.rules import Rule
from detectors.series import UNIT, ReplayError, SeriesData
from detectors.streaks import STREAK_STATE, stream_alerts
from detectors.windows import SEEDED, fold_seed
from workbench.store import schema

INF = math.inf
NEW_POINTS = {"tag": pl.String, "metric": pl.String, "step": pl.Int64, "value": pl.Float64, "rank": pl.Int64}
NEW_EVENTS = {"step": pl.Int64, "kind": pl.String, "attrs": pl.String, "source": pl.String}
_TAIL = {**NEW_POINTS, "i": pl.Int64}  # i: index of the point in its tag's current series


# ---- what a rule needs from the past -------------------------------------------------------------
def _calls(node) -> list[Call]:
    if isinstance(node, Call):
        return [node, *(c for a in node.args for c in _calls(a))]
    if isinstance(node, Binary):
        return _calls(node.left) + _calls(node.right)
    if isinstance(node, Unary):
        return _calls(node.arg)
    return []


def context(rule: Rule) -> int | None:
    """Logged points of each series before a step that its condition can depend on (beyond the
    carried seeds); None when unbounded."""
    if rule.when is None:
        return _code_context(rule.detector)[0]
    windows = [int(c.args[1].value) for c in _calls(rule.ast()) if len(c.args) == 2 and c.fn not in SEEDED]
    return max(windows, default=0) + 1  # +1: the point a later step takes as-of


def event_context(rule: Rule) -> int | None:
    """Steps of events before a step that the condition can depend on; None when unbounded."""
    return 0 if rule.when is not None else _code_context(rule.detector)[1]


def _code_context(d) -> tuple[int | None, int | None]:
    """(points, event steps) for the built-ins computed in code whose state is bounded."""
    if isinstance(d, GradientFlow):
        return 1, 0
    if isinstance(d, ClipSaturation):  # the share over a window against the window before it
        return 2 * d.window, 0
    if isinstance(d, LossScaleCollapse):
        return 0, d.window + 1
    return None, None  # Plateau (best so far), spikes whose baseline skips flagged points, ...


def _seeded_leaves(rule: Rule) -> list[Call]:
    if rule.when is None:
        return []
    return [c for c in _calls(rule.ast()) if c.fn in SEEDED]


# ---- per run state ----------------------------------------------------------------------------
@dataclass
class Alert:
    row: dict  # the ALERT columns
    raised_at: float


@dataclass
class RunState:
    tail: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=_TAIL))
    start: dict[str, int] = field(default_factory=dict)  # tag -> first index bounded rules see
    counts: dict[str, int] = field(default_factory=dict)  # tag -> current points in the whole run
    seen: dict[tuple[str, int], int] = field(default_factory=dict)  # (tag, rank) -> latest step
    events: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=NEW_EVENTS))
    ev_seen: dict[str, int] = field(default_factory=dict)  # source -> latest step of its events
    src_seen: dict[str, int] = field(default_factory=dict)  # source -> latest step of anything
    final: bool = False
    frontier: dict[str, float] = field(default_factory=dict)  # rule -> last step evaluated
    reads: dict[str, tuple[frozenset, bool]] = field(default_factory=dict)  # rule -> (tags, events)
    streaks: dict[tuple[str, str], dict] = field(default_factory=dict)  # (rule, tag) -> STREAK_STATE
    seeds: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)  # leaf -> tag -> seed
    alerts: dict[str, list[Alert]] = field(default_factory=dict)  # rule -> alerts, in order
    prior: dict[str, list[Alert]] = field(default_factory=dict)  # before a re-evaluation
    trimmed: bool = False
    idle: dict[str, int] = field(default_factory=dict)  # rule -> tags known when it was not evaluable

    def watermark(self, tag: str) -> float:
        steps = [s for (t, _), s in self.seen.items() if t == tag]
        return min(steps) if steps else -INF

    def events_watermark(self) -> float:
        # events of a source are complete below the latest step that source logged anything at
        steps = [self.src_seen[s] - 1 for s in self.ev_seen]
        return min(steps) if steps else INF


@dataclass
class Update:
    """What one evaluation changed: alerts raised (dicts with ALERTS columns), extended, withdrawn."""

    raised: list[dict] = field(default_factory=list)
    extended: list[dict] = field(default_factory=list)
    withdrawn: list[dict] = field(default_factory=list)
    changed: set[tuple[str, str]] = field(default_factory=set)  # (run, rule) whose alerts changed


def _view(tail: pl.DataFrame, start: dict[str, int], whole: set[str]) -> pl.DataFrame:
    """The points of each tag from its `start` on (all of them for the tags in `whole`)."""
    if not start:
        return tail
    lim = pl.DataFrame(
        {"tag": list(start), "s": [0 if t in whole else s for t, s in start.items()]},
        schema={"tag": pl.String, "s": pl.Int64},
    )
    return tail.join(lim, on="tag", how="left").filter(pl.col("i") >= pl.col("s").fill_null(0)).drop("s")


class _Recording(SeriesData):
    """SeriesData that notes which tags and whether events a rule read (its inputs)."""

    def __post_init__(self):
        super().__post_init__()
        self.reads: list[pl.DataFrame] = []
        self.read_events = False

    @property
    def events(self) -> pl.DataFrame:
        self.read_events = True
        return self._events

    @events.setter
    def events(self, value: pl.DataFrame) -> None:
        self._events = value

    def code(self, run_id: str) -> int:
        return self._run_code[run_id]

    def series(self, name: Name) -> pl.DataFrame:
        self.reads.append(self.resolve(name).select("rid", "tid"))
        return super().series(name)


class LiveEvaluator:
    """Rules over growing runs. `add` the new current points (and events) of a run, then
    `evaluate`; `reset` a run whose earlier points changed and `add` all of them again."""

    def __init__(self, rules: list[Rule]):
        self.rules = rules
        self.ctx = {r.id: context(r) for r in rules}
        self.ev_ctx = {r.id: event_context(r) for r in rules}
        self.unbounded = {r.id for r in rules if self.ctx[r.id] is None}
        self.runs: dict[str, RunState] = {}
        self.not_evaluable: dict[str, str] = {}  # rule -> why, while it is evaluable on no run

    # ---- input ------------------------------------------------------------------------------
    def reset(self, run_id: str) -> None:
        """Forget what was seen of a run (its points changed); its alerts are kept to be matched."""
        old = self.runs.get(run_id)
        state = RunState()
        if old is not None:
            state.prior = {r: old.prior.get(r, []) + alerts for r, alerts in old.alerts.items()}
            state.prior |= {r: a for r, a in old.prior.items() if r not in state.prior}
            state.final = old.final
        self.runs[run_id] = state

    def add(self, run_id: str, points: pl.DataFrame, events: pl.DataFrame | None = None) -> bool:
        """New points of a run (NEW_POINTS columns plus `source`), in the order they were
        written. False (nothing taken) when they touch steps already evaluated or supersede
        earlier points (a source logging a step again): `reset` the run and add all its
        current points."""
        st = self.runs.setdefault(run_id, RunState())
        # the ignores: polars types cast's mapping keys as str | Selector | DataType (no dict[str, ...] fits)
        points = points.select(*NEW_POINTS, "source").cast({**NEW_POINTS, "source": pl.String})  # type: ignore[dict-item]
        events = (
            pl.DataFrame(schema=NEW_EVENTS) if events is None else events.select(*NEW_EVENTS).cast(NEW_EVENTS)  # type: ignore[arg-type]
        )
        if self._late(st, points, events):
            return False
        if points.height:
            self._merge(st, points)
        if events.height:
            st.events = pl.concat([st.events, events.drop_nulls("step")])
            for src, step in (
                events.drop_nulls("step").group_by("source").agg(pl.col("step").max()).iter_rows()
            ):
                st.ev_seen[src] = max(st.ev_seen.get(src, -INF), step)
                st.src_seen[src] = max(st.src_seen.get(src, -INF), step)
        return True

    def _late(self, st: RunState, points: pl.DataFrame, events: pl.DataFrame) -> bool:
        if points.height:
            rewinds = points.group_by("tag", "rank").agg(back=(pl.col("step").diff() <= 0).any())
            if rewinds["back"].any():
                return True  # a source logs a step again within these points
            first = points.group_by("tag", "rank").agg(pl.col("step").min())
            for tag, rank, step in first.iter_rows():
                if step <= st.seen.get((tag, rank), -INF):
                    return True  # the source logs a step again: it supersedes what it logged
            low = dict(points.group_by("tag").agg(pl.col("step").min()).iter_rows())
            for rule, (tags, _) in st.reads.items():
                if any(low.get(t, INF) <= st.frontier.get(rule, -INF) for t in tags):
                    return True
        ev = events.drop_nulls("step")
        if ev.height:
            for src, step in ev.group_by("source").agg(pl.col("step").min()).iter_rows():
                if step < st.ev_seen.get(src, -INF):
                    return True
            first_event = cast(int, ev["step"].min())  # an Int64 column without nulls
            if any(e and first_event <= st.frontier.get(r, -INF) for r, (_, e) in st.reads.items()):
                return True
        return False

    def _merge(self, st: RunState, points: pl.DataFrame) -> None:
        for tag, rank, step in points.group_by("tag", "rank").agg(pl.col("step").max()).iter_rows():
            st.seen[(tag, rank)] = max(st.seen.get((tag, rank), -INF), step)
        for src, step in points.group_by("source").agg(pl.col("step").max()).iter_rows():
            st.src_seen[src] = max(st.src_seen.get(src, -INF), step)
        # one current point per tag and step: the lowest source rank (as the `scalars` view)
        new = points.drop("source").sort("tag", "step", "rank").unique(["tag", "step"], keep="first")
        tail = st.tail
        if tail.height:
            both = new.join(tail.select("tag", "step", old_rank="rank"), on=["tag", "step"], how="inner")
            better = both.filter(pl.col("rank") < pl.col("old_rank")).drop("old_rank")
            if better.height:  # a better source for a pending step: replace its value
                tail = tail.update(better, on=["tag", "step"])
            new = new.join(tail.select("tag", "step"), on=["tag", "step"], how="anti")
        new = new.sort("tag", "step").with_columns(
            i=pl.int_range(pl.len(), dtype=pl.Int64).over("tag")
            + pl.col("tag").replace_strict(st.counts, default=0, return_dtype=pl.Int64)
        )
        for tag, n in new.group_by("tag").len().iter_rows():
            st.counts[tag] = st.counts.get(tag, 0) + n
        st.tail = pl.concat([tail, new.select(*_TAIL)]).sort("tag", "step")

    def mark_final(self, run_id: str, final: bool = True) -> bool:
        """A finished (or stale) run: every step it logged is final. True when that changed."""
        st = self.runs.get(run_id)
        if st is None or st.final == final:
            return False
        st.final = final
        return True

    # ---- evaluation -------------------------------------------------------------------------
    def evaluate(self, run_ids: list[str], now: float | None = None) -> tuple[Update, set[str]]:
        """Evaluate the new final steps of these runs. Returns what changed, and the runs whose
        inputs changed under the rules (to reload and evaluate again)."""
        now = time.time() if now is None else now
        update = Update()
        again: set[str] = set()
        runs = [
            r for r in run_ids if r in self.runs and self.runs[r].tail.height + self.runs[r].events.height
        ]
        if not runs:
            return update, again
        bounded = self._data(runs, full=False)
        full = self._data(runs, full=True) if self.unbounded else None
        for rule in self.rules:
            # a rule that was not evaluable on these runs is not until a new tag appears
            todo = [r for r in runs if self.runs[r].idle.get(rule.id) != len(self.runs[r].counts)]
            if todo:
                data = full if full is not None and rule.id in self.unbounded else bounded
                self._evaluate_rule(rule, data, todo, now, update, again)
        for r in runs:
            st = self.runs[r]
            for rule_id, prior in st.prior.items():
                update.withdrawn += [a.row | {"raised_at": a.raised_at} for a in prior]
                if prior:
                    update.changed.add((r, rule_id))
            st.prior = {}
            self._trim(r, bounded)
        return update, again

    def _data(self, runs: list[str], full: bool) -> _Recording:
        pts, ev, counts = [], [], []
        seeds: dict[str, list[tuple[str, str, float, float]]] = {}  # leaf -> (run, tag, seed)
        for r in runs:
            st = self.runs[r]
            whole = self._whole(st) if full else set()
            tail = st.tail if whole is None else _view(st.tail, st.start, whole)
            pts.append(tail.select("tag", "metric", "step", "value").with_columns(run_id=pl.lit(r)))
            ev.append(st.events.select("step", "kind", "attrs").with_columns(run_id=pl.lit(r)))
            counts.append(
                pl.DataFrame(
                    {"run_id": [r] * len(st.counts), "tag": list(st.counts), "n": list(st.counts.values())},
                    schema={"run_id": pl.String, "tag": pl.String, "n": pl.Int64},
                )
            )
            if not full:
                for leaf, by_tag in st.seeds.items():
                    for tag, (s0, s1) in by_tag.items():
                        seeds.setdefault(leaf, []).append((r, tag, s0, s1))
        data = _Recording(
            pl.concat(pts).select("run_id", "tag", "metric", "step", "value"),
            pl.concat(ev).select("run_id", "step", "kind", "attrs"),
            sorted(runs),
            counts=pl.concat(counts),
        )
        # seeds by leaf: (run, tag or "") -> the engine's (rid, key) codes
        tid = {t: i for i, t in data.tag_name.items()}
        rid = dict(data.run_codes.iter_rows())
        for leaf, rows in seeds.items():
            data.seeds[leaf] = pl.DataFrame(
                {
                    "rid": [rid[r] for r, _, _, _ in rows],
                    "key": [tid.get(t, -2) if t else -1 for _, t, _, _ in rows],
                    "s0": [s0 for *_, s0, _ in rows],
                    "s1": [s1 for *_, s1 in rows],
                },
                schema={"rid": pl.Int32, "key": pl.Int32, "s0": pl.Float64, "s1": pl.Float64},
            )
        return data

    def _evaluate_rule(self, rule, data: _Recording, runs, now, update: Update, again: set[str]) -> None:
        frame, texts, ok = self._conditions(rule, data)
        bounds = self._bounds(rule, data, runs, ok, again)
        if frame is None or not bounds:
            return
        rows = self._advance(rule, data, frame, bounds)
        if rows.is_empty():
            return
        alerts, extended = self._streaks(rule, data, rows, texts)
        self._extend(rule, data, extended, update)
        self._record(rule, alerts, now, update)

    def _conditions(self, rule, data: _Recording) -> tuple[pl.DataFrame | None, list[str], set[str]]:
        """The rule's condition frame (None when it is evaluable on none of these runs), its leaf
        texts and the runs where it is evaluable; `data` notes what it read."""
        data.reads, data.read_events = [], False
        try:
            frame, texts, ok = rule_conditions(rule, data)
        except ReplayError as e:
            self.not_evaluable[rule.id] = str(e)
            return None, [], set()
        if ok:
            self.not_evaluable.pop(rule.id, None)
        return frame, texts, set(ok)

    def _bounds(self, rule, data: _Recording, runs, ok: set[str], again: set[str]) -> list[tuple]:
        """(rid, frontier, last final step) of each run to evaluate. Notes the inputs the rule
        read in each run; a run where they changed goes to `again` instead."""
        reads = (
            pl.concat(data.reads) if data.reads else pl.DataFrame(schema={"rid": pl.Int32, "tid": pl.Int32})
        )
        tags_of = {
            data.run_name[k[0]]: frozenset(data.tag_name[t] for t in g["tid"].to_list())
            for k, g in reads.unique().partition_by("rid", as_dict=True).items()
        }
        bounds = []
        for r in runs:
            st = self.runs[r]
            inputs = (tags_of.get(r, frozenset()), data.read_events) if r in ok else (frozenset(), False)
            before = st.reads.get(rule.id)
            if before is not None and before != inputs and (before[0] or before[1] or st.trimmed):
                again.add(r)  # the rule now reads other series here: evaluate the run again
            elif before is None and inputs != (frozenset(), False) and st.trimmed:
                again.add(r)
            st.reads[rule.id] = inputs
            if r not in ok:
                st.idle[rule.id] = len(st.counts)
            if r not in ok or r in again:
                continue
            tags, events = inputs
            hi = INF if st.final else min([st.watermark(t) for t in tags] + [INF])
            if events and not st.final:
                hi = min(hi, st.events_watermark())
            bounds.append((data.code(r), st.frontier.get(rule.id, -INF), hi))
        return bounds

    def _advance(self, rule, data: _Recording, frame: pl.DataFrame, bounds: list[tuple]) -> pl.DataFrame:
        """The frame's rows after each run's frontier up to its last final step, sorted by unit
        and step; the frontiers move past them."""
        lim = pl.DataFrame(bounds, schema={"rid": pl.Int32, "lo": pl.Float64, "hi": pl.Float64}, orient="row")
        rows = frame.join(lim, on="rid").filter(
            (pl.col("step") > pl.col("lo")) & (pl.col("step") <= pl.col("hi"))
        )
        reached = rows.group_by("rid").agg(pl.col("step").max())
        for rid, lo, hi in bounds:
            r = data.run_name[rid]
            last = reached.filter(pl.col("rid") == rid)["step"]
            new_f = hi if hi < INF else (float(last[0]) if last.len() else lo)
            self.runs[r].frontier[rule.id] = max(lo, new_f)
        return rows.drop("lo", "hi").sort(*UNIT, "step")

    def _streaks(self, rule, data: _Recording, rows: pl.DataFrame, texts: list[str]):
        """`stream_alerts` over the rows, continuing each unit's streak state and keeping it."""
        units = rows.select(UNIT).unique(maintain_order=True)
        names = [(data.run_name[a], "" if b == -1 else data.tag_name[b]) for a, b in units.iter_rows()]
        zero = dict.fromkeys(STREAK_STATE, 0)
        state = {
            c: np.array([self.runs[r].streaks.get((rule.id, t), zero)[c] for r, t in names], np.int64)
            for c in STREAK_STATE
        }
        alerts, extended = stream_alerts(rule, rows, texts, data, state)
        for j, (r, t) in enumerate(names):
            self.runs[r].streaks[(rule.id, t)] = {c: int(state[c][j]) for c in STREAK_STATE}
        return alerts, extended

    def _extend(self, rule, data: _Recording, extended: pl.DataFrame, update: Update) -> None:
        """Alerts of earlier polls whose streak these rows continued: their new end."""
        for row in extended.iter_rows(named=True):
            r, t = data.run_name[row["rid"]], "" if row["key"] == -1 else data.tag_name[row["key"]]
            latest = next(a for a in reversed(self.runs[r].alerts[rule.id]) if a.row["tag"] == t)
            latest.row["step_end"] = row["step_end"]
            update.extended.append(latest.row | {"raised_at": latest.raised_at})
            update.changed.add((r, rule.id))

    def _record(self, rule, alerts: pl.DataFrame, now: float, update: Update) -> None:
        """New alerts: raised now, or, after a reset, the same alert raised before, found again."""
        for row in alerts.iter_rows(named=True):
            st = self.runs[row["run_id"]]
            prior = st.prior.get(rule.id, [])
            match = next(
                (a for a in prior if (a.row["tag"], a.row["step_start"]) == (row["tag"], row["step_start"])),
                None,
            )
            if match is not None:
                prior.remove(match)
                alert = Alert(row, match.raised_at)  # found again: raised before, not raised again
                if match.row != row:
                    update.changed.add((row["run_id"], rule.id))
            else:
                alert = Alert(row, now)
                update.raised.append(row | {"raised_at": now})
                update.changed.add((row["run_id"], rule.id))
            st.alerts.setdefault(rule.id, []).append(alert)

    def _trim(self, run_id: str, data: _Recording) -> None:
        """Let go of the points no rule needs any more, folding them into the seeds."""
        st = self.runs[run_id]
        keep: dict[str, float] = {}  # tag -> the lowest frontier of the rules reading it
        need: dict[str, int] = {}  # tag -> points kept at or before it
        ev_from = INF
        for rule in self.rules:
            tags, events = st.reads.get(rule.id, (frozenset(), False))
            f = st.frontier.get(rule.id, -INF)
            for t in tags:
                keep[t] = min(keep.get(t, INF), f)
                need[t] = max(need.get(t, 1), self.ctx[rule.id] or 1)
            if events:
                e = self.ev_ctx[rule.id]
                ev_from = min(ev_from, -INF if e is None else f - e)
        if ev_from > -INF and st.events.height:
            st.events = st.events.filter(
                pl.col("step") > min(ev_from, max(st.src_seen.values(), default=0) - 1)
            )
        tail = st.tail
        if tail.is_empty():
            return
        starts = {}
        for tag, g in tail.group_by("tag"):
            t = tag[0]
            f = keep.get(t, -INF) if t in keep else INF  # a tag no rule reads: keep its last point
            old = g.filter(pl.col("step") <= f)
            n = need.get(t, 1)
            if old.height > n:
                starts[t] = int(old["i"][old.height - n])
        moved = {t: s for t, s in starts.items() if s > st.start.get(t, 0)}
        if not moved:
            return
        self._fold_seeds(st, data, run_id, moved)
        st.start.update(moved)
        st.trimmed = True
        whole = self._whole(st)
        if whole is not None:  # let go of what no rule reads any more
            st.tail = _view(st.tail, st.start, whole)

    def _whole(self, st: RunState) -> set[str] | None:
        """Tags whose whole history the rules without a bounded context read in this run
        (None: not known yet)."""
        out: set[str] = set()
        for rule_id in self.unbounded:
            if rule_id not in st.reads:
                return None
            out |= st.reads[rule_id][0]
        return out

    def _fold_seeds(self, st: RunState, data: _Recording, run_id: str, moved: dict[str, int]) -> None:
        """Carry each seeded leaf (ema, max_first) over the points leaving its tag's view."""
        rid = data.code(run_id)
        done = set()
        for rule in self.rules:
            for call in _seeded_leaves(rule):
                leaf = repr(call)
                if leaf in done:
                    continue
                done.add(leaf)
                name = call.args[0]
                for _, tid, key in data.resolve(name).filter(pl.col("rid") == rid).iter_rows():
                    tag = data.tag_name[tid]
                    if tag not in moved:
                        continue
                    lo, hi = st.start.get(tag, 0), moved[tag]
                    pts = st.tail.filter((pl.col("tag") == tag) & (pl.col("i") >= lo) & (pl.col("i") < hi))
                    s = pts.select(
                        rid=pl.lit(rid, pl.Int32), key=pl.lit(key, pl.Int32), step="step", value="value"
                    )
                    k = "" if key == -1 else tag
                    old = st.seeds.get(leaf, {}).get(k)
                    seed = (
                        None
                        if old is None
                        else pl.DataFrame(
                            {"rid": [rid], "key": [key], "s0": [old[0]], "s1": [old[1]]},
                            schema={"rid": pl.Int32, "key": pl.Int32, "s0": pl.Float64, "s1": pl.Float64},
                        )
                    )
                    out = fold_seed(call.fn, call.args[1].value, s, seed)
                    st.seeds.setdefault(leaf, {})[k] = (out["s0"][0], out["s1"][0])

    # ---- output -----------------------------------------------------------------------------
    def alerts(self, run_ids, rule_ids=None) -> pl.DataFrame:
        """The live alerts of these runs (of these rules), ALERT columns plus raised_at."""
        rows = [
            a.row | {"raised_at": a.raised_at}
            for r in run_ids
            if r in self.runs
            for rule_id, alerts in self.runs[r].alerts.items()
            if rule_ids is None or rule_id in rule_ids
            for a in alerts
        ]
        sch = {**schema.ALERT, "raised_at": pl.Float64}
        return pl.DataFrame(rows, schema=sch) if rows else pl.DataFrame(schema=sch)

    def open_alerts(self, run_id: str) -> int:
        """Units of the run whose alert interval is still open (its streak goes on)."""
        st = self.runs.get(run_id)
        if st is None:
            return 0
        by_id = {r.id: r for r in self.rules}
        return sum(
            1 for (rule, _), s in st.streaks.items() if s["run"] >= by_id[rule].for_steps and s["has_last"]
        )
