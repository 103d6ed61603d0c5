"""Pure figure builders for the app (plotly); no Streamlit here, so they are unit-tested directly."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from scipy.signal import lfilter

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
    "#393b79",
    "#e6550d",
    "#31a354",
    "#756bb1",
    "#636363",
    "#843c39",
]
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


def run_color(run_id: str) -> str:
    """The same colour for a run whatever else is selected (a hash of its id)."""
    return PALETTE[int(hashlib.sha1(run_id.encode()).hexdigest(), 16) % len(PALETTE)]


def tb_smooth(values: np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard's smoothing: a debiased EMA over the finite points in order; NaN/Inf pass
    through without advancing it; a constant series is left as it is."""
    v = np.asarray(values, dtype=np.float64)
    out = v.copy()
    if weight <= 0 or len(v) == 0:
        return out
    finite = np.isfinite(v)
    if not finite.any() or (finite.all() and np.all(v == v[0])):
        return out
    x = v[finite]
    ema = lfilter([1.0 - weight], [1.0, -weight], x)
    n = np.arange(1, len(x) + 1)
    out[finite] = ema / (1.0 - weight**n) if weight < 1 else ema
    return out


def downsample(x: np.ndarray, y: np.ndarray, buckets: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    """For display only: per bucket the first, min, max and last point, in x order, so spikes
    survive; every non-finite point is kept (NaN markers must not vanish)."""
    n = len(x)
    if n <= 4 * buckets:
        return x, y
    edges = np.linspace(0, n, buckets + 1).astype(np.int64)
    finite = np.isfinite(y)
    keep = np.zeros(n, dtype=bool)
    keep[edges[:-1]] = True
    keep[edges[1:] - 1] = True
    keep[~finite] = True
    y_lo = np.where(finite, y, np.inf)
    y_hi = np.where(finite, y, -np.inf)
    starts = edges[:-1]
    mins = np.minimum.reduceat(y_lo, starts)
    maxs = np.maximum.reduceat(y_hi, starts)
    bucket = np.repeat(np.arange(buckets), np.diff(edges))
    keep |= finite & ((y == mins[bucket]) | (y == maxs[bucket]))
    return x[keep], y[keep]


def prepare_curve(
    x: np.ndarray, y: np.ndarray, superseded: np.ndarray | None, smoothing: float, buckets: int = 2000
) -> dict:
    """What a curve needs on screen: the current points smoothed over the full series, then the
    raw and smoothed lines downsampled; NaN/Inf and superseded points kept apart as markers."""
    x, y = np.asarray(x), np.asarray(y, dtype=np.float64)
    sup = np.zeros(len(x), dtype=bool) if superseded is None else np.asarray(superseded, dtype=bool)
    cur = ~sup
    smoothed = tb_smooth(y[cur], smoothing)
    rx, ry = downsample(x[cur], y[cur], buckets)
    sx, sy = downsample(x[cur], smoothed, buckets)
    bad = ~np.isfinite(y) & cur
    finite = np.isfinite(y)
    return {
        "raw_x": rx,
        "raw_y": ry,
        "smooth_x": sx,
        "smooth_y": sy,
        "nan_x": x[bad],
        "nan_v": y[bad],
        "top": float(np.max(y[finite])) if finite.any() else 0.0,
        "sup_x": x[sup],
        "sup_y": y[sup],
    }


def curves_figure(
    series: list[dict],
    *,
    smoothing: float = 0.6,
    log_y: bool = False,
    x_title: str = "step",
    facet: bool = True,
    show_raw: bool = True,
    alerts: list[dict] = (),
    events: list[dict] = (),
    buckets: int = 2000,
    height_per_row: int = 320,
    ignore_outliers: bool = True,
) -> go.Figure:
    """Curves of many runs and tags. `series`: dicts run_id, tag and either x, y (numpy) with an
    optional `superseded` mask, or `curve` from prepare_curve (cached by the app)."""
    tags = list(dict.fromkeys(s["tag"] for s in series))
    rows = len(tags) if facet else 1
    fig = make_subplots(
        rows=max(rows, 1),
        cols=1,
        shared_xaxes=True,
        subplot_titles=tags if facet else None,
        vertical_spacing=min(0.08, 0.3 / max(rows, 1)),
    )
    shown_in_legend = set()
    row_values: dict[int, list[np.ndarray]] = {}
    nan_traces: list[tuple[int, int]] = []  # (trace index, row): moved to the top of the visible range
    for s in series:
        row = tags.index(s["tag"]) + 1 if facet else 1
        color = run_color(s["run_id"])
        c = s.get("curve") or prepare_curve(s["x"], s["y"], s.get("superseded"), smoothing, buckets)
        name = s["run_id"] if facet else f"{s['run_id']} · {s['tag']}"
        if show_raw and smoothing > 0:
            fig.add_trace(
                go.Scattergl(
                    x=c["raw_x"],
                    y=c["raw_y"],
                    mode="lines",
                    line={"color": color, "width": 1},
                    opacity=0.25,
                    name=name,
                    legendgroup=name,
                    showlegend=False,
                    hoverinfo="skip",
                ),
                row=row,
                col=1,
            )
        fig.add_trace(
            go.Scattergl(
                x=c["smooth_x"],
                y=c["smooth_y"],
                mode="lines",
                line={"color": color, "width": 2},
                name=name,
                legendgroup=name,
                showlegend=name not in shown_in_legend,
                hovertemplate=f"{name}<br>{s['tag']}<br>%{{x}}: %{{y:.5g}}<extra></extra>",
            ),
            row=row,
            col=1,
        )
        shown_in_legend.add(name)
        row_values.setdefault(row, []).append(c["smooth_y"][np.isfinite(c["smooth_y"])])
        if len(c["nan_x"]):  # NaN/Inf markers at the top of the plot, so they are seen
            nan_traces.append((len(fig.data), row))
            fig.add_trace(
                go.Scatter(
                    x=c["nan_x"],
                    y=np.full(len(c["nan_x"]), c["top"]),
                    mode="markers",
                    name=f"{name} NaN/Inf",
                    marker={"symbol": "x", "color": color, "size": 9},
                    legendgroup=name,
                    showlegend=False,
                    text=[str(v) for v in c["nan_v"]],
                    hovertemplate=f"{name}: %{{text}} at %{{x}}<extra></extra>",
                ),
                row=row,
                col=1,
            )
        if len(c["sup_x"]):
            fig.add_trace(
                go.Scatter(
                    x=c["sup_x"],
                    y=c["sup_y"],
                    mode="markers",
                    marker={"color": color, "size": 4, "symbol": "circle-open"},
                    name=f"{name} superseded",
                    legendgroup=name,
                    showlegend=False,
                    hovertemplate=f"{name} (superseded by a resumed writer)<br>%{{x}}: %{{y:.5g}}<extra></extra>",
                ),
                row=row,
                col=1,
            )
    _add_alerts(fig, alerts, tags, facet)
    _add_events(fig, events)
    if ignore_outliers:  # as TensorBoard's default: scale to where the curves spend their time
        for row, vals in row_values.items():
            r = outlier_range(np.concatenate(vals) if vals else np.array([]), log_y)
            if r is not None:
                fig.update_yaxes(range=r, row=row, col=1)
                for i, nan_row in nan_traces:
                    if nan_row == row:
                        top = 10 ** r[1] if log_y else r[1]
                        fig.data[i].y = [top] * len(fig.data[i].y)
    fig.update_layout(
        height=max(360, height_per_row * rows),
        margin={"l": 50, "r": 20, "t": 40, "b": 40},
        legend={"orientation": "h", "y": -0.08},
        hovermode="closest",
        uirevision="curves",
    )
    fig.update_xaxes(title_text=x_title, row=rows, col=1)
    if log_y:
        fig.update_yaxes(type="log")
    return fig


def outlier_range(values: np.ndarray, log_y: bool = False) -> list[float] | None:
    """TensorBoard's outlier-ignoring domain: the 5th..95th percentile of the values, padded by
    10 % (log10 units for a log axis)."""
    v = values[np.isfinite(values)]
    if log_y:
        v = np.log10(v[v > 0])
    if len(v) < 10:
        return None
    lo, hi = np.percentile(v, [5, 95])
    if hi <= lo:
        return None
    pad = 0.1 * (hi - lo)
    return [float(lo - pad), float(hi + pad)]


def _rows_for(tag: str | None, tags: list[str], facet: bool) -> list[int]:
    if not facet:
        return [1]
    return [tags.index(tag) + 1] if tag in tags else list(range(1, len(tags) + 1))


def _add_alerts(fig: go.Figure, alerts, tags: list[str], facet: bool) -> None:
    """Alert intervals as shaded bands (capped for the browser) and a marker where each fired."""
    bands = len(alerts) <= 10  # beyond that, bands would hide the curves: markers only
    for a in alerts:
        color = run_color(a["run_id"])
        for row in _rows_for(a.get("tag") or None, tags, facet):
            if bands:
                fig.add_vrect(
                    x0=a["x_start"],
                    x1=max(a["x_end"], a["x_start"]),
                    fillcolor=color,
                    opacity=0.08,
                    line_width=0,
                    row=row,
                    col=1,
                )
            fig.add_trace(
                go.Scatter(
                    x=[a["x_fired"]],
                    y=[a["y"]] if a.get("y") is not None and math.isfinite(a["y"]) else [None],
                    mode="markers",
                    marker={
                        "symbol": "triangle-up",
                        "size": 11,
                        "color": color,
                        "line": {"width": 1, "color": "black"},
                    },
                    name=f"alert {a['rule']}",
                    showlegend=False,
                    text=[a["message"]],
                    hovertemplate=f"<b>alert {a['rule']}</b> · {a['run_id']}<br>fired at %{{x}}<br>%{{text}}<extra></extra>",
                ),
                row=row,
                col=1,
            )


def _add_events(fig: go.Figure, events) -> None:
    """Events on the first plot, at their run's curve (`y` is given by the caller)."""
    by_kind: dict[tuple, list] = {}
    for e in events:
        by_kind.setdefault((e["kind"], e["run_id"]), []).append(e)
    for (kind, run), evs in sorted(by_kind.items()):
        symbol, color = EVENT_STYLE.get(kind, ("circle", "#444444"))
        fig.add_trace(
            go.Scatter(
                x=[e["x"] for e in evs],
                y=[e.get("y") for e in evs],
                mode="markers",
                marker={
                    "symbol": symbol,
                    "size": 9,
                    "color": color,
                    "line": {"width": 1, "color": run_color(run)},
                },
                name=kind,
                showlegend=False,
                text=[f"{kind} · {run}<br>{(e['message'] or '')[:160]}" for e in evs],
                hovertemplate="%{text}<br>at %{x}<extra></extra>",
            ),
            row=1,
            col=1,
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
                name=rule,
                text=[p["params"] for p in pts],
                hovertemplate=f"<b>{rule}</b><br>%{{text}}<br>FA/1k %{{x:.3g}} · recall %{{y:.0%}}<extra></extra>",
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


def lineage_figure(runs: list[dict], edges: list[dict]) -> go.Figure:
    """Runs as nodes (coloured by status), continuation edges between them; resumes inside a
    run are counted on its node."""
    status_color = {
        "completed": "#2ca02c",
        "recovered": "#17becf",
        "diverged": "#d62728",
        "crashed": "#000000",
        "running": "#1f77b4",
        "unknown": "#7f7f7f",
    }
    cross = [e for e in edges if e["child_run"] != e["parent_run"]]
    involved = sorted({e["child_run"] for e in edges} | {e["parent_run"] for e in edges})
    parent = {e["child_run"]: e["parent_run"] for e in cross}

    def depth(r, seen=()):
        return 0 if r not in parent or r in seen else 1 + depth(parent[r], (*seen, r))

    pos, rows_at = {}, {}
    for r in involved:
        d = depth(r)
        pos[r] = (d, rows_at.get(d, 0))
        rows_at[d] = rows_at.get(d, 0) + 1
    info = {r["run_id"]: r for r in runs}
    fig = go.Figure()
    for e in cross:
        (x0, y0), (x1, y1) = pos[e["parent_run"]], pos[e["child_run"]]
        fig.add_trace(
            go.Scatter(
                x=[x0, x1],
                y=[y0, y1],
                mode="lines",
                line={"color": "#999", "width": 2},
                hoverinfo="skip",
                showlegend=False,
            )
        )
        fig.add_trace(
            go.Scatter(
                x=[(x0 + x1) / 2],
                y=[(y0 + y1) / 2],
                mode="markers+text",
                text=[f"{e['kind']} @ {e['parent_step']}"],
                textposition="top center",
                marker={"size": 6, "color": "#999"},
                showlegend=False,
                hovertext=[e["evidence"]],
                hoverinfo="text",
            )
        )
    resumes = {}
    for e in edges:
        if e["child_run"] == e["parent_run"]:
            resumes[e["child_run"]] = resumes.get(e["child_run"], 0) + 1
    fig.add_trace(
        go.Scatter(
            x=[pos[r][0] for r in involved],
            y=[pos[r][1] for r in involved],
            mode="markers+text",
            text=[r + (f" (+{resumes[r]} resume)" if r in resumes else "") for r in involved],
            textposition="bottom center",
            marker={
                "size": 22,
                "color": [status_color.get((info.get(r) or {}).get("status"), "#7f7f7f") for r in involved],
            },
            hovertext=[
                f"{r}<br>status {(info.get(r) or {}).get('status')}<br>steps {(info.get(r) or {}).get('first_step')}–"
                f"{(info.get(r) or {}).get('last_step')}"
                for r in involved
            ],
            hoverinfo="text",
            showlegend=False,
        )
    )
    depth_max = max((p[0] for p in pos.values()), default=0)
    rows_max = max(rows_at.values(), default=1)
    fig.update_layout(
        height=160 + 90 * rows_max,
        margin={"l": 20, "r": 20, "t": 20, "b": 20},
        xaxis={"visible": False, "range": [-0.6, depth_max + 0.6]},
        yaxis={"visible": False, "range": [rows_max - 0.4, -0.6]},
    )
    return fig
