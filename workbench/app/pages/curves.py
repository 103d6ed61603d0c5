"""Curves: many runs x tags as a grid of small charts grouped by tag prefix (TensorBoard's
layout), TensorBoard smoothing, run groups with mean and band (W&B's), alerts and events on
each chart's own curve; the whole view is kept in the URL."""

import functools

import numpy as np
import polars as pl
import streamlit as st

from workbench.app import PAGE, charts, data, state, untrusted
from workbench.app.untrusted import md

MAX_CHARTS = 24
PAGE_WIDTH_PX = 1300  # the wide layout's plot area at a 1440 px window
PX_PER_BUCKET = 2  # a bucket keeps up to 4 points: 2 px each draws the same line at half the points
POINTS_PER_CHART = 20_000  # what a sweep's lines share on one chart: each drawn in fewer buckets
MIN_BUCKETS = 8
ALERTS_MAX_RUNS = 20  # above this many runs, alerts start hidden (their count is shown)

st.title("Curves")
gen = data.generation_or_stop()

all_runs = list(data.run_starts(gen))
PARAMS = [
    state.Param("curves_runs", "run", []),
    state.Param("curves_tags", "tags", ""),
    state.Param("curves_smoothing", "smooth", 0.6, lo=0.0, hi=0.999),
    state.Param("curves_x", "x", "step", choices=tuple(data.X_MODES)),
    state.Param("curves_log", "logy", False),
    state.Param("curves_raw", "raw", True),
    state.Param("curves_outliers", "outliers", True),
    state.Param("curves_group", "group", "none", choices=("none", "config", "name")),
    state.Param("curves_group_key", "by", ""),
    state.Param("curves_cols", "cols", 2, choices=(1, 2, 3)),
    state.Param("curves_share_zoom", "xshare", True),
    state.Param("curves_alerts", "alerts", True),
    state.Param("curves_events", "events", True),
    state.Param("curves_superseded", "replaced", False),
    state.Param("curves_live", "live", False),
    state.Param("curves_highlight", "hl", []),
    state.Param("curves_only_highlighted", "solo", False),
]
if "curves_runs" not in st.session_state and "run" not in st.query_params:
    # arriving without a link: the runs picked elsewhere in this session (the Runs page), else the first few
    st.session_state["curves_runs"] = [
        r for r in st.session_state.get(data.SELECTED, []) if r in all_runs
    ] or all_runs[:3]
state.restore(PARAMS)
state.keep_only("curves_runs", all_runs)
state.keep_only("curves_x", data.X_MODES)

c1, c2, c3 = st.columns([6, 4, 1.6], vertical_alignment="bottom")
sel = c1.multiselect("Runs", all_runs, key="curves_runs")
st.session_state[data.SELECTED] = sel
if c3.button("Compare", key="curves_compare", disabled=len(sel) < 2, help="These runs in the run comparer."):
    st.switch_page(PAGE["compare"].path, query_params={"run": sel})
tag_filter = c2.text_input(
    "Tags (regex; empty: the loss)",
    key="curves_tags",
    help="A regular expression over tag names, as TensorBoard's tag filter: `loss|grad_norm`, `^train/`, `.*`",
)
if not sel:
    state.publish(PARAMS)
    st.info("Pick one or more runs (or select rows on the Runs page).")
    st.stop()

tag_df = data.tags(gen, tuple(sel))
metric_of = dict(tag_df.select("tag", "metric").iter_rows())
if tag_filter:
    try:
        all_tags = tag_df["tag"].to_list()
        chosen = [t for t, hit in zip(all_tags, untrusted.matches(tag_filter, all_tags), strict=True) if hit]
    except untrusted.BadPattern as e:
        st.warning(md(f"Tags {tag_filter}: {e}"))
        chosen = []
else:
    chosen = tag_df.filter(pl.col("metric") == "loss")["tag"].to_list()[:2] or tag_df["tag"].to_list()[:1]

