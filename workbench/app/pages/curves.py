"""Curves: many runs x tags, TensorBoard smoothing, alerts and events drawn on the curves."""

import numpy as np
import polars as pl
import streamlit as st

from workbench.app import charts, data

st.title("Curves")
gen = data.generation()
if gen is None:
    st.info(data.no_store_message())
    st.stop()

all_runs = data.runs(gen)["run_id"].to_list()
wanted = [r for r in st.session_state.get(data.SELECTED, []) if r in all_runs] or all_runs[:3]
sel = st.multiselect("Runs", all_runs, default=wanted, key="curves_runs")
st.session_state[data.SELECTED] = sel
if not sel:
    st.info("Pick one or more runs (or select rows on the Runs page).")
    st.stop()
tag_df = data.tags(gen, tuple(sel))
metric_of = dict(tag_df.select("tag", "metric").iter_rows())
default_tags = tag_df.filter(pl.col("metric") == "loss")["tag"].to_list()[:2] or tag_df["tag"].to_list()[:1]
chosen = st.multiselect(
    "Tags",
    tag_df["tag"].to_list(),
    default=default_tags,
    key="curves_tags",
    format_func=lambda t: t + (f"  ({metric_of[t]})" if metric_of.get(t) else ""),
)
c1, c2, c3, c4 = st.columns([2, 2, 1, 1])
smoothing = c1.slider("Smoothing (TensorBoard EMA)", 0.0, 0.999, 0.6, 0.001, key="curves_smoothing")
x_mode = c2.radio("x axis", ["step", "relative time (h)", "wall time"], horizontal=True, key="curves_x")
log_y = c3.checkbox("log y", key="curves_log")
facet = c4.checkbox("one plot per tag", value=True, key="curves_facet")
c5, c6, c7, c8 = st.columns(4)
show_alerts = c5.checkbox("alerts", value=True, key="curves_alerts")
show_events = c6.checkbox("events (overflow, checkpoint, resume, recovery)", value=True, key="curves_events")
show_superseded = c7.checkbox("superseded points (before a resume)", key="curves_superseded")
ignore_outliers = c8.checkbox(
    "ignore outliers in scaling",
    value=True,
    key="curves_outliers",
    help="As TensorBoard: scale the y axis to the 5th–95th percentile of the curves.",
)
if not chosen:
    st.info("Pick one or more tags.")
    st.stop()

series, placed, points = [], {}, 0
for run in sel:
    for tag in chosen:
        d = data.display_curve(gen, run, tag, smoothing, x_mode, show_superseded)
        if d is None:
            continue
        series.append({"run_id": run, "tag": tag, "curve": d["curve"]})
        placed.setdefault(run, d)  # events and alerts sit on the run's first curve
        points += d["points"]
if not series:
    st.info("No points for these runs and tags.")
    st.stop()
if x_mode != "step" and not any(d["has_time"] for d in placed.values()):
    st.warning("These logs carry no wall times: plotting by step.")


def place(run, step):
    d = placed[run]
    ok = np.isfinite(d["place_y"])
    y = float(np.interp(step, d["place_steps"][ok], d["place_y"][ok])) if ok.any() else None
    if np.issubdtype(d["place_x"].dtype, np.datetime64):
        return np.datetime64(int(np.interp(step, d["place_steps"], d["place_x"].astype(np.int64))), "ms"), y
    return float(np.interp(step, d["place_steps"], d["place_x"])), y


alerts, events = [], []
stored = data.alerts(gen, tuple(sel))
if show_alerts and not stored.is_empty():
    rule_names = sorted(stored["rule"].unique().to_list())
    picked_rules = st.multiselect("Alert rules", rule_names, default=rule_names, key="curves_alert_rules")
    for a in stored.filter(pl.col("rule").is_in(picked_rules)).iter_rows(named=True):
        if a["run_id"] in placed:
            xf, yf = place(a["run_id"], a["step_fired"])
            alerts.append(
                {
                    **a,
                    "x_start": place(a["run_id"], a["step_start"])[0],
                    "x_fired": xf,
                    "x_end": place(a["run_id"], a["step_end"])[0],
                    "y": yf,
                }
            )
if show_events:
    for e in data.events(gen, tuple(sel)).iter_rows(named=True):
        if e["run_id"] in placed:
            x, y = place(e["run_id"], e["step"])
            events.append({**e, "x": x, "y": y})
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
    f"{points:,} points; display keeps the first, min, max and last point of each of 2000 buckets per curve "
    f"(spikes and NaN markers survive); smoothing runs on the full series. {len(alerts)} alerts, {len(events)} events shown."
)
with st.expander("Export the selection (long format: run_id, tag, step, wall_time, value, superseded)"):
    pairs = tuple((r, t) for r in sel for t in chosen)
    if st.button("Prepare CSV and Parquet", key="curves_export"):
        c1, c2 = st.columns(2)
        c1.download_button(
            "Download CSV", data.export(gen, pairs, "csv"), "curves.csv", "text/csv", key="curves_csv"
        )
        c2.download_button(
            "Download Parquet", data.export(gen, pairs, "parquet"), "curves.parquet", key="curves_parquet"
        )
