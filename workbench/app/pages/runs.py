"""Runs: every run with its status, label, alerts and config; filter, select, open the curves;
a parallel-coordinates view of config against the final loss."""

import polars as pl
import streamlit as st

from workbench.app import PAGE, charts, data, state, untrusted
from workbench.app.untrusted import md

st.title("Runs")
gen = data.generation_or_stop()

runs = data.runs(gen)
statuses = sorted(runs["status"].drop_nulls().unique().to_list())
labels = sorted(runs["label"].fill_null("unlabelled").unique().to_list())
PARAMS = [
    state.Param("runs_pattern", "q", ""),
    state.Param("runs_status", "status", []),  # none picked: all, including values a later ingest brings
    state.Param("runs_label", "label", []),
    state.Param("runs_live", "live", False),
]
state.restore(PARAMS)
state.keep_only("runs_status", statuses)
state.keep_only("runs_label", labels)
c1, c2, c3, c4 = st.columns([2, 1, 1, 1])
pattern = c1.text_input("Run name (regex)", key="runs_pattern")
chosen = c2.multiselect("Status", statuses, key="runs_status", placeholder="all")
chosen_labels = c3.multiselect("Label", labels, key="runs_label", placeholder="all")
live = c4.toggle(
    "Live refresh", key="runs_live", help="Re-read the store every few seconds while it is written."
)
state.publish(PARAMS)
state.live_refresh(gen, live)

shown = runs.filter(
    pl.col("status").is_in(chosen or statuses)
    & pl.col("label").fill_null("unlabelled").is_in(chosen_labels or labels)
)
if pattern:
    try:
        shown = shown.filter(
            pl.Series(untrusted.matches(pattern, shown["run_id"].to_list()), dtype=pl.Boolean)
        )
    except untrusted.BadPattern as e:  # an unfinished regex while typing
        st.warning(md(f"Run name {pattern}: {e}"))
st.caption(
    f"{shown.height} of {runs.height} runs · store generation {gen} · select rows to compare them on the Curves page"
)
table = shown.drop("config", "started")
if not (table["live_alerts"] > 0).any():
    table = table.drop("live_alerts")
wanted = set(st.query_params.get_all("run") or st.session_state.get(data.SELECTED, []))
event = st.dataframe(
    table,
    hide_index=True,
    width="stretch",
    on_select="rerun",
    selection_mode="multi-row",
    selection_default={"selection": {"rows": [i for i, r in enumerate(table["run_id"]) if r in wanted]}},
    key="runs_table",
    column_config={
        "run_id": st.column_config.TextColumn("run", pinned=True),
        "last_loss": st.column_config.NumberColumn("last loss", format="%.4g"),
    },
)
picked = [table["run_id"][i] for i in event.selection.rows] if event and event.selection else []
if picked:
    st.session_state[data.SELECTED] = picked
    st.query_params["run"] = picked
    b1, b2 = st.columns(2)
    if b1.button(f"Open {len(picked)} run(s) in Curves", key="runs_open_curves", type="primary"):
        st.switch_page(PAGE["curves"].path, query_params={"run": picked})
    if len(picked) >= 2 and b2.button(f"Compare {len(picked)} runs", key="runs_compare"):
        st.switch_page(PAGE["compare"].path, query_params={"run": picked})
elif "run" in st.query_params:
    del st.query_params["run"]

st.subheader("Config")
compared = picked or shown["run_id"].to_list()  # the ticked runs, else every run the filter shows
st.caption(
    f"Of the {len(picked)} ticked runs." if picked else "Of the runs shown (tick rows to compare those)."
)
cfg = data.configs(gen).filter(pl.col("run_id").is_in(compared))
if cfg.is_empty():
    st.info("None of these runs logged a config (hparams, trainer arguments, a DeepSpeed config).")
    st.stop()
differ = [c for c in cfg.columns[1:] if cfg[c].drop_nulls().n_unique() > 1]
all_keys = st.toggle("all keys (not only those that differ between these runs)", key="runs_all_keys")
keys = cfg.columns[1:] if all_keys else differ
st.dataframe(
    cfg.select("run_id", *keys),
    hide_index=True,
    width="stretch",
    key="runs_config",
    column_config={"run_id": st.column_config.TextColumn("run", pinned=True)},
)
if len(differ) >= 1 and cfg.height >= 2:
    st.subheader("Config against the outcome")
    outcome = runs.select("run_id", "last_loss", "label", "status")
    rows = cfg.select("run_id", *differ).join(outcome, on="run_id", how="left")
    numeric_keys = [k for k in differ if rows[k].dtype.is_numeric()]
    # a filter that changes the keys on offer keeps the axes still offered, else the defaults
    kept = [k for k in st.session_state.get("runs_parallel_keys", []) if k in differ]
    st.session_state["runs_parallel_keys"] = kept or (numeric_keys or differ)[:6]
    dims = st.multiselect("Axes (config keys)", differ, key="runs_parallel_keys")
    color_by = st.radio(
        "Colour and last axis", ["last_loss", "label", "status"], horizontal=True, key="runs_color"
    )
    if dims:
        st.plotly_chart(
            charts.parallel_figure(rows.to_dicts(), dims, color_by), key="runs_parallel", width="stretch"
        )
