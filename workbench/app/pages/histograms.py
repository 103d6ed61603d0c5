"""Histograms (TensorBoard's Distributions and Histograms dashboards): for one histogram tag of
the picked runs, its percentiles over steps as nested bands, and its histograms at a sample of
steps, stacked by step (offset) or overlaid; the view is kept in the URL."""

import numpy as np
import polars as pl
import streamlit as st

from workbench.app import charts, data, histograms, state
from workbench.app.untrusted import md

MAX_RUNS = 8  # two charts per run, one row each
BINS = 30  # the common bins every step of a chart is put on (as TensorBoard's Histograms view)

st.title("Histograms")
gen = data.generation_or_stop()

have = data.histogram_tags(gen)
if have.is_empty():
    st.info(
        "No histogram summaries in this store. TensorBoard event files with histograms "
        "(`SummaryWriter.add_histogram`, `tf.summary.histogram`, Keras' `histogram_freq`) are "
        "read into it on ingest: `workbench ingest RUNS_DIR`."
    )
    st.stop()
runs_with = have["run_id"].unique(maintain_order=True).to_list()
PARAMS = [
    state.Param("hist_runs", "run", []),
    state.Param("hist_tag", "tag", ""),
    state.Param("hist_mode", "mode", "offset"),
    state.Param("hist_steps", "steps", 30, lo=2, hi=200),
]
if "hist_runs" not in st.session_state and "run" not in st.query_params:
    ticked = [r for r in st.session_state.get(data.SELECTED, []) if r in runs_with]
    st.session_state["hist_runs"] = ticked[:MAX_RUNS] or runs_with[:1]
state.restore(PARAMS)
state.keep_only("hist_runs", runs_with)
c1, c2, c3, c4 = st.columns([3, 3, 1, 1])
sel = c1.multiselect(
    "Runs (with histograms)", runs_with, key="hist_runs", max_selections=MAX_RUNS, placeholder="pick runs"
)
tags = have.filter(pl.col("run_id").is_in(sel))["tag"].unique().sort().to_list()
state.keep_only("hist_tag", tags)
if tags and not st.session_state.get("hist_tag"):
    st.session_state["hist_tag"] = tags[0]
tag = c2.selectbox("Tag", tags, key="hist_tag", placeholder="no histograms in these runs")
mode = c3.radio("Histograms", ["offset", "overlay"], key="hist_mode")
most = c4.number_input("steps drawn", 2, 200, key="hist_steps")
state.publish(PARAMS)
if not sel or tag is None:
    st.info("Pick a run with histograms.")
    st.stop()

for run_id in sel:
    df = data.histograms(gen, run_id, tag)
    if df.is_empty():
        st.caption(f"{md(run_id)}: no {md(tag)} histograms.")
        continue
    steps = df["step"].to_numpy()
    lefts, rights, counts = (df[c].to_list() for c in ("left", "right", "count"))
    p_steps, pct = histograms.distribution(steps, lefts, rights, counts)
    order = histograms.sample_steps(steps, int(most))  # the rows come by step (data.histograms)
    finite_lo = [
        min((x for x, c in zip(lefts[j], counts[j], strict=True) if c > 0), default=np.nan) for j in order
    ]
    finite_hi = [
        max((x for x, c in zip(rights[j], counts[j], strict=True) if c > 0), default=np.nan) for j in order
    ]
    lo, hi = np.nanmin(finite_lo), np.nanmax(finite_hi)
    if not np.isfinite(lo) or not np.isfinite(hi):
        st.caption(f"{md(run_id)}: every {md(tag)} histogram is empty.")
        continue
    edges = np.linspace(lo, hi if hi > lo else lo + 1.0, BINS + 1)
    rebinned = np.array([histograms.rebin(lefts[j], rights[j], counts[j], edges) for j in order])
    colour = charts.colour_of(run_id)
    st.caption(
        f"**{md(run_id)}** · {len(steps)} histograms, steps {int(p_steps[0])}–{int(p_steps[-1])}"
        + (f" ({len(order)} drawn)" if len(order) < len(steps) else "")
    )
    left, right = st.columns(2)
    left.plotly_chart(
        charts.distribution_figure(p_steps, pct, f"{tag}: distribution", colour),
        key=f"hist_dist_{run_id}",
        width="stretch",
    )
    right.plotly_chart(
        charts.histogram_figure(
            steps[order],
            (edges[:-1] + edges[1:]) / 2,
            rebinned,
            f"{tag}: histograms",
            mode == "offset",
            colour,
        ),
        key=f"hist_hist_{run_id}",
        width="stretch",
    )
