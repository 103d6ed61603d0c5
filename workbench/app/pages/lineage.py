"""Lineage: which run continued which checkpoint; a series stitched along a lineage path."""

import polars as pl
import streamlit as st

from workbench.app import charts, data

st.title("Lineage")
gen = data.generation()
if gen is None:
    st.info(data.no_store_message())
    st.stop()
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
children = edges.filter(pl.col("child_run") != pl.col("parent_run"))["child_run"].unique().sort().to_list()
candidates = children or edges["child_run"].unique().sort().to_list()
c1, c2 = st.columns(2)
run = c1.selectbox("Run (the path goes from its root to it)", candidates, key="lineage_run")
tag = c2.text_input("Tag or metric", "loss", key="lineage_tag")
s = data.stitched(gen, run, tag)
if s.is_empty():
    st.info(f"No `{tag}` points along this path.")
    st.stop()
series = [
    {"run_id": r, "tag": tag, "x": g["step"].to_numpy(), "y": g["value"].to_numpy()}
    for (r,), g in s.group_by("run_id", maintain_order=True)
]
st.plotly_chart(
    charts.curves_figure(series, smoothing=0.0, facet=False), key="lineage_stitched", width="stretch"
)
st.caption(f"{s.height} points, no step twice; each colour is one run on the path.")
