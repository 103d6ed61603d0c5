"""Alerts & backtest: score rules on labelled runs (shown on arrival, as `workbench backtest`
prints them), compare sweeps, and see per run what a rule did, judged as the backtest judges it."""

from collections.abc import Sequence

import polars as pl
import streamlit as st

from workbench.app import PAGE, charts, data, state, untrusted
from workbench.app.untrusted import md
from workbench.store.aliases import glob_regex

st.title("Alerts & backtest")
gen = data.generation_or_stop()

labels = data.runs(gen)
n_labelled = labels.filter(pl.col("label").is_in(["failed", "healthy"])).height
if n_labelled == 0:
    st.info(
        "No labelled runs yet: add a labels.toml beside the runs and ingest again, or run "
        "`workbench label RUN --outcome failed --onset STEP`. NaN losses and loss-scale floors label themselves."
    )
    st.stop()

PARAMS = [
    state.Param("bt_runs", "runs", ""),
    state.Param("bt_horizon", "horizon", 100, lo=0, hi=10**9),
    state.Param("bt_lead", "lead", 500, lo=0, hi=10**9),
    state.Param("bt_warmup", "warmup", 0, lo=0, hi=10**9),
    state.Param("bt_rule", "rule", ""),
]
state.restore(PARAMS)
source = st.radio(
    "Rules", ["built-in detectors and the guides' rules", "my rules (TOML)"], horizontal=True, key="bt_source"
)
rules_text = None
if source.startswith("my rules"):
    rules_text = st.text_area("Rule file", data.guides_text(), height=260, key="bt_rules_text")
c1, c2, c3, c4 = st.columns([2, 1, 1, 1])
runs_glob = c1.text_input("Runs (glob over run ids; empty = all)", key="bt_runs")
horizon = c2.number_input("horizon (steps after onset)", 0, 10**9, key="bt_horizon")
lead = c3.number_input("lead (steps before onset)", 0, 10**9, key="bt_lead")
warmup = c4.number_input("warm-up (steps ignored at start)", 0, 10**9, key="bt_warmup")
args = (rules_text, runs_glob, int(horizon), int(lead), int(warmup))
b1, b2, b3 = st.columns([1, 2, 2])
if b1.button("Run backtest", type="primary", key="bt_run") or "bt_args" not in st.session_state:
    st.session_state["bt_args"] = args  # on arrival: the defaults, as `workbench backtest` runs them
if b2.button("Replay and store the alerts (shown on the curves)", key="bt_replay"):
    st.session_state["bt_replay_msg"] = data.replay_alerts(rules_text, runs_glob)
    st.cache_data.clear()
    gen = data.generation_or_stop()  # the replay's new generation
saved = b3.file_uploader(
    "or open saved results (backtest.json)",
    type="json",
    key="bt_saved",
    help="What `workbench backtest --out DIR` writes, or `--format json > scores.json`.",
)
if st.session_state.get("bt_replay_msg"):
    st.caption(md(st.session_state["bt_replay_msg"]))
if st.session_state["bt_args"] != args:
    st.caption("The settings above changed: press **Run backtest** to score with them.")


if saved is not None:
    res = untrusted.backtest_results(saved.getvalue())
    st.caption(f"Showing saved results from {md(saved.name)}.")
else:
    res = data.run_backtest(gen, *st.session_state["bt_args"])
if "error" in res:
    head, _, rest = res["error"].partition("\n")
    st.error(md(head))
    if rest:  # a rule's line with a caret under the fault: aligned, as text
        st.code(rest, language=None)
    st.stop()

PCT = "%.0f%%"
ORDER = [  # what a reader decides by first (does it fire on failed runs, not on healthy ones, how early)
    "rule",
    "trigger_rate_failed",
    "trigger_rate_healthy",
    "false_alarms_per_1k",
    "lead_time_median",
    "recall",
    "precision",
    "never_fired",
    "runs_evaluable",
    "first_trigger_mean",
    "first_trigger_std",
]
LAST = ["params"]  # wide: after the figures, as the rest a newer backtest writes
RATES = {"recall", "recall_ci_low", "recall_ci_high", "precision", "precision_ci_low", "precision_ci_high"}
RATES |= {"trigger_rate_failed", "trigger_rate_healthy"}


def table(
    rows: list[dict],
    key: str,
    first: Sequence[str] = (),
    pinned: int = 1,
    intervals: bool = True,
    params: bool = True,
) -> None:
    """Rows as a table: rates as percentages (as the CLI prints them), the key columns pinned
    left, any column a newer backtest adds shown after the known ones, `params` last; the
    confidence intervals only with `intervals`, the parameters only with `params`."""
    try:
        df = pl.DataFrame(rows, infer_schema_length=None)
    except (TypeError, ValueError, pl.exceptions.PolarsError):  # rows a saved file holds, mixed
        st.json(rows, expanded=False)
        return
    if df.is_empty():
        return
    cols = [c for c in first if c in df.columns] + [c for c in df.columns if c not in first and c not in LAST]
    cols += [c for c in LAST if c in df.columns]
    if not intervals:
        cols = [c for c in cols if "_ci_" not in c]
    if not params:
        cols = [c for c in cols if c not in LAST]
    rates = [c for c in cols if c in RATES or c.endswith(("_rate", "recall", "precision"))]
    df = df.select(cols).with_columns([(pl.col(c).cast(pl.Float64) * 100) for c in rates])
    config = {c: st.column_config.NumberColumn(c, format=PCT) for c in rates}
    for c in cols[:pinned]:
        config[c] = st.column_config.Column(c, pinned=True)
    st.dataframe(df, hide_index=True, width="stretch", key=key, column_config=config)


