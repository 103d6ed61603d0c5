"""Cached data access for the app: the only module the pages read the store (and run rules) through.

Every cached read takes the store generation as its first argument, so a new ingest (a new
generation) invalidates it; the store's questions (`workbench.store.reads`, the same the CLI
and the Python API ask) run on a per-generation in-memory DuckDB that never locks the store, so
an open app never blocks an ingest.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from datetime import datetime

import numpy as np
import polars as pl
import streamlit as st

from detectors import language
from detectors.backtest import Settings, backtest, judge
from detectors.replay import GUIDES, default_rules, replay
from detectors.rules import load_rule_file, rules_from_text
from ingest import lineage as lineage_graph
from workbench.app import charts, untrusted
from workbench.errors import WorkbenchError
from workbench.store import Store, reads

SELECTED = "selected_runs"  # session key shared by the pages
X_MODES = ["step", "relative time", "wall time"]


def store() -> Store:
    return Store()


def generation() -> str | None:
    """The store's current generation, named with the store's folder: every cached read is keyed
    by it, so two stores in one process (WORKBENCH_STORE changed, tests) never share a cache."""
    s = store()
    gen = s.current_generation()
    return f"{gen.name} of {s.root}" if gen else None


@st.cache_resource(show_spinner=False, max_entries=2)
def _connection(gen: str):
    return store().connect()


def read(gen: str, query: reads.Query) -> pl.DataFrame:
    """One of the store's questions, on this generation's connection."""
    cur = _connection(gen).cursor()  # a cursor per call: connections are not shared between threads
    try:
        return query.frame(cur)
    finally:
        cur.close()


@st.cache_resource(show_spinner=False, max_entries=2)
def run_starts(gen: str) -> dict[str, float | None]:
    """run -> when it started (epoch seconds, its first file's first wall time), for every run:
    what the Curves page needs of `runs`, without its heavier columns. Shared, read-only (looked
    up once per run of a sweep: not copied per call)."""
    return dict(read(gen, reads.run_starts()).iter_rows())


@st.cache_data(show_spinner=False)
def runs(gen: str) -> pl.DataFrame:
    """Every run with its label, last loss, alert counts (live ones apart) and config (JSON text)."""
    return read(gen, reads.run_table())


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = json.dumps(v) if isinstance(v, list) else v
    return out


@st.cache_data(show_spinner=False)
def configs(gen: str) -> pl.DataFrame:
    """One row per run with a config, one column per config key (nested keys dotted, as W&B
    shows them), keys in first-seen order."""
    rows = []
    for run, text in read(gen, reads.run_configs()).iter_rows():
        if text:
            try:
                rows.append({"run_id": run, **_flatten(json.loads(text))})
            except (ValueError, AttributeError):
                continue
    if not rows:
        return pl.DataFrame(schema={"run_id": pl.String})
    cols: dict[str, list] = {}
    for k in dict.fromkeys(k for r in rows for k in r):
        vals = [r.get(k) for r in rows]
        kinds = {type(v) for v in vals if v is not None}
        if kinds and kinds <= {int, float}:
            cols[k] = [None if v is None else float(v) for v in vals]
        elif kinds in ({str}, {bool}):
            cols[k] = vals
        else:  # mixed types: shown as text
            cols[k] = [None if v is None else str(v) for v in vals]
    return pl.DataFrame(cols, strict=False)


@st.cache_data(show_spinner=False)
def tags(gen: str, run_ids: tuple[str, ...]) -> pl.DataFrame:
    """The tags of these runs (from the per-file tag index, no scan of the points), loss first."""
    schema = {"tag": pl.String, "metric": pl.String, "runs": pl.UInt32}
    if not run_ids:
        return pl.DataFrame(schema=schema)
    return (
        read(gen, reads.logged_tags(list(run_ids)))
        .select(list(schema))
        .sort([(pl.col("metric") != "loss").fill_null(True), pl.col("metric").is_null(), "tag"])
    )


HELD_POINTS = 50_000_000  # points held per generation before the oldest series are let go


@st.cache_resource(show_spinner=False, max_entries=2)
def _held(gen: str) -> dict[tuple[str, str], dict[str, np.ndarray]]:
    """This generation's series read so far, by (run, tag), oldest first: shared by every page
    view of the process (never copied per view), read-only."""
    return {}


def _hold(gen: str, key: tuple[str, str], series: dict[str, np.ndarray]) -> None:
    held = _held(gen)
    held[key] = series
    total = sum(len(v["step"]) for v in held.values())
    for old in list(held):
        if total <= HELD_POINTS or old == key:
            break
        gone = held.pop(old, None)  # another session may have let it go already
        total -= len(gone["step"]) if gone is not None else 0


def _series(gen: str, run_id: str, tag: str) -> dict[str, np.ndarray]:
    """Every stored point of one run and tag by step: value, its own wall time, and `kind`: 0
    current, 1 replaced by a resume (a later writer of the same source logged that step again),
    2 a duplicate of the step from another source (shown by that source's current row); and
    `cur_step`, `cur_wall`, `cur_value` for the current points alone. Read once per generation
    (`prefetch` reads many at once)."""
    s = _held(gen).get((run_id, tag))
    if s is None:
        s = _as_series(gen, run_id, tag, read(gen, reads.curve_points(run_id, tag)))
        _hold(gen, (run_id, tag), s)
    return s


def _as_series(gen: str, run_id: str, tag: str, df: pl.DataFrame) -> dict[str, np.ndarray]:
    # parts are stored sorted by step: a single-writer series needs no sort (the common case)
    if not df["step"].is_sorted() or df["superseded"].any():
        df = df.sort(["step", "superseded"], descending=[False, True], maintain_order=True)
    kind = df["superseded"].cast(pl.Int8).to_numpy().copy()
    if kind.any():
        dup = read(gen, reads.duplicated_steps(run_id, tag))["step"].to_numpy()
        kind[(kind == 1) & np.isin(df["step"].to_numpy(), dup)] = 2
    out = {
        "step": df["step"].to_numpy(),
        "wall": df["wall_time"].cast(pl.Float64).fill_null(np.nan).to_numpy(),
        "value": df["value"].cast(pl.Float64).fill_null(np.nan).to_numpy(),
        "kind": kind,
    }
    cur = None if not kind.any() else kind == 0  # the current points: the same arrays when all are
    return {**out, **{f"cur_{k}": out[k] if cur is None else out[k][cur] for k in ("step", "wall", "value")}}


def current_points(gen: str, run_id: str, tag: str) -> tuple[np.ndarray, np.ndarray]:
    """(step, value) of a run's current points of a tag, by step (shared arrays: read-only)."""
    s = _series(gen, run_id, tag)
    return s["cur_step"], s["cur_value"]


def prefetch(gen: str, pairs: list[tuple[str, str]]) -> None:
    """Read the points of several (run, tag) pairs not read yet: one scan per tag for all its
    runs (a sweep of 500 runs is one query, not 500)."""
    held = _held(gen)
    by_tag: dict[str, list[str]] = {}
    for run, tag in pairs:
        if (run, tag) not in held:
            by_tag.setdefault(tag, []).append(run)
    for tag, runs in by_tag.items():
        if len(runs) == 1:
            _series(gen, runs[0], tag)
            continue
        df = read(gen, reads.curve_points_of(runs, tag))
        which = df["run"].to_numpy()
        # grouped by run, each run's rows in the order read (a stable sort: a radix sort on 16 bits)
        order = np.argsort(which.astype(np.uint16) if len(runs) < 1 << 16 else which, kind="stable")
        df = df.drop("run")[order]
        ends = np.cumsum(np.bincount(which, minlength=len(runs)))
        for i, run in enumerate(runs):
            start = int(ends[i - 1]) if i else 0
            _hold(gen, (run, tag), _as_series(gen, run, tag, df.slice(start, int(ends[i]) - start)))


@st.cache_resource(show_spinner=False, max_entries=64)
def _clock(gen: str, run_id: str) -> tuple[np.ndarray, np.ndarray]:
    """step -> wall time over every source and tag of the run: the latest write of each step
    (the one the current rows came from when a resumed writer logged it again)."""
    df = read(gen, reads.run_clock(run_id))
    return df["step"].to_numpy().astype(np.float64), df["wall"].to_numpy()


def _walls(gen: str, run_id: str, steps: np.ndarray, own: np.ndarray) -> tuple[np.ndarray, int]:
    """Wall times for these steps: each point's own, else the run's clock at that step (another
    source that logged it), interpolated between logged steps inside the clock's range; NaN
    where nothing tells. Also how many were taken from the clock."""
    missing = ~np.isfinite(own)
    if not missing.any():
        return own, 0
    cs, cw = _clock(gen, run_id)
    if len(cs) == 0:
        return own, 0
    out = own.copy()
    out[missing] = np.interp(steps[missing].astype(np.float64), cs, cw, left=np.nan, right=np.nan)
    return out, int(np.isfinite(out[missing]).sum())


@st.cache_data(show_spinner=False, max_entries=4096)
def _raw_index(gen: str, run_id: str, tag: str, buckets: int) -> np.ndarray:
    """The raw points worth drawing (indices into the current points): the same whatever the
    smoothing."""
    return charts.keep_index(_series(gen, run_id, tag)["cur_value"], buckets)


@st.cache_data(show_spinner=False, max_entries=4096)
def _line(gen: str, run_id: str, tag: str, smoothing: float, buckets: int) -> dict | None:
    """The points of one run's line worth drawing, whatever the x axis: smoothed over every
    current point, then thinned per bucket of points (indices into the current points, so any
    x is looked up for just these)."""
    values = _series(gen, run_id, tag)["cur_value"]
    if len(values) == 0:
        return None
    return _line_of(
        values, charts.tb_smooth(values, smoothing), _raw_index(gen, run_id, tag, buckets), buckets
    )


def _line_of(
    values: np.ndarray, smoothed: np.ndarray, raw_index: np.ndarray, buckets: int, even: bool = False
) -> dict:
    # a sweep's lines are drawn at evenly spaced points: a few buckets' min-max zig-zags, 500 times
    # over, would hide the curves behind diagonals
    si = np.unique(np.linspace(0, len(smoothed) - 1, 4 * buckets).astype(np.int64)) if even else None
    si = charts.keep_index(smoothed, buckets) if si is None else si
    bad = np.flatnonzero(~np.isfinite(values))
    return {
        "raw_i": raw_index,
        "raw_y": values[raw_index],
        "smooth_i": si,
        "smooth_y": smoothed[si],
        "nan_i": bad,
        "nan_v": values[bad],
        "points": len(values),
    }


@st.cache_data(show_spinner=False, max_entries=4096)
def display_curve(
    gen: str, run_id: str, tag: str, smoothing: float, x_mode: str, replaced: bool, buckets: int
) -> dict | None:
    """One run's line on one chart, ready to draw: smoothed over every current point, thinned to
    the chart's width, and its x: the step (DeepSpeed's sample-counted monitor series are put on
    optimizer steps by ingest), or seconds since the run started, or epoch seconds. Points without a
    wall time are left out on time axes and counted (only the counts come back when nothing can
    be drawn). `place_*`: (optimizer step, x, smoothed y) of the line, to put markers on."""
    line = _line(gen, run_id, tag, smoothing, buckets)
    return None if line is None else _display(gen, run_id, tag, line, x_mode, replaced)


@st.cache_data(show_spinner=False, max_entries=64)
def display_curves(
    gen: str, run_ids: tuple[str, ...], tag: str, smoothing: float, x_mode: str, replaced: bool, buckets: int
) -> dict[str, dict]:
    """`display_curve` of many runs (a sweep) as one cached result: their series smoothed
    together (`charts.tb_smooth_many`), one cache entry per chart instead of one per run."""
    prefetch(gen, [(r, tag) for r in run_ids])
    series = {r: _series(gen, r, tag) for r in run_ids}
    runs = [r for r in run_ids if len(series[r]["cur_value"])]
    smoothed = charts.tb_smooth_many([series[r]["cur_value"] for r in runs], smoothing)
    out = {}
    for run, sm in zip(runs, smoothed, strict=True):
        values = series[run]["cur_value"]
        line = _line_of(values, sm, charts.keep_index(values, buckets), buckets, even=True)
        out[run] = _display(gen, run, tag, line, x_mode, replaced)
    return out


def _display(gen: str, run_id: str, tag: str, line: dict, x_mode: str, replaced: bool) -> dict:
    s = _series(gen, run_id, tag)
    info = {
        "points": line["points"],
        "replaced": int((s["kind"] == 1).sum()),
        "duplicates": int((s["kind"] == 2).sum()),
        "untimed": 0,
        "borrowed_times": 0,
    }
    if x_mode == "step":

        def x_of(i):
            return s["cur_step"][i]
    else:
        walls, info["borrowed_times"] = _walls(gen, run_id, s["cur_step"], s["cur_wall"])
        info["untimed"] = int(np.isnan(walls).sum())
        if info["untimed"] == len(walls):
            return info
        t0 = _run_start(gen, run_id, walls) if x_mode == "relative time" else 0.0

        def x_of(i):
            return walls[i] - t0

    def drawn(i, y):
        x = x_of(i)
        ok = np.isfinite(x)
        return x[ok], y[ok], i[ok]

    rx, ry, _ = drawn(line["raw_i"], line["raw_y"])
    sx, sy, si = drawn(line["smooth_i"], line["smooth_y"])
    nx, nv, _ = drawn(line["nan_i"], line["nan_v"])
    info.update(
        raw_x=charts.compact(rx),
        raw_y=charts.compact(ry),
        smooth_x=charts.compact(sx),
        smooth_y=charts.compact(sy),
        nan_x=nx,
        nan_v=nv,
        place_step=s["cur_step"][si],
        place_x=sx,
        place_y=sy,
        span=float(sx.max() - sx.min()) if len(sx) else 0.0,
    )
    if replaced:
        r = np.flatnonzero(s["kind"] == 1)
        if x_mode == "step":
            rx = s["step"][r]
        else:
            rx = s["wall"][r] - (_run_start(gen, run_id, s["wall"][r]) if x_mode == "relative time" else 0.0)
        ok = np.isfinite(rx)
        info.update(sup_x=charts.compact(rx[ok]), sup_y=charts.compact(s["value"][r][ok]))
    return info


def _run_start(gen: str, run_id: str, walls: np.ndarray) -> float:
    """When the run started: its first file's first wall time, else its first timed point."""
    start = run_starts(gen).get(run_id)
    if start is not None and math.isfinite(start):
        return start
    timed = walls[np.isfinite(walls)]
    return float(timed.min()) if len(timed) else 0.0


def place(curve: dict, step: float) -> tuple[float | None, float | None]:
    """(x, y) of an optimizer step on a run's line (None where the line does not reach it)."""
    ps = curve.get("place_step")
    if ps is None or len(ps) == 0 or step is None or not (ps[0] <= step <= ps[-1]):
        return None, None
    x = float(np.interp(step, ps, curve["place_x"]))
    ok = np.isfinite(curve["place_y"])
    y = float(np.interp(step, ps[ok], curve["place_y"][ok])) if ok.any() else None
    return x, y


@st.cache_data(show_spinner=False)
def group_band(
    gen: str, run_ids: tuple[str, ...], tag: str, smoothing: float, x_mode: str, buckets: int
) -> dict | None:
    """Mean and min..max band of several runs' smoothed lines on one chart (W&B's run groups)."""
    xs, ys = [], []
    prefetch(gen, [(r, tag) for r in run_ids])
    series = [(r, s) for r in run_ids if len((s := _series(gen, r, tag))["cur_value"])]
    smoothed = charts.tb_smooth_many([s["cur_value"] for _, s in series], smoothing)
    for (run, s), y in zip(series, smoothed, strict=True):
        if x_mode == "step":
            x = s["cur_step"]
        else:
            x, _ = _walls(gen, run, s["cur_step"], s["cur_wall"])
            if x_mode == "relative time":
                x = x - _run_start(gen, run, x)
        ok = np.isfinite(x)
        xs.append(x[ok])
        ys.append(y[ok])
    return charts.band(xs, ys, buckets)


def group_of(run_ids: list[str], how: str, key: str, gen: str) -> dict[str, str]:
    """run -> group: by a config key's value, or by a regex over the run id (its first group,
    else the whole match); runs it does not match stay alone."""
    if how == "config" and key:
        cfg = configs(gen)
        vals = dict(cfg.select("run_id", key).iter_rows()) if key in cfg.columns else {}
        return {r: f"{key}={vals.get(r)}" for r in run_ids}
    if how == "name" and key:
        try:
            found = untrusted.names(key, list(run_ids))
        except untrusted.BadPattern:
            return {r: r for r in run_ids}
        return {r: f if f is not None else r for r, f in zip(run_ids, found, strict=True)}
    return {r: r for r in run_ids}


@st.cache_data(show_spinner="Preparing the export ...")
def export(gen: str, pairs: tuple[tuple[str, str], ...], fmt: str, replaced: bool = False) -> bytes:
    """The selected points in long format: run_id, tag, step, wall_time, value, superseded; one
    row per step unless `replaced` (the points a resume replaced too)."""
    import io

    frames = [read(gen, reads.export_points(r, t, replaced)) for r, t in pairs]
    data = pl.concat(frames) if frames else pl.DataFrame()
    if fmt == "csv":
        return data.write_csv().encode()
    buf = io.BytesIO()
    data.write_parquet(buf)
    return buf.getvalue()


@st.cache_data(show_spinner=False)
def alerts(gen: str, run_ids: tuple[str, ...]) -> pl.DataFrame:
    return read(gen, reads.alerts(list(run_ids)))


@st.cache_data(show_spinner=False)
def rule_metrics(rules_text: str | None = None) -> dict[str, list[str]]:
    """rule id -> the metric (or tags) its alerts belong to: the first name of its condition
    (the one whose value an alert carries), a built-in detector's metric fields; of the built-in
    and guides' rules and of `rules_text`. Names may be globs."""
    pool = list(default_rules())
    if rules_text:
        with contextlib.suppress(WorkbenchError):  # the backtest page says what is wrong with it
            pool += _rules(rules_text)
    out: dict[str, list[str]] = {}
    for r in pool:
        if r.when:
            try:
                names = [n.name for n in language.names(language.parse(r.when))][:1]
            except WorkbenchError:
                names = []
        else:
            d = r.detector
            names = [getattr(d, f) for f in dir(d) if f.endswith("metric") and isinstance(getattr(d, f), str)]
            names += list(getattr(d, "metrics", ()) or ())
        out.setdefault(r.id, [])
        out[r.id] += [n for n in names if n not in out[r.id]]
    return out


FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}


def _number(node) -> float | None:
    if isinstance(node, language.Num):
        return node.value
    if isinstance(node, language.Unary) and node.op == "-" and isinstance(node.arg, language.Num):
        return -node.arg.value
    return None


def _is_ratio(node) -> bool:
    return (
        isinstance(node, language.Binary)
        and node.op == "/"
        and isinstance(node.left, language.Name)
        and isinstance(node.right, language.Name)
    )


def _thresholds(node) -> list[tuple[language.Name | language.Binary, str, float]]:
    """(name, op, number) of every `name < number` (or `number > name`, ...) in a condition;
    the name may be a ratio of two names (`a` / `b` > 1000: a Binary)."""
    if isinstance(node, language.Binary) and node.op in FLIP:
        left, right = node.left, node.right
        if (isinstance(left, language.Name) or _is_ratio(left)) and (v := _number(right)) is not None:
            return [(left, node.op, v)]  # type: ignore[list-item]
        if (isinstance(right, language.Name) or _is_ratio(right)) and (v := _number(left)) is not None:
            return [(right, FLIP[node.op], v)]  # type: ignore[list-item]
        return []
    if isinstance(node, language.Binary):
        return _thresholds(node.left) + _thresholds(node.right)
    if isinstance(node, language.Unary):
        return _thresholds(node.arg)
    return []


@st.cache_data(show_spinner=False)
def layer_thresholds(
    family: str, layers: tuple[tuple[int, str], ...], metrics: tuple[str | None, ...]
) -> list[dict]:
    """The guides' thresholds (detectors/guides.toml, at each rule's own parameters) on a layer
    family (its (layer, tag) pairs and their metrics): every comparison of a name with a number
    whose name is the family's (`grad_norm` for `grad_norm/layer_*`), a metric of its tags, or a
    tag pattern matching one of them (`ffn_input_std/*`); and every ratio of two of its layers'
    tags against a number (the guides' first/last layer gradient ratio), with `ratio`: the two
    layers. {rule, op, value, text[, ratio]} each, in the file's order."""
    stem = re.sub(r"[_./-]*layers?[_./-]?$", "", family.split("*", 1)[0])  # grad_norm/layer_* -> grad_norm
    own = {stem, *(m for m in metrics if m)}
    layer_of = {t: n for n, t in layers}
    out = []
    for rule in load_rule_file(GUIDES):
        if rule.when is None:
            continue
        for name, op, value in _thresholds(rule.ast()):
            if isinstance(name, language.Binary):  # a ratio of two of the family's tags
                assert isinstance(name.left, language.Name) and isinstance(name.right, language.Name)
                a, b = name.left.name, name.right.name
                if a in layer_of and b in layer_of:
                    text = f"{rule.id}: {a} / {b} {op} {value:g}"
                    ratio = (layer_of[a], layer_of[b])
                    out.append({"rule": rule.id, "op": op, "value": value, "text": text, "ratio": ratio})
                continue
            if name.quoted:
                hit = any(untrusted.glob_match(name.name, t) for t in layer_of)
            else:
                hit = name.name in own
            if hit:
                text = f"{rule.id}: {name.name} {op} {value:g}"
                out.append({"rule": rule.id, "op": op, "value": value, "text": text})
    return out


@st.cache_data(show_spinner=False)
def rule_families(rules_text: str | None = None) -> dict[str, str]:
    """rule id -> its family, what the curves draw one marker shape for: a built-in's module
    (`loss`, `gradients`, `nonfinite`, `memory`, `moe`, `patterns`, `plateaus`); a rule written
    in the rule language (the guides', a user's) takes the family most built-ins reading its
    first metric belong to (`guides_loss_spike` reads `loss`: `loss`), else `other`."""
    pool = list(default_rules())
    if rules_text:
        with contextlib.suppress(WorkbenchError):
            pool += _rules(rules_text)
    reads_of = rule_metrics(rules_text)
    out = {r.id: type(r.detector).__module__.rsplit(".", 1)[-1] for r in pool if r.detector is not None}
    by_metric: dict[str, dict[str, int]] = {}
    for rule_id, family in out.items():
        for m in reads_of.get(rule_id, []):
            by_metric.setdefault(m, {})[family] = by_metric.setdefault(m, {}).get(family, 0) + 1
    for r in pool:
        if r.id not in out:
            first = (reads_of.get(r.id) or [""])[0]
            votes = by_metric.get(first) or by_metric.get(first.split("/", 1)[0]) or {"other": 1}
            out[r.id] = min(votes, key=lambda f: (-votes[f], f))
    return out


def value_at(gen: str, run_id: str, tag: str, step: int) -> float | None:
    """The current value of a run's tag at a step (None where it logged none)."""
    s = _series(gen, run_id, tag)
    i = np.searchsorted(s["cur_step"], step)
    return float(s["cur_value"][i]) if i < len(s["cur_step"]) and s["cur_step"][i] == step else None


@st.cache_data(show_spinner=False)
def histogram_tags(gen: str) -> pl.DataFrame:
    """Per run and histogram tag: how many histograms and their step range."""
    return read(gen, reads.histogram_tags())


@st.cache_data(show_spinner=False, max_entries=64)
def histograms(gen: str, run_id: str, tag: str) -> pl.DataFrame:
    """A run's histograms of one tag, one row per step, by step (the last logged where a step repeats:
    a resumed writer's)."""
    df = read(gen, reads.histograms([run_id], tag))
    return df.unique("step", keep="last", maintain_order=True)


@st.cache_data(show_spinner=False)
def events(gen: str, run_ids: tuple[str, ...]) -> pl.DataFrame:
    return read(gen, reads.chart_events(list(run_ids)))


@st.cache_data(show_spinner=False)
def lineage(gen: str) -> pl.DataFrame:
    return read(gen, reads.lineage())


@st.cache_data(show_spinner=False)
def stitched(gen: str, run_id: str, tag: str) -> pl.DataFrame:
    return lineage_graph.stitched(_connection(gen).cursor(), run_id, tag)


def stitch_marks(s: pl.DataFrame, edges: pl.DataFrame) -> list[tuple[float, str]]:
    """Where a stitched curve changes writer: each hop to the next run, and each resume of a
    run on the path (its writer restarting from a checkpoint)."""
    marks = []
    hops = s.group_by("run_id", maintain_order=True).agg(pl.col("step").min())
    for i, (run, first) in enumerate(hops.iter_rows()):
        if i:
            marks.append((float(first), f"continued by {run}"))
        for step in edges.filter((pl.col("child_run") == run) & (pl.col("parent_run") == run))["parent_step"]:
            if step is not None:
                marks.append((float(step), f"{run} resumed @ {step}"))
    return sorted(marks)


def guides_text() -> str:
    """The guides' rule file, as an example to edit."""
    return GUIDES.read_text()


def _rules(rules_text: str | None):
    return rules_from_text(rules_text, "the rule text") if rules_text else None


@st.cache_data(show_spinner="Replaying the rules over the labelled runs ...")
def run_backtest(
    gen: str, rules_text: str | None, runs_glob: str | None, horizon: int, lead: int, warmup: int = 0
) -> dict:
    """Backtest results as plain data, every key the backtest writes to JSON (newer keys
    included), plus the run counts; errors come back as {"error": message}."""
    try:
        res = backtest(
            store(),
            _rules(rules_text),
            runs_glob or None,
            Settings(horizon=horizon, lead=lead, warmup=warmup),
        )
    except WorkbenchError as e:
        return {"error": str(e)}
    return {**json.loads(res.to_json()), "unknown": res.unknown_runs, "runs": res.runs}


@st.cache_data(show_spinner="Replaying the rule over the runs ...")
def rule_verdicts(
    gen: str,
    rules_text: str | None,
    runs_glob: str | None,
    horizon: int,
    lead: int,
    warmup: int,
    rule: str,
    params: str,
) -> tuple[pl.DataFrame, pl.DataFrame] | str:
    """Per labelled run, what one rule (at one sweep point) of the backtest did, judged by the
    backtest itself (`detectors.backtest.judge`). Also the alarms themselves (to draw them). A
    message instead when the rule cannot be replayed."""
    try:
        pool = _rules(rules_text) or default_rules()
        point = next(
            (p for r in pool for p in r.sweep_points() if p.id == rule and p.params_json == params), None
        )
        if point is None:
            return f"rule {rule} {params} is not in this rule set"
        judged = judge(store(), point, runs_glob or None, Settings(horizon=horizon, lead=lead, warmup=warmup))
    except WorkbenchError as e:
        return str(e)
    if judged.error:
        return judged.error
    rows = []
    for run, info in sorted(judged.runs.items()):
        o = judged.outcomes.get(run)
        rows.append(
            {
                "run_id": run,
                "label": info.outcome,
                "onset": info.onset,
                "alarms": o.alarms if o else 0,
                "first_alarm": o.first if o else None,
                "lead": o.lead if o else None,
                "verdict": o.verdict if o else "not evaluable",
            }
        )
    for run in sorted(set(judged.evaluable) - set(judged.runs)):
        rows.append({"run_id": run, "label": "unlabelled", "onset": None, "verdict": "unlabelled"})
    return pl.DataFrame(rows, infer_schema_length=None), judged.alerts


def replay_alerts(rules_text: str | None, runs_glob: str | None) -> str:
    """Replay and store the alerts (then the curves show them); returns a summary or the error."""
    try:
        result = replay(store(), _rules(rules_text), runs_glob or None)
    except WorkbenchError as e:
        return f"error: {e}"
    return f"{result.alerts.height} alerts from {len(result.evaluable)} rules over {len(result.runs)} runs stored"


def generation_or_stop() -> str:
    """The store's current generation; without a store, says how to make one and ends the page."""
    gen = generation()
    if gen is None:
        st.info(no_store_message())
        st.stop()
    return gen


def no_store_message() -> str:
    return (
        f"No store at `{store().root}` yet. Create one with `workbench ingest PATH` "
        "(or set `WORKBENCH_STORE` to an existing store), then reload."
    )


def local_offset_ms() -> float:
    """This machine's UTC offset in ms: wall-time axes show local time (the app runs locally)."""
    off = datetime.now().astimezone().utcoffset()
    return off.total_seconds() * 1000 if off else 0.0
