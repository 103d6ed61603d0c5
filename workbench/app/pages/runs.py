"""Runs: every run with its status, label and alerts; filter, select, open the curves."""

import polars as pl
import streamlit as st

from workbench.app import PAGE, data

st.title("Runs")
gen = data.generation()
if gen is None:
    st.info(data.no_store_message())
    st.stop()

runs = data.runs(gen)
c1, c2, c3 = st.columns([2, 1, 1])
pattern = c1.text_input("Run name (regex)", key="runs_pattern")
statuses = sorted(runs["status"].drop_nulls().unique().to_list())
chosen = c2.multiselect("Status", statuses, default=statuses, key="runs_status")
labels = sorted(runs["label"].fill_null("unlabelled").unique().to_list())
chosen_labels = c3.multiselect("Label", labels, default=labels, key="runs_label")
shown = runs.filter(
    pl.col("status").is_in(chosen) & pl.col("label").fill_null("unlabelled").is_in(chosen_labels)
)
if pattern:
    try:
        shown = shown.filter(pl.col("run_id").str.contains(pattern))
    except Exception:  # noqa: BLE001 - an unfinished regex while typing
        st.warning(f"Not a valid regular expression: `{pattern}`")
st.caption(
    f"{shown.height} of {runs.height} runs · store generation {gen} · select rows to compare them on the Curves page"
)
event = st.dataframe(
    shown.drop("config"),
    hide_index=True,
    width="stretch",
    on_select="rerun",
    selection_mode="multi-row",
    key="runs_table",
)
picked = [shown["run_id"][i] for i in event.selection.rows] if event and event.selection else []
if picked:
    st.session_state[data.SELECTED] = picked
    if st.button(f"Open {len(picked)} run(s) in Curves", key="runs_open_curves"):
        st.switch_page(PAGE["curves"].path)
