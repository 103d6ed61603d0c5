"""Lineage: which run continued which checkpoint (and which resumed itself); a series stitched
along a lineage path, with a marker where each writer took over."""

import polars as pl
import streamlit as st

from workbench.app import charts, data, state
from workbench.app.untrusted import md

st.title("Lineage")
gen = data.generation_or_stop()
edges = data.lineage(gen)
runs = data.runs(gen)
if edges.is_empty():
    st.info(
        "No lineage yet: no run resumed, restarted or forked from another's checkpoint in this store "
        "(a resumed writer segment, checkpoint metadata with a parent, or a RECOVERY TRIGGERED line makes one)."
    )
    st.stop()
st.plotly_chart(
    charts.lineage_figure(runs.to_dicts(), edges.to_dicts()), key="lineage_graph", width="stretch"
)
st.dataframe(edges, hide_index=True, width="stretch", key="lineage_table")

st.subheader("Stitched curve along a lineage path")
candidates = edges["child_run"].unique().sort().to_list()
PARAMS = [
    state.Param("lineage_run", "run", candidates[0]),
    state.Param("lineage_tag", "tag", "loss"),
    state.Param("lineage_outliers", "outliers", True),
]
state.restore(PARAMS)
state.keep_only("lineage_run", candidates)
c1, c2, c3 = st.columns([2, 2, 1])
run = c1.selectbox("Run (the path goes from its root to it)", candidates, key="lineage_run")
tag = c2.text_input("Tag or metric", key="lineage_tag")
outliers = c3.checkbox(
    "ignore outliers",
    key="lineage_outliers",
    help="Scale the y axis to the 5th–95th percentile, as on Curves.",
)
state.publish(PARAMS)
s = data.stitched(gen, run, tag)
if s.is_empty():
    st.info(f"No {md(tag)} points along this path.")
    st.stop()
hops = s["run_id"].unique(maintain_order=True).to_list()
styles = charts.line_styles(hops)
lines = [
    {
        **charts.prepare_curve(g["step"].to_numpy(), g["value"].to_numpy(), 0.0),
        "name": r,
        "color": styles[r][0],
        "dash": styles[r][1],
    }
    for (r,), g in s.group_by("run_id", maintain_order=True)
]
marks = data.stitch_marks(s, edges)
st.plotly_chart(
    charts.curve_figure(
        f"{tag} of {run}" if len(hops) == 1 else f"{tag} from {hops[0]} to {run}",
        lines,
        smoothing=0.0,
        vlines=marks,
        ignore_outliers=outliers,
        legend_lines=True,
        height=440,
    ),
    key="lineage_stitched",
    width="stretch",
)
resumes = edges.filter((pl.col("child_run") == pl.col("parent_run")) & pl.col("child_run").is_in(hops)).height
st.caption(
    f"{s.height} points, no step twice; each colour is one run on the path; dashed lines mark where "
    f"a writer took over ({len(hops) - 1} continuation(s) by another run, {resumes} resume(s) from a checkpoint)."
)
