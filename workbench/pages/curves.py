"""Curves: many runs x tags, TensorBoard smoothing, alerts and events drawn on the curves."""

import io

import numpy as np
import polars as pl
import streamlit as st

from workbench import app_data, charts

st.title("Curves")
gen = app_data.generation()
if gen is None:
    st.info(app_data.no_store_message())
    st.stop()

all_runs = app_data.runs(gen)["run_id"].to_list()
wanted = [r for r in st.session_state.get(app_data.SELECTED, []) if r in all_runs] or all_runs[:3]
sel = st.multiselect("Runs", all_runs, default=wanted, key="curves_runs")
st.session_state[app_data.SELECTED] = sel
if not sel:
    st.info("Pick one or more runs (or select rows on the Runs page).")
    st.stop()
tag_df = app_data.tags(gen, tuple(sel))
options = tag_df["tag"].to_list()
default_tags = tag_df.filter(pl.col("metric") == "loss")["tag"].to_list()[:2] or options[:1]
chosen = st.multiselect(
    "Tags",
    options,
    default=default_tags,
    key="curves_tags",
    format_func=lambda t: (
        t + (f"  ({m})" if (m := dict(tag_df.select("tag", "metric").iter_rows()).get(t)) else "")
    ),
)
c1, c2, c3, c4 = st.columns([2, 2, 1, 1])
smoothing = c1.slider("Smoothing (TensorBoard EMA)", 0.0, 0.999, 0.6, 0.001, key="curves_smoothing")
x_mode = c2.radio("x axis", ["step", "relative time (h)", "wall time"], horizontal=True, key="curves_x")
log_y = c3.checkbox("log y", key="curves_log")
facet = c4.checkbox("one plot per tag", value=True, key="curves_facet")
c5, c6, c7, c8 = st.columns(4)
show_alerts = c5.checkbox("alerts", value=True, key="curves_alerts")
ignore_outliers = c8.checkbox(
    "ignore outliers in scaling",
    value=True,
    key="curves_outliers",
    help="As TensorBoard: scale the y axis to the 5th–95th percentile of the curves.",
)
show_events = c6.checkbox("events (overflow, checkpoint, resume, recovery)", value=True, key="curves_events")
show_superseded = c7.checkbox("superseded points (before a resume)", key="curves_superseded")
if not chosen:
    st.info("Pick one or more tags.")
    st.stop()


def to_x(steps, walls, t0):
    if x_mode == "step" or not np.isfinite(walls).any():
        return steps
    if x_mode == "relative time (h)":
        return (walls - t0) / 3600.0
    return (walls * 1000).astype("datetime64[ms]")


series, first_curve, export = [], {}, []
for run in sel:
    for tag in chosen:
        s = app_data.series(gen, run, tag)
        if len(s["step"]) == 0:
            continue
        walls = s["wall_time"].astype(np.float64)
        t0 = np.nanmin(walls) if np.isfinite(walls).any() else 0.0
        sup = s["superseded"].astype(bool)
        keep = np.ones(len(sup), bool) if show_superseded else ~sup
        x = to_x(s["step"], walls, t0)
        series.append(
            {"run_id": run, "tag": tag, "x": x[keep], "y": s["value"][keep], "superseded": sup[keep]}
        )
        if run not in first_curve:  # where this run's events and alerts sit on the first plot
            cur = ~sup
            first_curve[run] = (s["step"][cur], charts.tb_smooth(s["value"][cur], smoothing), walls[cur], t0)
        export.append(
            pl.DataFrame(
                {
                    "run_id": run,
                    "tag": tag,
                    "step": s["step"],
                    "wall_time": walls,
                    "value": s["value"],
                    "superseded": sup,
                }
            )
        )
if x_mode != "step" and not any(np.isfinite(c[2]).any() for c in first_curve.values()):
    st.warning("These logs carry no wall times: plotting by step.")


def place(run, step):
    steps, smooth, walls, t0 = first_curve[run]
    ok = np.isfinite(smooth)
    y = float(np.interp(step, steps[ok], smooth[ok])) if ok.any() else None
    w = float(np.interp(step, steps, walls)) if np.isfinite(walls).any() else np.nan
    return to_x(np.array([step]), np.array([w]), t0)[0], y


alerts, events = [], []
stored = app_data.alerts(gen, tuple(sel))
if show_alerts and not stored.is_empty():
    rule_names = sorted(stored["rule"].unique().to_list())
    picked_rules = st.multiselect("Alert rules", rule_names, default=rule_names, key="curves_alert_rules")
    stored = stored.filter(pl.col("rule").is_in(picked_rules))
if show_alerts:
    for a in stored.iter_rows(named=True):
        if a["run_id"] in first_curve:
            xs, _ = place(a["run_id"], a["step_start"])
            xf, yf = place(a["run_id"], a["step_fired"])
            xe, _ = place(a["run_id"], a["step_end"])
            alerts.append({**a, "x_start": xs, "x_fired": xf, "x_end": xe, "y": yf})
if show_events:
    for e in app_data.events(gen, tuple(sel)).iter_rows(named=True):
        if e["run_id"] in first_curve:
            x, y = place(e["run_id"], e["step"])
            events.append({**e, "x": x, "y": y})
if not series:
    st.info("No points for these runs and tags.")
    st.stop()
fig = charts.curves_figure(
    series,
    smoothing=smoothing,
    log_y=log_y,
    x_title=x_mode,
    facet=facet,
    alerts=alerts,
    events=events,
    ignore_outliers=ignore_outliers,
)
st.plotly_chart(fig, key="curves_chart", width="stretch")
st.caption(
    f"{sum(len(s['x']) for s in series):,} points; display keeps the first, min, max and last point of "
    f"each of 2000 buckets per curve (spikes and NaN markers survive); smoothing runs on the full series. "
    f"{len(alerts)} alerts, {len(events)} events shown."
)
data = pl.concat(export)
c1, c2 = st.columns(2)
c1.download_button("Export CSV (long format)", data.write_csv(), "curves.csv", "text/csv", key="curves_csv")
buf = io.BytesIO()
data.write_parquet(buf)
c2.download_button("Export Parquet", buf.getvalue(), "curves.parquet", key="curves_parquet")