with st.expander("Groups, layout, markers, live refresh"):
    g1, g2, g3 = st.columns([1, 2, 1])
    group_how = g1.radio("Group runs", ["none", "config", "name"], horizontal=True, key="curves_group")
    if group_how == "config":  # the keys some picked run has (else every run lands in one `=None` group)
        cfg = data.configs(gen).filter(pl.col("run_id").is_in(sel))
        cfg_keys = [c for c in cfg.columns if c != "run_id" and cfg[c].null_count() < cfg.height]
        state.keep_only("curves_group_key", cfg_keys)
        group_key = g2.selectbox("by config key", cfg_keys, key="curves_group_key", placeholder="no configs")
    elif group_how == "name":
        group_key = g2.text_input(
            "by run name (regex; its first group names the group)",
            key="curves_group_key",
            placeholder="(.*)_seed",
        )
    else:
        group_key = ""
    cols = g3.selectbox("Charts per row", [1, 2, 3], key="curves_cols")
    share_zoom = g3.checkbox("one x zoom for all charts", key="curves_share_zoom")
    m1, m2, m3, m4 = st.columns(4)
    all_alerts = data.alerts(gen, tuple(sel))
    many = len(sel) > ALERTS_MAX_RUNS
    if st.session_state.get("curves_alerts_many") != many and "alerts" not in st.query_params:
        st.session_state["curves_alerts"] = not many  # a sweep starts without markers; a few runs with
    st.session_state["curves_alerts_many"] = many
    show_alerts = m1.checkbox(
        f"alerts ({all_alerts.height:,} stored)",
        key="curves_alerts",
        help=f"Drawn on the chart of the metric that fired; off at first above {ALERTS_MAX_RUNS} runs.",
    )
    show_events = m2.checkbox("events (overflow, checkpoint, resume, recovery)", key="curves_events")
    show_replaced = m3.checkbox(
        "points replaced by a resume",
        key="curves_superseded",
        help="Points a resumed writer logged again: the earlier ones, kept in the store and drawn as open circles.",
    )
    live = m4.toggle(
        "Live refresh", key="curves_live", help="Re-read the store every few seconds while it is written."
    )
    stored_rules = sorted(all_alerts["rule"].unique().to_list())
    alert_rules = st.multiselect(
        "Alert rules drawn", stored_rules, default=stored_rules, key="curves_alert_rules"
    )
state.live_refresh(gen, live)


