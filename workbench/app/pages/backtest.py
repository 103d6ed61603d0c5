"""Alerts & backtest: run rules over labelled runs, compare scores and sweeps, drill into runs."""

import polars as pl
import streamlit as st

from workbench.app import PAGE, charts, data

st.title("Alerts & backtest")
gen = data.generation()
if gen is None:
    st.info(data.no_store_message())
    st.stop()

source = st.radio(
    "Rules", ["built-in detectors and the guides' rules", "my rules (TOML)"], horizontal=True, key="bt_source"
)
rules_text = None
if source.startswith("my rules"):
    rules_text = st.text_area("Rule file", data.guides_text(), height=260, key="bt_rules_text")
c1, c2, c3 = st.columns([2, 1, 1])
runs_glob = c1.text_input("Runs (glob over run ids; empty = all)", key="bt_runs")
horizon = c2.number_input("horizon (steps after onset)", 0, 10**9, 100, key="bt_horizon")
lead = c3.number_input("lead (steps before onset)", 0, 10**9, 500, key="bt_lead")
b1, b2 = st.columns(2)
if b1.button("Run backtest", type="primary", key="bt_run"):
    st.session_state["bt_args"] = (rules_text, runs_glob, int(horizon), int(lead))
if b2.button("Replay and store the alerts (shown on the curves)", key="bt_replay"):
    st.session_state["bt_replay_msg"] = data.replay_alerts(rules_text, runs_glob)
    st.cache_data.clear()
    gen = data.generation()
if st.session_state.get("bt_replay_msg"):
    st.caption(st.session_state["bt_replay_msg"])

labels = data.runs(gen)
n_labelled = labels.filter(pl.col("label").is_in(["failed", "healthy"])).height
if n_labelled == 0:
    st.info(
        "No labelled runs yet: add a labels.toml beside the runs and ingest again, or run "
        "`workbench label RUN --outcome failed --onset STEP`. NaN losses and loss-scale floors label themselves."
    )
    st.stop()
if "bt_args" not in st.session_state:
    st.info(f"{n_labelled} labelled runs. Press **Run backtest** to score the rules on them.")
    st.stop()

res = data.run_backtest(gen, *st.session_state["bt_args"])
if "error" in res:
    st.error(res["error"])
    st.stop()
rules = pl.DataFrame(res["rules"], infer_schema_length=None)
r0 = res["rules"][0] if res["rules"] else {}
st.subheader("Scores")
st.caption(
    f"{res['runs']} runs: {r0.get('runs_failed', 0)} failed, {r0.get('runs_healthy', 0)} healthy, "
    f"{res['unknown']} unlabelled (left out). A failed run is detected when an alarm falls in "
    f"[onset − lead, onset + horizon]."
)
st.dataframe(
    rules.select(
        "rule",
        "params",
        "runs_evaluable",
        "trigger_rate_failed",
        "trigger_rate_healthy",
        "recall",
        "recall_ci_low",
        "recall_ci_high",
        "precision",
        "false_alarms_per_1k",
        "lead_time_median",
        "first_trigger_mean",
        "first_trigger_std",
        "never_fired",
        "description",
    ),
    hide_index=True,
    width="stretch",
    key="bt_table",
)
swept = rules.group_by("rule").len().filter(pl.col("len") > 1)["rule"].to_list()
if swept:
    st.subheader("Threshold sweeps: recall vs false alarms")
    st.plotly_chart(
        charts.sweep_figure([r for r in res["rules"] if r["rule"] in swept]), key="bt_sweep", width="stretch"
    )
st.subheader("Convergence predictors")
st.dataframe(
    pl.DataFrame(res["predictors"], infer_schema_length=None), hide_index=True, width="stretch", key="bt_pred"
)

st.subheader("Where a rule fired or missed")
alerts = data.alerts(gen, tuple(labels["run_id"].to_list()))
if alerts.is_empty():
    st.info("No stored alerts yet: press **Replay and store the alerts** above.")
    st.stop()
rule = st.selectbox("Rule", sorted(alerts["rule"].unique().to_list()), key="bt_rule")
first = (
    alerts.filter(pl.col("rule") == rule)
    .group_by("run_id")
    .agg(first_alarm=pl.col("step_fired").min(), alarms=pl.len())
)
table = (
    labels.select("run_id", "label", "onset", "failure")
    .join(first, on="run_id", how="left")
    .with_columns(
        verdict=pl.when(pl.col("label") == "healthy")
        .then(pl.when(pl.col("alarms").is_null()).then(pl.lit("quiet")).otherwise(pl.lit("false alarm")))
        .when(pl.col("label") == "failed")
        .then(pl.when(pl.col("alarms").is_null()).then(pl.lit("missed")).otherwise(pl.lit("fired")))
        .otherwise(pl.lit("unlabelled"))
    )
)
event = st.dataframe(
    table,
    hide_index=True,
    width="stretch",
    on_select="rerun",
    selection_mode="multi-row",
    key="bt_runs_table",
)
picked = [table["run_id"][i] for i in event.selection.rows] if event and event.selection else []
if picked and st.button(f"Show {len(picked)} run(s) on the curves", key="bt_open_curves"):
    st.session_state[data.SELECTED] = picked
    st.switch_page(PAGE["curves"].path)
