"""Pure figure builders for the app (plotly); no Streamlit here, so they are unit-tested directly.

Curves are drawn as SVG lines downsampled to what a chart's width can show (the first, min, max
and last point of each pixel-wide bucket): a few thousand points per line whatever the run's
length, which keeps every control change a small message and a fast redraw in any browser.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from scipy.signal import lfilter

from workbench.app.untrusted import plotly as txt

# 20 colours, the first 10 Tableau's (what TensorBoard and matplotlib users know), the rest
# picked to stay apart from them: every pair is at least 27 CIELAB units apart.
PALETTE = [
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#511cfb",
    "#fe00fa",
    "#fc0080",
    "#6c7c32",
    "#f99379",
    "#b10da1",
    "#3283fe",
    "#b68100",
    "#008856",
    "#86ce00",
]
DASHES = ["solid", "dot", "dash", "dashdot"]
LEGEND_MAX = 20  # up to this many lines: one trace each, a legend to hide (click) or solo (double-click)
UNIFIED_HOVER_MAX = 10  # up to this many lines the hover lists them all at an x, sorted by value
ALERT_SYMBOLS = ["triangle-up", "triangle-down", "square", "pentagon", "hexagram", "star-diamond", "bowtie"]
FAMILY_SYMBOLS = {  # a rule family (`data.rule_families`) -> its alerts' marker; others by name
    "loss": "triangle-up",
    "gradients": "diamond-tall",
    "nonfinite": "bowtie",
    "memory": "square",
    "moe": "pentagon",
    "patterns": "hexagram",
    "plateaus": "star-diamond",
    "other": "triangle-down",
}
EVENT_STYLE = {  # kind -> (marker symbol, colour)
    "overflow": ("triangle-down", "#d62728"),
    "min_loss_scale": ("x", "#d62728"),
    "checkpoint": ("diamond", "#7f7f7f"),
    "resume": ("triangle-right", "#2ca02c"),
    "recovery": ("star", "#9467bd"),
    "nan_window": ("x", "#8c564b"),
    "crash": ("x-thin", "#000000"),
    "oom": ("x-thin", "#000000"),
    "eval": ("circle-open", "#17becf"),
}
STATUS_COLOR = {
    "completed": "#2ca02c",
    "recovered": "#17becf",
    "diverged": "#d62728",
    "crashed": "#000000",
    "running": "#1f77b4",
    "unknown": "#7f7f7f",
}


def colour_of(key: str) -> str:
    """A run's (or group's) colour, from its name alone: the same in every selection, after a
    reload and in a shared link, whatever else is drawn beside it."""
    return PALETTE[zlib.crc32(key.encode()) % len(PALETTE)]


def line_styles(keys: list[str]) -> dict[str, tuple[str, str]]:
    """(colour, dash) per run or group: the colour from the name (`colour_of`), solid lines;
    a name that shares its colour with an earlier one in `keys` is dotted (or dashed ...), so two
    lines that look alike differ in dash, and removing a run never restyles another that
    did not share its colour."""
    seen: dict[str, int] = {}
    out = {}
    for k in keys:
        c = colour_of(k)
        out[k] = (c, DASHES[seen.get(c, 0) % len(DASHES)])
        seen[c] = seen.get(c, 0) + 1
    return out


def tb_smooth(values: np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard's smoothing: a debiased EMA over the finite points in order; NaN/Inf pass
    through without advancing it; a constant series is left as it is."""
    v = np.asarray(values, dtype=np.float64)
    if weight <= 0 or len(v) == 0:
        return v.copy()
    finite = np.isfinite(v)
    all_finite = bool(finite.all())
    if not finite.any() or (all_finite and v[0] == v[-1] and v.min() == v.max()):
        return v.copy()
    x = v if all_finite else v[finite]
    ema = lfilter([1.0 - weight], [1.0, -weight], x)
    if weight < 1:  # debias only while weight**n still shows in a float64 (1 - 1e-17 == 1)
        m = min(len(ema), int(math.log(1e-17) / math.log(weight)) + 1)
        ema[:m] /= 1.0 - weight ** np.arange(1, m + 1)
    if all_finite:
        return ema
    out = v.copy()
    out[finite] = ema
    return out


def tb_smooth_many(series: list[np.ndarray], weight: float) -> list[np.ndarray]:
    """`tb_smooth` of each series; the finite, non-constant ones of one length in one filter
    call (a sweep's runs all log the same steps: 500 runs cost one pass, not 500 calls)."""
    out: list = [None] * len(series)
    by_len: dict[int, list[int]] = {}
    for i, v in enumerate(series):
        v = np.asarray(v, dtype=np.float64)
        if weight <= 0 or len(v) < 2 or not np.isfinite(v).all() or v.min() == v.max():
            out[i] = tb_smooth(v, weight)
        else:
            by_len.setdefault(len(v), []).append(i)
    for n, idx in by_len.items():
        block = np.stack([np.asarray(series[i], np.float64) for i in idx])
        block = lfilter([1.0 - weight], [1.0, -weight], block, axis=1)
        if weight < 1:
            m = min(n, int(math.log(1e-17) / math.log(weight)) + 1)
            block[:, :m] /= 1.0 - weight ** np.arange(1, m + 1)
        for row, i in enumerate(idx):
            out[i] = block[row]
    return out