@st.fragment
def chart_grid() -> None:
    """The display controls and the charts: a change here reruns only this part of the page."""
    c1, c2, c3, c4, c5 = st.columns([3, 3, 1, 1, 1])
    smoothing = c1.slider("Smoothing (TensorBoard EMA)", 0.0, 0.999, step=0.001, key="curves_smoothing")
    x_mode = c2.radio("x axis", data.X_MODES, horizontal=True, key="curves_x")
    log_y = c3.checkbox("log y", key="curves_log")
    show_raw = c4.checkbox(
        "raw line",
        key="curves_raw",
        help=f"The unsmoothed points, faint behind the line (up to {charts.LEGEND_MAX} lines).",
        disabled=len(sel) > charts.LEGEND_MAX,
    )
    outliers = c5.checkbox(
        "ignore outliers",
        key="curves_outliers",
        help="As TensorBoard: scale the y axis to the 5th–95th percentile of the curves.",
    )
    state.publish(PARAMS)
    if not chosen:
        st.info("No tag matches: try `loss`, `.*` or a prefix such as `^train/`.")
        return
    shown_tags = chosen[:MAX_CHARTS]
    if len(chosen) > MAX_CHARTS:
        st.caption(
            f"Showing the first {MAX_CHARTS} of {len(chosen)} matching tags: narrow the regex for the rest."
        )

    groups = data.group_of(sel, group_how, group_key, gen)
    keys = list(dict.fromkeys(groups[r] for r in sel))
    grouped = len(keys) < len(sel)
    styles = charts.line_styles(keys)
    ncols = min(cols, len(shown_tags))  # one chart takes the whole width
    width_buckets = PAGE_WIDTH_PX // ncols // PX_PER_BUCKET
    # a sweep's lines share the chart's points: each keeps fewer buckets, still its extremes
    buckets = max(MIN_BUCKETS, min(width_buckets, POINTS_PER_CHART // (4 * len(keys))))
    alerts = _alerts(show_alerts)
    events = data.events(gen, tuple(sel)) if show_events else pl.DataFrame()
    legend = len(keys) <= charts.LEGEND_MAX
    highlight: list[str] = []
    only_highlighted = False
    if not legend:  # a sweep: no legend of its own; pick the lines to hide or solo
        state.keep_only("curves_highlight", keys)
        h1, h2 = st.columns([5, 1])
        highlight = h1.multiselect(
            f"Highlight (of {len(keys)} {'groups' if grouped else 'runs'})",
            keys,
            key="curves_highlight",
            placeholder="lines drawn on top, the rest faint, with a legend to hide (click) or solo (double-click) them",
        )
        only_highlighted = h2.checkbox("only these", key="curves_only_highlighted", disabled=not highlight)
        state.publish(PARAMS)
        with st.expander(
            f"Colour key ({len(keys)} {'groups' if grouped else 'runs'}; each colour is shared)"
        ):
            st.dataframe(
                pl.DataFrame({"line": keys, "colour": [styles[k][0] for k in keys]}),
                hide_index=True,
                key="curves_colour_key",
            )

    data.prefetch(gen, [(run, tag) for tag in shown_tags for run in sel])
    if len(sel) > charts.LEGEND_MAX:  # a sweep: one cached result per chart
        args = (smoothing, x_mode, show_replaced, buckets)
        curves = {tag: data.display_curves(gen, tuple(sel), tag, *args) for tag in shown_tags}
    else:  # a few runs, each cached alone (a long run is smoothed once for every x axis)
        curves = {  # tag -> run -> its line on that chart
            tag: {
                run: d
                for run in sel
                if (d := data.display_curve(gen, run, tag, smoothing, x_mode, show_replaced, buckets))
            }
            for tag in shown_tags
        }
    drawn = {tag: {r: d for r, d in cs.items() if "smooth_x" in d} for tag, cs in curves.items()}
    unit, size = charts.time_unit(max((d["span"] for cs in drawn.values() for d in cs.values()), default=0.0))
    scale = {
        "step": None,
        "relative time": lambda v: v / size,
        "wall time": lambda v: v * 1000 + data.local_offset_ms(),  # plotly dates: ms, shown as given
    }[x_mode]
    x_title = {"step": "step", "relative time": f"relative time ({unit})", "wall time": "wall time (local)"}
    figures = {}
    for tag, cs in drawn.items():
        if grouped:
            lines = _group_lines(tag, cs, keys, groups, styles, smoothing, x_mode, width_buckets)
        else:
            lines = [
                {**d, "name": run, "color": styles[run][0], "dash": styles[run][1]} for run, d in cs.items()
            ]
        if not lines:
            continue
        marks_a = _alerts_on(alerts, tag, metric_of.get(tag), cs, styles, groups)
        marks_e = _events_on(events, cs, styles, groups)
        if scale is not None:  # lines and markers alike: this chart's units
            lines = [_rescale(ln, scale) for ln in lines]
            for m in (*marks_a, *marks_e):
                m.update({k: scale(m[k]) for k in ("x", "x0", "x1") if m.get(k) is not None})
        metric = metric_of.get(tag)
        figures[tag] = charts.curve_figure(
            tag + (f"  ({metric})" if metric and metric != tag else ""),
            lines,
            smoothing=smoothing,
            log_y=log_y,
            x_title=x_title[x_mode],
            x_is_date=x_mode == "wall time",
            alerts=marks_a,
            events=marks_e,
            ignore_outliers=outliers,
            show_raw=show_raw and not grouped,
            legend_lines=legend and len(keys) > 1,
            height=420 if ncols == 1 else 330,
            highlight=highlight,
            hide_others=only_highlighted,
        )

    zoom = _x_zoom(list(figures), x_mode, share_zoom)
    for tag, fig in figures.items():  # drag across a chart: the x range it spans, kept on every change
        fig.update_layout(dragmode="select", selectdirection="h")
        if tag in zoom:
            fig.update_xaxes(range=zoom[tag], autorange=False)

    timed = {r for cs in drawn.values() for r in cs}
    lost = [r for r in sel if r not in timed and any(r in cs for cs in curves.values())]
    if lost and x_mode != "step":
        st.warning(
            f"Not drawn on a time axis: {md(', '.join(lost))}. No source of "
            f"{'this run' if len(lost) == 1 else 'these runs'} logged a wall time for these steps; "
            "choose x = step to see them."
        )
    sections = _sections(list(figures))
    for prefix, tags_in in sections:
        if len(sections) > 1:
            st.markdown(f"**{md(prefix)}/**" if prefix else "**(no prefix)**")
        n = min(ncols, len(tags_in))  # a section of one chart takes the whole width
        for i in range(0, len(tags_in), n):
            for col, tag in zip(st.columns(n), tags_in[i : i + n], strict=False):
                col.plotly_chart(
                    figures[tag],
                    key=_chart_key(x_mode, tag),
                    width="stretch",
                    on_select=functools.partial(_zoomed, x_mode, tag),
                    selection_mode="box",
                )
    st.caption(_notes(curves, timed, buckets, x_mode, show_replaced, len(sel) > charts.LEGEND_MAX))


def _chart_key(x_mode: str, tag: str) -> str:
    return f"curves_chart_{x_mode}_{tag}"  # a zoom per x axis: steps and seconds do not mix


ZOOM = "curves_zoom"  # x_mode -> tag -> the x range a user dragged across; "*": the latest, for all charts


def _zoomed(x_mode: str, tag: str) -> None:
    """A chart's selection changed (a user's drag, or a double-click clearing it): keep its x
    range apart from the chart, whose own selection Streamlit drops whenever it is redrawn."""
    try:
        box = st.session_state[_chart_key(x_mode, tag)]["selection"]["box"]
    except (KeyError, TypeError):
        box = []
    zoom = st.session_state.setdefault(ZOOM, {}).setdefault(x_mode, {})
    if box and len(box[-1].get("x") or []) == 2:
        zoom[tag] = zoom["*"] = sorted(box[-1]["x"])
    else:  # a double-click: back to the whole (outlier-robust) view
        zoom.pop(tag, None)
        zoom.pop("*", None)


def _x_zoom(tags: list[str], x_mode: str, shared: bool) -> dict[str, list]:
    """tag -> the x range to show: the chart's own drag, or with `shared` the latest drag on any
    chart (a plotly zoom would not survive: Streamlit redraws a chart on every control change)."""
    zoom = st.session_state.get(ZOOM, {}).get(x_mode, {})
    if shared and "*" in zoom:
        return dict.fromkeys(tags, zoom["*"])
    return {t: zoom[t] for t in tags if t in zoom}


def _notes(curves: dict, timed: set, buckets: int, x_mode: str, show_replaced: bool, sweep: bool) -> str:
    """What the charts leave out or take from elsewhere, in numbers."""
    ds = [(run, d) for cs in curves.values() for run, d in cs.items()]
    total = {k: sum(d[k] for _, d in ds) for k in ("points", "replaced", "duplicates", "borrowed_times")}
    if sweep:
        drawn = (
            f"each of the {len(sel)} lines is drawn at up to {4 * buckets} evenly spaced points of its "
            "smoothed series (pick 20 runs or fewer for every spike)"
        )
    else:
        drawn = (
            f"each line keeps the first, min, max and last point of each of {buckets} buckets "
            f"({PX_PER_BUCKET} pixels each), so spikes and NaN markers survive"
        )
    notes = [f"{total['points']:,} points; {drawn}; smoothing runs on the full series."]
    if total["replaced"]:
        shown = "shown as open circles" if show_replaced else "hidden"
        notes.append(f"{total['replaced']:,} points replaced by a resume ({shown}).")
    if total["duplicates"]:
        notes.append(
            f"{total['duplicates']:,} points are the same step logged by another source of the run; "
            "each step is drawn once."
        )
    if x_mode != "step" and total["borrowed_times"]:
        notes.append(
            f"{total['borrowed_times']:,} points take their wall time from another source that logged the step."
        )
    partly: dict[str, int] = {}
    for run, d in ds:
        if x_mode != "step" and d["untimed"] and run in timed:
            partly[run] = partly.get(run, 0) + d["untimed"]
    if partly:
        notes.append(
            "Left out for want of a wall time: "
            + ", ".join(f"{n:,} points of {md(r)}" for r, n in partly.items())
            + "."
        )
    return " ".join(notes)


def _sections(tags: list[str]) -> list[tuple[str, list[str]]]:
    """Tags grouped by their prefix (the part before the first '/'), in order of appearance;
    tags without one together under a heading of their own."""
    out: dict[str, list[str]] = {}
    for t in tags:
        out.setdefault(t.split("/", 1)[0] if "/" in t else "", []).append(t)
    return list(out.items())


def _group_lines(tag, curves, keys, groups, styles, smoothing, x_mode, buckets) -> list[dict]:
    lines = []
    for key in keys:
        members = tuple(r for r in curves if groups[r] == key)
        b = data.group_band(gen, members, tag, smoothing, x_mode, buckets) if members else None
        if b is not None:
            color, dash = styles[key]
            name = f"{key} ({len(members)} run{'s' if len(members) > 1 else ''})"
            lines.append(
                {
                    "name": name,
                    "key": key,
                    "color": color,
                    "dash": dash,
                    "smooth_x": b["x"],
                    "smooth_y": b["mean"],
                    "band": b,
                }
            )
    return lines


def _alerts(show: bool) -> pl.DataFrame:
    """The stored alerts of the rules picked; with the alarms a backtest judged (when the user
    came from there) in place of the stored ones of that rule."""
    if not show:
        return pl.DataFrame()
    alerts = data.alerts(gen, tuple(sel)).filter(pl.col("rule").is_in(alert_rules))
    overlay = st.session_state.get("bt_overlay")
    if overlay is None:
        return alerts
    o1, o2 = st.columns([4, 1])
    o1.caption(f"Drawing the alarms of {md(overlay['rule'])} as the backtest judged them (open markers).")
    if o2.button("Hide them", key="curves_hide_overlay"):
        del st.session_state["bt_overlay"]
        return alerts
    alerts = alerts.filter(pl.col("rule") != overlay["rule"])
    ours = overlay["alerts"].with_columns(rule_id=pl.lit(overlay["rule"]), backtest=pl.lit(True))
    return pl.concat([alerts, ours], how="diagonal_relaxed") if not alerts.is_empty() else ours


def _rescale(line: dict, scale) -> dict:
    out = dict(line)
    for k in ("raw_x", "smooth_x", "nan_x", "sup_x"):
        if k in out and out[k] is not None:
            out[k] = scale(np.asarray(out[k], np.float64))
    if out.get("band") is not None:
        out["band"] = {**out["band"], "x": scale(np.asarray(out["band"]["x"], np.float64))}
    return out


def _alerts_on(
    alerts: pl.DataFrame, tag: str, metric, curves: dict, styles: dict, groups: dict
) -> list[dict]:
    """The alerts that fired on this chart's metric, each on its run's curve: the tag an alert
    names, else the metrics its rule reads, else (a rule the app does not know) the chart
    whose value at the step is the alert's."""
    out: list[dict] = []
    if alerts.is_empty():
        return out
    live = "source" in alerts.columns
    reads_of = data.rule_metrics(st.session_state.get("bt_rules_text"))
    family_of = data.rule_families(st.session_state.get("bt_rules_text"))
    for a in alerts.iter_rows(named=True):
        d = curves.get(a["run_id"])
        if d is None or not _fired_on(a, tag, metric, reads_of):
            continue
        x, y = data.place(d, a["step_fired"])
        if x is None:
            continue
        out.append(
            {
                "x": x,
                "y": y,
                "x0": data.place(d, a["step_start"])[0],
                "x1": data.place(d, a["step_end"])[0],
                "rule": a["rule"],
                "family": family_of.get(a.get("rule_id") or a["rule"], "other"),
                "run": a["run_id"],
                "message": (a.get("message") or "")
                + (f" · raised {a['raised_at']}" if a.get("raised_at") else ""),
                "color": styles[groups[a["run_id"]]][0],
                "live": live and a.get("source") == "live",
                "backtest": bool(a.get("backtest")),
            }
        )
    return out


def _fired_on(alert: dict, tag: str, metric, reads_of: dict) -> bool:
    if alert.get("tag"):
        return alert["tag"] in (tag, metric)
    names = reads_of.get(alert.get("rule_id") or alert["rule"])
    if names:
        return any(untrusted.glob_match(n, tag) or n in (tag, metric) for n in names)
    v = data.value_at(gen, alert["run_id"], tag, alert["step_fired"])
    want = alert.get("value")
    return v is not None and want is not None and (v == want or np.isclose(v, want, equal_nan=True))


def _events_on(events: pl.DataFrame, curves: dict, styles: dict, groups: dict) -> list[dict]:
    out = []
    for e in events.iter_rows(named=True) if not events.is_empty() else ():
        d = curves.get(e["run_id"])
        if d is None:
            continue
        x, y = data.place(d, e["step"])
        if x is not None:
            out.append(
                {
                    "x": x,
                    "y": y,
                    "kind": e["kind"],
                    "run": e["run_id"],
                    "message": e["message"],
                    "color": styles[groups[e["run_id"]]][0],
                }
            )
    return out


chart_grid()

families = charts.layer_families(tag_df["tag"].to_list())
if families:
    with st.expander(f"Per-layer heatmaps, layer × step ({len(families)} layer families)"):
        st.caption(
            "Cells past a threshold of the guides' rules (detectors/guides.toml) are marked, one shape per rule."
        )
        h1, h2 = st.columns([1, 2])
        heat_run = h1.selectbox("Run", sel, key="curves_heat_run")
        shown_families = h2.multiselect(
            "Families", list(families), default=list(families)[:4], key="curves_heat_families"
        )
        for fam in shown_families:
            layers = families[fam]
            data.prefetch(gen, [(heat_run, t) for t in layers.values()])
            st.plotly_chart(
                charts.layer_heatmap(
                    f"{fam} · {heat_run}",
                    {n: data.current_points(gen, heat_run, t) for n, t in layers.items()},
                    thresholds=data.layer_thresholds(
                        fam, tuple(layers.items()), tuple(metric_of.get(t) for t in layers.values())
                    ),
                ),
                key=f"curves_heat_{fam}",
                width="stretch",
            )

with st.expander("Export the selection (long format: run_id, tag, step, wall_time, value, superseded)"):
    pairs = tuple((r, t) for r in sel for t in chosen)
    with_replaced = st.checkbox(
        "with the points a resume replaced (superseded = true)", key="curves_export_all"
    )
    if st.button("Prepare CSV and Parquet", key="curves_export"):
        st.session_state["curves_export_ready"] = True
    if st.session_state.get("curves_export_ready"):  # the buttons stay for another download
        e1, e2 = st.columns(2)
        for col, fmt, mime in ((e1, "csv", "text/csv"), (e2, "parquet", "application/octet-stream")):
            col.download_button(
                f"Download {fmt.upper() if fmt == 'csv' else fmt.capitalize()}",
                data.export(gen, pairs, fmt, with_replaced),
                f"curves.{fmt}",
                mime,
                key=f"curves_{fmt}",
                on_click="ignore",
            )