r0 = res["rules"][0] if res["rules"] else {}
st.subheader("Scores")
if saved is None:
    st.caption(
        f"{res['runs']} runs: {r0.get('runs_failed', 0)} failed, {r0.get('runs_healthy', 0)} healthy, "
        f"{res['unknown']} unlabelled (left out). A failed run is detected when an alarm falls in "
        f"[onset − lead, onset + horizon]; rates in %, intervals are 95 % bootstrap over runs."
    )
if res["rules"]:
    st.plotly_chart(charts.verdict_figure(res["rules"]), key="bt_verdict", width="stretch")
t1, t2 = st.columns(2)
with_ci = t1.toggle("95 % intervals", key="bt_intervals")
with_params = t2.toggle("parameters", key="bt_params")
table(res["rules"], "bt_table", ORDER, pinned=1, intervals=with_ci, params=with_params)
swept = sorted({r["rule"] for r in res["rules"] if sum(x["rule"] == r["rule"] for x in res["rules"]) > 1})
if swept:
    st.subheader("Threshold sweeps: recall vs false alarms")
    st.plotly_chart(
        charts.sweep_figure([r for r in res["rules"] if r["rule"] in swept]), key="bt_sweep", width="stretch"
    )
st.subheader("Convergence predictors")
table(res.get("predictors", []), "bt_pred", ["predictor", "calls", "calls_true", "precision"])
for name, value in res.items():  # keys a newer backtest writes (e.g. per failure kind), shown as they come
    if name in ("rules", "predictors", "unknown", "runs") or not value:
        continue
    st.subheader(md(name.replace("_", " ").capitalize()))
    if isinstance(value, list) and all(isinstance(v, dict) for v in value):
        table(value, f"bt_extra_{name}", ["rule"])
    elif isinstance(value, dict) and all(isinstance(v, dict) for v in value.values()):
        table([{"": k, **v} for k, v in value.items()], f"bt_extra_{name}", [""])
    else:
        st.json(value, expanded=False)

if saved is not None:
    st.stop()
st.subheader("Where a rule fired or missed")
points = [(r["rule"], r["params"]) for r in res["rules"]]
names = [f"{r} {p}" if sum(x[0] == r for x in points) > 1 else r for r, p in points]
state.keep_only("bt_rule", names)
if not st.session_state.get("bt_rule"):
    st.session_state["bt_rule"] = names[0]
name = st.selectbox("Rule", names, key="bt_rule")
state.publish(PARAMS)
rule, params = points[names.index(name)]
bt_args: tuple[str | None, str, int, int, int] = st.session_state["bt_args"]
out = data.rule_verdicts(gen, *bt_args, rule, params)
if isinstance(out, str):
    st.info(md(out))
    st.stop()
verdicts, alarms = out
b_rules, b_settings = st.session_state["bt_args"][0], st.session_state["bt_args"][2:]
st.caption(
    f"Replayed {md(name)} over the backtest's runs; a failed run's alarm counts in "
    f"[onset − {b_settings[1]}, onset + {b_settings[0]}] after a warm-up of {b_settings[2]} steps."
)
event = st.dataframe(
    verdicts,
    hide_index=True,
    width="stretch",
    on_select="rerun",
    selection_mode="multi-row",
    key="bt_runs_table",
    column_config={"run_id": st.column_config.Column("run", pinned=True)},
)
picked = [verdicts["run_id"][i] for i in event.selection.rows] if event and event.selection else []
fired = verdicts.filter(pl.col("alarms") > 0)["run_id"].to_list()
target = picked or fired
label = (
    f"Show {len(picked)} selected run(s) on the curves"
    if picked
    else f"Show the {len(fired)} run(s) where it fired on the curves"
)
if target and st.button(label, key="bt_open_curves"):
    st.session_state[data.SELECTED] = target
    st.session_state["bt_overlay"] = {
        "rule": rule,
        "alerts": alarms.filter(pl.col("run_id").is_in(target)).with_columns(
            rule=pl.lit(f"{name} (backtest)")
        ),
    }
    # the charts of the metric the rule reads (where its alarms are drawn), beside the loss
    tags = "|".join(glob_regex(n) for n in [*data.rule_metrics(b_rules).get(rule, []), "loss"])
    st.switch_page(PAGE["curves"].path, query_params={"run": target, "tags": tags})