def keep_index(y: np.ndarray, buckets: int = 1000) -> np.ndarray:
    """The points to draw, for display only: per bucket of consecutive points the first, min,
    max and last, in order, so spikes survive; every non-finite point too (NaN markers must not
    vanish). Buckets are equal runs of points (a reshape, two passes over the data)."""
    n = len(y)
    if n <= 4 * buckets:
        return np.arange(n)
    width = -(-n // buckets)
    finite = np.isfinite(y)
    all_finite = bool(finite.all())
    lo = y if all_finite else np.where(finite, y, np.inf)
    hi = y if all_finite else np.where(finite, y, -np.inf)
    full = n // width * width  # whole buckets as a reshape; the short last one on its own
    starts = np.arange(0, n, width)
    mins = np.r_[lo[:full].reshape(-1, width).argmin(1), lo[full:].argmin() if full < n else []]
    maxs = np.r_[hi[:full].reshape(-1, width).argmax(1), hi[full:].argmax() if full < n else []]
    keep = np.concatenate([starts, np.minimum(starts + width, n) - 1, starts + mins, starts + maxs])
    if not all_finite:
        keep = np.concatenate([keep, np.flatnonzero(~finite)])
    return np.unique(keep.astype(np.int64))


def downsample(x: np.ndarray, y: np.ndarray, buckets: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    """`keep_index` applied to a line."""
    i = keep_index(y, buckets)
    return x[i], y[i]


def compact(a: np.ndarray) -> np.ndarray:
    """The smallest dtype that draws the same: values as float32 (7 digits, finer than a pixel),
    whole numbers below 2**31 as int32; epoch milliseconds stay float64. Halves the message."""
    a = np.asarray(a)
    if a.dtype.kind in "iu":
        return a.astype(np.int32) if len(a) == 0 or (a.min() > -(2**31) and a.max() < 2**31) else a
    fin = a[np.isfinite(a)]
    return a.astype(np.float32) if len(fin) == 0 or np.abs(fin).max() < 1e9 else a


def prepare_curve(
    x: np.ndarray, y: np.ndarray, smoothing: float, buckets: int = 1000, smoothed: np.ndarray | None = None
) -> dict:
    """What one run's line needs on screen: smoothed over the full series (or `smoothed`, done
    by the caller over a longer one), then the raw and smoothed lines downsampled; NaN/Inf
    points kept apart as markers."""
    x, y = np.asarray(x), np.asarray(y, dtype=np.float64)
    smoothed = tb_smooth(y, smoothing) if smoothed is None else smoothed
    rx, ry = downsample(x, y, buckets)
    sx, sy = downsample(x, smoothed, buckets)
    bad = ~np.isfinite(y)
    return {
        "raw_x": compact(rx),
        "raw_y": compact(ry),
        "smooth_x": compact(sx),
        "smooth_y": compact(sy),
        "nan_x": x[bad],
        "nan_v": y[bad],
    }


def band(xs: list[np.ndarray], ys: list[np.ndarray], buckets: int = 500) -> dict | None:
    """A group of runs as W&B draws it, on one x grid shared by every run: each run's line is
    linearly interpolated onto the grid inside its own x range (never extrapolated), then the
    mean over the runs that reach each grid x, and the min..max over them as the band. The grid
    is every x some run logged when they are few (so at a step every run logged the mean is
    exactly the mean of the logged values), else `4 * buckets` even steps over the whole range.
    Runs logging at different steps (every step, every 10th) thus average like with like."""
    pairs = [(np.asarray(x, np.float64), np.asarray(y, np.float64)) for x, y in zip(xs, ys, strict=True)]
    pairs = [(x[np.isfinite(y) & np.isfinite(x)], y[np.isfinite(y) & np.isfinite(x)]) for x, y in pairs]
    pairs = [
        (x, y)
        if np.all(np.diff(x) >= 0)
        else (x[np.argsort(x, kind="stable")], y[np.argsort(x, kind="stable")])
        for x, y in pairs
        if len(x)
    ]
    if not pairs:
        return None
    grid = np.unique(np.concatenate([x for x, _ in pairs]))
    if len(grid) > 4 * buckets:
        grid = np.linspace(grid[0], grid[-1], 4 * buckets)
    total = np.zeros(len(grid))
    count = np.zeros(len(grid))
    lo = np.full(len(grid), np.inf)
    hi = np.full(len(grid), -np.inf)
    for x, y in pairs:
        inside = (grid >= x[0]) & (grid <= x[-1])
        v = np.interp(grid[inside], x, y)
        total[inside] += v
        count[inside] += 1
        lo[inside] = np.minimum(lo[inside], v)
        hi[inside] = np.maximum(hi[inside], v)
    has = count > 0
    return {
        "x": compact(grid[has]),
        "mean": compact(total[has] / count[has]),
        "lo": compact(lo[has]),
        "hi": compact(hi[has]),
        "runs": compact(count[has].astype(np.int64)),
    }


def time_unit(span_seconds: float) -> tuple[str, float]:
    """A unit for a relative-time axis that keeps its numbers readable."""
    for name, size, upto in (("s", 1, 120), ("min", 60, 7200), ("h", 3600, 3 * 86400)):
        if span_seconds <= upto:
            return name, size
    return "days", 86400


def outlier_range(values: np.ndarray, log_y: bool = False) -> list[float] | None:
    """TensorBoard's outlier-ignoring domain: the 5th..95th percentile of the values, padded by
    10 % (log10 units for a log axis)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if log_y:
        v = np.log10(v[v > 0])
    if len(v) < 10:
        return None
    lo, hi = np.percentile(v, [5, 95])
    if hi <= lo:
        return None
    pad = 0.1 * (hi - lo)
    return [float(lo - pad), float(hi + pad)]


def curve_figure(
    title: str,
    lines: list[dict],
    *,
    smoothing: float = 0.6,
    log_y: bool = False,
    x_title: str = "step",
    x_is_date: bool = False,
    alerts: Sequence[dict] = (),
    events: Sequence[dict] = (),
    vlines: Sequence[tuple[float, str]] = (),
    ignore_outliers: bool = True,
    show_raw: bool = True,
    legend_lines: bool = False,
    height: int = 340,
    highlight: Sequence[str] = (),
    hide_others: bool = False,
) -> go.Figure:
    """One chart: one line per run (or group) with its faint raw line behind, NaN/Inf markers
    pinned to the top edge, points replaced by a resume, group bands, alert and event markers.

    `lines`: dicts with name, color, dash and the arrays of `prepare_curve` (optionally sup_x and
    sup_y for replaced points, band for a group). `alerts`/`events` are placed by the caller, in
    this chart's x units and on this chart's curve (x, y; alerts also x0, x1). `vlines`: (x, text)
    drawn as dashed verticals (resumes on a stitched curve). Names and the title are shown as
    text (plotly's HTML subset escaped).

    Up to LEGEND_MAX lines each is a trace of its own with `legend_lines` (click a name to hide
    it, double-click to solo it; its colour stays); beyond, the lines of one colour are drawn as
    one trace (a sweep of 500 runs is 20 traces, not 1000) without raw lines, and the hover names
    the nearest line; the lines named in `highlight` are drawn on top of them as traces of
    their own (by `key`, else name), with a legend (click to hide, double-click to solo), and the
    rest faint, or not at all with `hide_others`. The hover lists every line at the hovered x only while they are few.
    """
    fig = go.Figure()
    legend_seen: set[str] = set()

    def legend(group: str) -> dict:
        first = group not in legend_seen
        legend_seen.add(group)
        return {"legendgroup": group, "showlegend": first, "name": txt(group)}

    bundled = len(lines) > LEGEND_MAX
    legend_lines = legend_lines and not bundled
    for ln in lines:
        if ln.get("band") is None:
            continue
        b = ln["band"]
        fig.add_trace(
            go.Scatter(
                x=np.r_[b["x"], b["x"][::-1]],
                y=np.r_[b["hi"], b["lo"][::-1]],
                fill="toself",
                fillcolor=ln["color"],
                opacity=0.18,
                line={"width": 0},
                hoverinfo="skip",
                showlegend=False,
                legendgroup=ln["name"],
            )
        )
    own = lines
    if bundled:
        wanted = set(highlight)
        own = [ln for ln in lines if ln.get("key", ln["name"]) in wanted]
        rest = [ln for ln in lines if ln.get("key", ln["name"]) not in wanted]
        if not (own and hide_others):
            _add_bundles(fig, rest, opacity=0.3 if own else 1.0)
        if own and hide_others:
            lines = own  # what is not drawn does not set the y range either
        legend_lines = bool(own)
    for ln in own:
        line = {"color": ln["color"], "dash": ln.get("dash", "solid")}
        name = txt(ln["name"])
        if show_raw and smoothing > 0 and len(ln.get("raw_x", ())):
            fig.add_trace(
                go.Scatter(
                    x=ln["raw_x"],
                    y=ln["raw_y"],
                    mode="lines",
                    line={**line, "width": 1},
                    opacity=0.25,
                    hoverinfo="skip",
                    showlegend=False,
                    legendgroup=ln["name"],
                )
            )
        fig.add_trace(
            go.Scatter(
                x=ln["smooth_x"],
                y=ln["smooth_y"],
                mode="lines",
                line={**line, "width": 2.5 if bundled else 2},
                name=name,
                legendgroup=ln["name"],
                showlegend=legend_lines,
                hovertemplate=f"{name}: %{{y:.5g}}<extra></extra>",
            )
        )
    visible = [np.asarray(ln["smooth_y"], np.float64) for ln in lines]
    for ln in lines:
        if len(ln.get("sup_x", ())):
            fig.add_trace(
                go.Scatter(
                    x=ln["sup_x"],
                    y=ln["sup_y"],
                    mode="markers",
                    marker={"color": ln["color"], "size": 4, "symbol": "circle-open"},
                    hovertemplate=f"{txt(ln['name'])} (replaced by a resume): %{{y:.5g}}<extra></extra>",
                    **legend("replaced by a resume"),
                )
            )
    values = np.concatenate(visible) if visible else np.array([])
    y_range = outlier_range(values, log_y) if ignore_outliers else None
    finite = values[np.isfinite(values) & ((values > 0) if log_y else True)]
    if y_range is not None:
        top = 10 ** y_range[1] if log_y else y_range[1]
    else:
        top = float(finite.max()) if len(finite) else 1.0
    for ln in lines:  # NaN/Inf markers on the top edge, drawn over it rather than clipped
        if len(ln.get("nan_x", ())):
            fig.add_trace(
                go.Scatter(
                    x=ln["nan_x"],
                    y=np.full(len(ln["nan_x"]), top),
                    mode="markers",
                    marker={"symbol": "x", "color": ln["color"], "size": 9, "line": {"width": 1}},
                    cliponaxis=False,
                    text=[f"{txt(ln['name'])}: {v}" for v in ln["nan_v"]],
                    hovertemplate="%{text}<extra></extra>",
                    **legend("NaN/Inf"),
                )
            )
    _add_alerts(fig, alerts, legend)
    _add_events(fig, events, legend)
    for x, text in vlines:
        fig.add_vline(
            x=x,
            line={"dash": "dash", "color": "#555", "width": 1},
            annotation={"text": txt(text), "textangle": -90, "font": {"size": 10}},
            annotation_position="top left",
        )
    n_legend = len(legend_seen) + (len(own) if legend_lines else 0)
    legend_rows = math.ceil(n_legend / 4)
    fig.update_layout(
        title={
            "text": txt(title),
            "font": {"size": 14},
            "x": 0,
            "xanchor": "left",
            "y": 0.98,
            "yanchor": "top",
        },
        height=height + (20 * legend_rows if legend_lines else 0),
        margin={"l": 55, "r": 15, "t": 40, "b": 45},
        legend={  # below the chart: many names wrap there without covering the title or the curves
            "orientation": "h",
            "x": 0,
            "xanchor": "left",
            "y": -0.14,
            "yanchor": "top",
            "font": {"size": 11},
        },
        showlegend=bool(n_legend),
        hovermode="x unified" if len(lines) <= UNIFIED_HOVER_MAX else "closest",
        hoversort="value descending",  # the unified hover lists the lines top to bottom as drawn
        hoverlabel={"namelength": -1},
        uirevision=title,  # a box zoom survives every control change that keeps the chart
    )
    if legend_lines:
        fig.update_layout(margin={"b": 60 + 20 * legend_rows})
    fig.update_xaxes(title_text=x_title, type="date" if x_is_date else None)
    fig.update_yaxes(**_y_axis(finite, y_range, log_y))
    return fig


def _add_bundles(fig: go.Figure, lines: list[dict], opacity: float = 1.0) -> None:
    """The lines of each colour as one trace, separated by gaps; each point's hover names its line."""
    by_colour: dict[str, list[dict]] = {}
    for ln in lines:
        by_colour.setdefault(ln["color"], []).append(ln)
    for colour, group in by_colour.items():
        xs: list[np.ndarray] = []
        ys: list[np.ndarray] = []
        names = []
        for ln in group:
            xs += [np.asarray(ln["smooth_x"], np.float64), np.array([np.nan])]
            ys += [np.asarray(ln["smooth_y"], np.float64), np.array([np.nan])]
            names.append(np.full(len(ln["smooth_x"]) + 1, txt(ln["name"])))
        fig.add_trace(
            go.Scatter(
                x=compact(np.concatenate(xs)),
                y=compact(np.concatenate(ys)),
                mode="lines",
                line={"color": colour, "width": 1.5},
                opacity=opacity,
                connectgaps=False,
                text=np.concatenate(names),  # an array: plotly takes it whole, a list item by item
                name=f"{len(group)} lines",
                showlegend=False,
                hovertemplate="%{text}: %{y:.5g}<extra></extra>",
            )
        )


def _y_axis(finite: np.ndarray, y_range: list[float] | None, log_y: bool) -> dict:
    """Log axes label decades only once they span more than one (plotly otherwise prints every
    2..9 between them); the outlier-ignoring range when asked."""
    out: dict = {}
    if y_range is not None:
        out["range"] = y_range
    if log_y:
        out["type"] = "log"
        if y_range is not None:
            decades = y_range[1] - y_range[0]
        else:
            pos = finite[finite > 0]
            decades = float(np.log10(pos.max() / pos.min())) if len(pos) else 0.0
        if decades > 1.5:
            out.update(dtick=1, minor={"ticks": "inside", "showgrid": True}, exponentformat="power")
        else:
            out.update(dtick="D2")
    return out


def alert_symbol(family: str, backtest: bool = False) -> str:
    """One marker shape per rule family (the same on every chart; a family the app does not
    know gets one from its name); a backtest's alarms open, stored alerts filled."""
    shape = FAMILY_SYMBOLS.get(family) or ALERT_SYMBOLS[zlib.crc32(family.encode()) % len(ALERT_SYMBOLS)]
    return shape + "-open" if backtest else shape


def _add_alerts(fig: go.Figure, alerts, legend) -> None:
    """Alert intervals as shaded bands (only while few: more would hide the curves) and a
    marker where each fired, on its run's curve of this chart: one trace (and legend entry) per
    rule, its shape its family's (an alert's `family`, else `other`), filled in the run's colour,
    the legend's rules under their family's title (a click there hides the family); a
    backtest's alarms: named as the caller names them, open."""
    bands = len(alerts) <= 10
    for a in alerts:
        if bands and a.get("x0") is not None and a.get("x1") is not None:
            fig.add_vrect(x0=a["x0"], x1=a["x1"], fillcolor=a["color"], opacity=0.08, line_width=0)
    by_rule: dict[tuple[str, bool], list[dict]] = {}
    for a in alerts:
        by_rule.setdefault((a["rule"], bool(a.get("backtest"))), []).append(a)
    titled: set[str] = set()
    for (rule, backtest), marks in sorted(by_rule.items(), key=lambda kv: (_family(kv[1]), kv[0])):
        family = _family(marks)
        if backtest:
            named = legend(rule)
        else:
            named = {**legend(f"alert {rule}"), "legendgroup": f"alerts: {family}"}  # counted in the legend
            if family not in titled:
                named["legendgrouptitle"] = {"text": txt(f"alerts: {family}")}
                titled.add(family)
        fig.add_trace(
            go.Scatter(
                x=[a["x"] for a in marks],
                y=[a["y"] if a.get("y") is not None and math.isfinite(a["y"]) else None for a in marks],
                mode="markers",
                marker={
                    "symbol": alert_symbol(family, backtest),
                    "size": 11,
                    "color": [a["color"] for a in marks],
                    "line": {"width": 1.5, "color": [a["color"] if backtest else "black" for a in marks]},
                },
                cliponaxis=False,
                text=[
                    f"<b>{'live ' if a.get('live') else ''}{'backtest alarm' if backtest else 'alert'} "
                    f"{txt(rule)}</b> ({txt(family)}) · {txt(a['run'])}<br>{txt(a.get('message') or '')}"
                    for a in marks
                ],
                hovertemplate="%{text}<extra></extra>",
                **named,
            )
        )


def _family(marks: list[dict]) -> str:
    return str(marks[0].get("family") or "other")


def _add_events(fig: go.Figure, events, legend) -> None:
    """Events as one marker trace per kind, each on its run's curve (outlined in the run's colour)."""
    by_kind: dict[str, list] = {}
    for e in events:
        by_kind.setdefault(e["kind"], []).append(e)
    for kind, evs in sorted(by_kind.items()):
        symbol, color = EVENT_STYLE.get(kind, ("circle", "#444444"))
        fig.add_trace(
            go.Scatter(
                x=[e["x"] for e in evs],
                y=[e["y"] for e in evs],
                mode="markers",
                marker={
                    "symbol": symbol,
                    "size": 9,
                    "color": color,
                    "line": {"width": 1.5, "color": [e["color"] for e in evs]},
                },
                cliponaxis=False,
                text=[f"{txt(kind)} · {txt(e['run'])}<br>{txt((e.get('message') or '')[:160])}" for e in evs],
                hovertemplate="%{text}<extra></extra>",
                **legend(kind),
            )
        )


def sweep_figure(rows: list[dict]) -> go.Figure:
    """Recall against false alarms per 1k steps, one line per rule over its sweep points."""
    fig = go.Figure()
    by_rule: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("recall") is not None:
            by_rule.setdefault(r["rule"], []).append(r)
    for rule, pts in by_rule.items():
        pts = sorted(pts, key=lambda r: r["false_alarms_per_1k"] or 0.0)
        fig.add_trace(
            go.Scatter(
                x=[p["false_alarms_per_1k"] or 0.0 for p in pts],
                y=[p["recall"] for p in pts],
                mode="lines+markers" if len(pts) > 1 else "markers",
                name=txt(rule),
                text=[txt(p["params"]) for p in pts],
                hovertemplate=f"<b>{txt(rule)}</b><br>%{{text}}<br>FA/1k %{{x:.3g}} · recall %{{y:.0%}}<extra></extra>",
            )
        )
    fig.update_layout(
        xaxis_title="false alarms per 1k steps",
        yaxis_title="recall",
        yaxis_tickformat=".0%",
        height=420,
        margin={"l": 50, "r": 20, "t": 30, "b": 40},
    )
    return fig


def verdict_figure(rows: list[dict]) -> go.Figure:
    """The backtest's verdict at a glance: per rule (its first sweep point), the share of failed
    runs it fired on beside the share of healthy runs, best separation on top; false alarms per
    1k steps and the median lead in the hover."""
    first: dict[str, dict] = {}
    for r in rows:
        first.setdefault(r["rule"], r)
    rules = sorted(
        first.values(),
        key=lambda r: (
            (r.get("trigger_rate_failed") or 0.0) - (r.get("trigger_rate_healthy") or 0.0),
            r["rule"],
        ),
    )  # ascending: plotly draws the first category at the bottom
    names = [txt(r["rule"]) for r in rules]
    detail = [
        f"FA/1k {_fmt(r.get('false_alarms_per_1k'))} · lead {_fmt(r.get('lead_time_median'))} steps"
        for r in rules
    ]
    fig = go.Figure()
    for col, label, colour in (
        ("trigger_rate_healthy", "healthy runs triggered (false alarms)", "#d62728"),
        ("trigger_rate_failed", "failed runs triggered", "#2ca02c"),
    ):
        fig.add_trace(
            go.Bar(
                y=names,
                x=[r.get(col) or 0.0 for r in rules],
                orientation="h",
                name=label,
                marker_color=colour,
                text=detail,
                hovertemplate=f"<b>%{{y}}</b><br>{label}: %{{x:.0%}}<br>%{{text}}<extra></extra>",
                textposition="none",
            )
        )
    fig.update_layout(
        barmode="group",
        xaxis={"title": "share of labelled runs the rule fired on", "tickformat": ".0%", "range": [0, 1]},
        height=max(260, 22 * len(rules) + 110),
        legend={"orientation": "h", "y": 1.02, "yanchor": "bottom"},
        margin={"l": 10, "r": 20, "t": 40, "b": 40},
    )
    fig.update_yaxes(automargin=True)
    return fig


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.3g}"


def distribution_figure(steps: np.ndarray, pct: np.ndarray, title: str, colour: str) -> go.Figure:
    """TensorBoard's Distributions chart: the histogram's percentiles over steps (`pct`: one
    column per `histograms.BASIS_POINTS`) as nested bands, darker towards the median, and the
    median as a line."""
    fig = go.Figure()
    n = pct.shape[1]
    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    for k in range(n // 2):  # outermost band first, so the inner ones lie on top
        lo, hi = pct[:, k], pct[:, n - 1 - k]
        fig.add_trace(
            go.Scatter(
                x=np.r_[steps, steps[::-1]],
                y=np.r_[hi, lo[::-1]],
                fill="toself",
                fillcolor=f"rgba({r},{g},{b},{0.12 + 0.14 * k:.2f})",
                line={"width": 0},
                hoverinfo="skip",
                showlegend=False,
            )
        )
    fig.add_trace(
        go.Scatter(
            x=steps,
            y=pct[:, n // 2],
            mode="lines",
            line={"color": colour, "width": 1.5},
            name="median",
            customdata=np.c_[pct[:, 0], pct[:, n - 1]],
            hovertemplate="step %{x}<br>median %{y:.4g}<br>min %{customdata[0]:.4g} · max %{customdata[1]:.4g}<extra></extra>",
            showlegend=False,
        )
    )
    fig.update_layout(
        title={"text": txt(title), "font": {"size": 13}},
        xaxis_title="step",
        height=300,
        margin={"l": 50, "r": 10, "t": 40, "b": 40},
    )
    return fig


def histogram_figure(
    steps: np.ndarray,
    centres: np.ndarray,
    counts: np.ndarray,
    title: str,
    offset: bool,
    colour: str = PALETTE[0],
) -> go.Figure:
    """TensorBoard's Histograms chart: one line per step (`counts`: one row per step on the
    common bins whose centres are `centres`), the oldest at the back and palest; `offset` stacks
    them by step as TensorBoard's offset mode does, else they overlay."""
    fig = go.Figure()
    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    top = float(np.nanmax(counts)) if counts.size else 1.0
    lift = top * 2.0 / max(len(steps), 1) if offset else 0.0  # the whole stack ~3 peaks high
    for j in range(len(steps)):  # the oldest first: at the back
        shade = 0.25 + 0.75 * (j / max(len(steps) - 1, 1))  # newest darkest
        base = lift * (len(steps) - 1 - j)  # the oldest highest, the newest in front
        x, y = centres, counts[j] + base
        if offset:  # a closed outline, lightly filled (readable on a light or a dark theme)
            x, y = np.r_[centres[:1], centres, centres[-1:]], np.r_[base, y, base]
        fig.add_trace(
            go.Scatter(
                x=x,
                y=y,
                mode="lines",
                line={"color": f"rgba({r},{g},{b},{shade:.2f})", "width": 1},
                fill="toself" if offset else None,
                fillcolor=f"rgba({r},{g},{b},0.15)" if offset else None,
                name=f"step {int(steps[j])}",
                text=np.r_[0.0, counts[j], 0.0] if offset else counts[j],
                hovertemplate=f"step {int(steps[j])}<br>%{{x:.4g}}: %{{text:.4g}}<extra></extra>",
                showlegend=False,
            )
        )
    sample_ticks = sorted({round(k) for k in np.linspace(0, len(steps) - 1, min(len(steps), 5))})
    fig.update_layout(
        title={"text": txt(title), "font": {"size": 13}},
        height=300,
        margin={"l": 50, "r": 10, "t": 40, "b": 40},
        yaxis=(
            {  # the step of a few of the stacked lines, at their baselines
                "tickvals": [lift * (len(steps) - 1 - j) for j in sample_ticks],
                "ticktext": [f"step {int(steps[j])}" for j in sample_ticks],
                "showgrid": False,
            }
            if offset
            else {"title": "count"}
        ),
        hovermode="closest",
    )
    return fig


def lineage_figure(runs: list[dict], edges: list[dict]) -> go.Figure:
    """Runs as nodes coloured by status (with a legend), continuation edges between them; a run
    that resumed itself is drawn as a chain of its writer segments, one node per resume."""
    cross = [e for e in edges if e["child_run"] != e["parent_run"]]
    resumes: dict[str, list[dict]] = {}
    for e in sorted(edges, key=lambda e: (e["child_run"], e.get("child_segment") or 0)):
        if e["child_run"] == e["parent_run"]:
            resumes.setdefault(e["child_run"], []).append(e)
    involved = sorted({e["child_run"] for e in edges} | {e["parent_run"] for e in edges})
    parent = {e["child_run"]: e["parent_run"] for e in cross}

    def depth(r, seen=()):
        return 0 if r not in parent or r in seen else 1 + depth(parent[r], (*seen, r))

    pos: dict[str, tuple[int, int]] = {}
    rows_at: dict[int, int] = {}
    for r in involved:
        d = depth(r)
        pos[r] = (d, rows_at.get(d, 0))
        rows_at[d] = rows_at.get(d, 0) + 1
    info = {r["run_id"]: r for r in runs}
    fig = go.Figure()

    def edge(p0, p1, label, hover):
        fig.add_trace(
            go.Scatter(
                x=[p0[0], p1[0]],
                y=[p0[1], p1[1]],
                mode="lines",
                line={"color": "#999", "width": 2},
                hoverinfo="skip",
                showlegend=False,
            )
        )
        fig.add_trace(
            go.Scatter(
                x=[(p0[0] + p1[0]) / 2],
                y=[(p0[1] + p1[1]) / 2],
                mode="markers+text",
                text=[label],
                textposition="top center",
                marker={"size": 6, "color": "#999"},
                showlegend=False,
                hovertext=[hover],
                hoverinfo="text",
            )
        )

    for e in cross:
        edge(
            pos[e["parent_run"]],
            pos[e["child_run"]],
            txt(f"{e['kind']} @ {e['parent_step']}"),
            txt(e["evidence"]),
        )
    nodes: list[tuple[float, float, str, str, str]] = []  # (x, y, label, run, hover)
    for r in involved:
        x, y = pos[r]
        chain = resumes.get(r, [])
        st = info.get(r) or {}
        hover = (
            txt(f"{r}")
            + f"<br>status {st.get('status')}<br>steps {st.get('first_step')}–{st.get('last_step')}"
        )
        nodes.append((x, y, txt(r if not chain else f"{r} · segment 0"), r, hover))
        for k, e in enumerate(chain, 1):
            p0 = (x + 0.45 * (k - 1) / len(chain), y)
            p1 = (x + 0.45 * k / len(chain), y)
            edge(p0, p1, f"resume @ {e['parent_step']}", txt(e["evidence"]))
            nodes.append((*p1, f"segment {e.get('child_segment', k)}", r, f"{hover}<br>{txt(e['evidence'])}"))
    statuses = [(info.get(n[3]) or {}).get("status") or "unknown" for n in nodes]
    fig.add_trace(
        go.Scatter(
            x=[n[0] for n in nodes],
            y=[n[1] for n in nodes],
            mode="markers+text",
            text=[n[2] for n in nodes],
            textposition="bottom center",
            marker={"size": 22, "color": [STATUS_COLOR.get(s, "#7f7f7f") for s in statuses]},
            hovertext=[n[4] for n in nodes],
            hoverinfo="text",
            showlegend=False,
        )
    )
    for s in sorted(set(statuses)):  # the legend of node colours
        fig.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="markers",
                marker={"size": 12, "color": STATUS_COLOR.get(s, "#7f7f7f")},
                name=s,
            )
        )
    depth_max = max((n[0] for n in nodes), default=0)
    rows_max = max(rows_at.values(), default=1)
    fig.update_layout(
        height=180 + 90 * rows_max,
        margin={"l": 20, "r": 20, "t": 40, "b": 20},
        xaxis={"visible": False, "range": [-0.6, depth_max + 0.6]},
        yaxis={"visible": False, "range": [rows_max - 0.4, -0.6]},
        legend={"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom", "title": {"text": "status"}},
    )
    return fig


def parallel_figure(rows: list[dict], dims: list[str], color_by: str) -> go.Figure:
    """Parallel coordinates of runs: one axis per config key (categories get named ticks) and the
    colour (final loss, or any numeric column) on the last axis too."""
    dimensions = []
    for d in [*dims, color_by]:
        vals = [r.get(d) for r in rows]
        nums = [v for v in vals if isinstance(v, int | float) and not isinstance(v, bool)]
        if len(nums) == sum(v is not None for v in vals) and nums:
            dimensions.append({"label": txt(d), "values": [v if v is not None else math.nan for v in vals]})
        else:
            cats = sorted({str(v) for v in vals})
            code = {c: i for i, c in enumerate(cats)}
            dimensions.append(
                {
                    "label": txt(d),
                    "values": [code[str(v)] for v in vals],
                    "tickvals": list(range(len(cats))),
                    "ticktext": [txt(c[:18]) for c in cats],
                }
            )
    last = dimensions[-1]
    line = {
        "color": last["values"],
        "colorscale": "Viridis",
        "showscale": True,
        "colorbar": {"title": color_by},
    }
    if "ticktext" in last:  # categories (label, status): one flat colour each, named on the bar
        n = len(last["ticktext"])
        colours = [PALETTE[i % len(PALETTE)] for i in range(n)]
        line["colorscale"] = (
            [[edge, c] for i, c in enumerate(colours) for edge in (i / n, (i + 1) / n)]
            if n > 1
            else [[0, colours[0]], [1, colours[0]]]
        )
        line.update(cmin=-0.5, cmax=n - 0.5)
        line["colorbar"] = {"title": color_by, "tickvals": last["tickvals"], "ticktext": last["ticktext"]}
    fig = go.Figure(go.Parcoords(dimensions=dimensions, line=line, labelangle=-15, labelside="top"))
    fig.update_layout(height=440, margin={"l": 60, "r": 60, "t": 90, "b": 30})
    return fig


def layer_families(tags: list[str], least: int = 3) -> dict[str, dict[int, str]]:
    """`…layer_N…` tags by family (the tag with its layer number as `*`): layer -> tag, for
    families of at least `least` layers (gradient-norm flow, attention entropy, FFN statistics)."""
    import polars as pl

    parts = pl.Series(tags, dtype=pl.String).str.extract_groups(r"^(.*?layers?[_./-]?)(\d+)(\D.*)?$")
    out: dict[str, dict[int, str]] = {}
    for tag, p in zip(tags, parts.to_list(), strict=True):
        if p["2"] is not None:
            out.setdefault(f"{p['1']}*{p['3'] or ''}", {})[int(p["2"])] = tag
    return {f: dict(sorted(layers.items())) for f, layers in out.items() if len(layers) >= least}


THRESHOLD_SYMBOLS = ["x-thin-open", "cross-thin-open", "asterisk-open", "y-up-open"]
COMPARE = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal}


def layer_heatmap(
    title: str,
    layers: dict[int, tuple[np.ndarray, np.ndarray]],
    bins: int = 200,
    thresholds: Sequence[dict] = (),
) -> go.Figure:
    """One run's layer family as a heatmap, layer (y) by step (x): each layer's current points
    averaged in `bins` equal step bins over the family's whole range (an empty bin stays blank).
    Colour on a log10 scale when every value is positive and they span over two decades (as
    gradient norms do), so a vanishing or exploding layer stands out.

    `thresholds` ({op, value, text[, ratio]}, as `data.layer_thresholds` gives the guides'): each
    marks the cells whose mean is past it (with `ratio` (a, b): layer a's cells where a's mean
    over b's is), one marker shape per threshold named in the legend; a plain one is also a
    tick on the colour bar."""
    finite = [(n, s[np.isfinite(v)], v[np.isfinite(v)]) for n, (s, v) in layers.items()]
    finite = [(n, s, v) for n, s, v in finite if len(s)]
    if not finite:
        return go.Figure()
    lo = min(float(s.min()) for _, s, _ in finite)
    hi = max(float(s.max()) for _, s, _ in finite)
    edges = np.linspace(lo, hi if hi > lo else lo + 1, bins + 1)
    z = np.full((len(finite), bins), np.nan)
    for row, (_, s, v) in enumerate(finite):
        b = np.clip(np.searchsorted(edges, s, "right") - 1, 0, bins - 1)
        count = np.bincount(b, minlength=bins)
        has = count > 0
        z[row, has] = np.bincount(b, v, minlength=bins)[has] / count[has]
    every = np.concatenate([v for _, _, v in finite])
    log = bool(every.min() > 0 and every.max() / every.min() > 100)
    fig = go.Figure(
        go.Heatmap(
            z=np.log10(z) if log else z,
            x=(edges[:-1] + edges[1:]) / 2,
            y=[n for n, _, _ in finite],
            colorscale="Viridis",
            colorbar={"title": "log10 value" if log else "value"},
            hovertemplate="layer %{y} · step %{x:.0f}: %{z:.4g}<extra></extra>",
        )
    )
    centres = (edges[:-1] + edges[1:]) / 2
    marked = len(thresholds)
    row_of = {n: row for row, (n, _, _) in enumerate(finite)}
    for i, t in enumerate(thresholds):
        with np.errstate(invalid="ignore", divide="ignore"):
            if "ratio" in t:  # two layers' ratio, marked on the first of them
                a, b = (row_of.get(n) for n in t["ratio"])
                past = np.zeros_like(z, dtype=bool)
                if a is not None and b is not None:
                    past[a] = COMPARE[t["op"]](z[a] / z[b], t["value"]) & np.isfinite(z[a] / z[b])
            else:
                past = COMPARE[t["op"]](z, t["value"]) & np.isfinite(z)
        rows, cols = np.nonzero(past)
        fig.add_trace(  # named in the legend even where no cell is past it (a trace without points is not)
            go.Scatter(
                x=centres[cols] if len(rows) else [None],
                y=[finite[r][0] for r in rows] if len(rows) else [None],
                mode="markers",
                marker={
                    "symbol": THRESHOLD_SYMBOLS[i % len(THRESHOLD_SYMBOLS)],
                    "size": 7,
                    "color": "#d62728",
                },
                name=f"{txt(t['text'])} ({len(rows)} cells)",
                hovertemplate=f"{txt(t['text'])}<br>layer %{{y}} · step %{{x:.0f}}<extra></extra>",
            )
        )
    if marked:
        shown = np.log10(z) if log else z
        z_lo, z_hi = float(np.nanmin(shown)), float(np.nanmax(shown))
        marks = [
            (v, str(t.get("rule", t["text"])))
            for t in thresholds
            if "ratio" not in t and (not log or t["value"] > 0)
            if z_lo <= (v := math.log10(t["value"]) if log else t["value"]) <= z_hi
        ]
        if marks:  # the thresholds inside the colour range, named on the bar; plain ticks clear of them
            gap = 0.08 * (z_hi - z_lo)
            plain = [v for v in np.linspace(z_lo, z_hi, 5) if all(abs(v - m) > gap for m, _ in marks)]
            fig.data[0].colorbar.update(
                tickvals=[*plain, *(v for v, _ in marks)],
                ticktext=[*(f"{v:.3g}" for v in plain), *(f"◀ {txt(n)}" for _, n in marks)],
            )
    fig.update_layout(
        title={"text": txt(title), "font": {"size": 14}, "x": 0},
        height=120 + 14 * len(finite) + (24 * marked if marked else 0),
        margin={"l": 55, "r": 15, "t": 40, "b": 40 + (24 * marked if marked else 0)},
        xaxis_title="step",
        yaxis_title="layer",
        showlegend=bool(marked),
        legend={  # at the figure's foot, below the axis title, whatever the figure's height
            "orientation": "h",
            "x": 0,
            "y": 0,
            "yref": "container",
            "yanchor": "bottom",
            "font": {"size": 11},
        },
    )
    return fig
