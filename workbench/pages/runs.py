"""Runs page: every run in the store, filterable by name and status."""

import streamlit as st

from workbench import app_data

st.title("Runs")
gen = app_data.generation()
if gen is None:
    st.info(
        f"No store at `{app_data.store().root}` yet. Create one with "
        "`workbench ingest PATH` (or set `WORKBENCH_STORE` to an existing store), then reload."
    )
    st.stop()

runs = app_data.runs(gen)
col1, col2 = st.columns([2, 1])
pattern = col1.text_input("Run name (regex)", key="runs_pattern")
statuses = sorted(runs["status"].drop_nulls().unique().to_list())
chosen = col2.multiselect("Status", statuses, default=statuses, key="runs_status")
shown = runs.filter(runs["status"].is_in(chosen))
if pattern:
    try:
        shown = shown.filter(shown["run_id"].str.contains(pattern))
    except Exception:  # noqa: BLE001 - an unfinished regex while typing
        st.warning(f"Not a valid regular expression: `{pattern}`")
st.caption(f"{shown.height} of {runs.height} runs · store generation {gen}")
st.dataframe(shown, hide_index=True, width="stretch")
