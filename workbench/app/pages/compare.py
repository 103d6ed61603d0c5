"""Compare runs (W&B's run comparer): for two or more runs, the config keys that differ between
them, their curves overlaid for every tag they all logged, and their alerts side by side; the
view is kept in the URL (`?run=a&run=b`)."""

import polars as pl
import streamlit as st

from workbench.app import charts, compare, data, state, untrusted
from workbench.app.untrusted import md

MAX_CHARTS = 12
BUCKETS = 300  # a chart is half the page wide: 300 buckets of 2 px
SIDE_BY_SIDE_MAX = 6  # more runs: their alerts in one table with a run column
POINTS_PER_CHART = 20_000  # what a sweep's lines share on one chart (as on Curves)

st.title("Compare runs")
gen = data.generation_or_stop()

all_runs = list(data.run_starts(gen))
PARAMS = [
    state.Param("compare_runs", "run", []),
    state.Param("compare_all_keys", "allkeys", False),
    state.Param("compare_tags", "tags", ""),
    state.Param("compare_smoothing", "smooth", 0.6, lo=0.0, hi=0.999),
]
if "compare_runs" not in st.session_state and "run" not in st.query_params:
    # arriving without a link: the runs ticked elsewhere in this session (Runs, Curves)
    st.session_state["compare_runs"] = [r for r in st.session_state.get(data.SELECTED, []) if r in all_runs]
state.restore(PARAMS)
state.keep_only("compare_runs", all_runs)
c1, c2, c3 = st.columns([3, 2, 2])
sel = c1.multiselect("Runs", all_runs, key="compare_runs", placeholder="two or more runs")
tag_filter = c2.text_input(
    "Tags (regex over the tags they share; empty: all)", key="compare_tags", placeholder="loss|grad_norm"
)
smoothing = c3.slider("Smoothing (TensorBoard EMA)", 0.0, 0.999, step=0.001, key="compare_smoothing")
state.publish(PARAMS)
if len(sel) < 2:
    st.info("Pick two or more runs to compare (or tick rows on the Runs page and press Compare).")
    st.stop()
st.session_state[data.SELECTED] = sel
styles = charts.line_styles(sel)

st.subheader("Config")
all_keys = st.toggle("all keys (not only those that differ between these runs)", key="compare_all_keys")
state.publish(PARAMS)
diff = compare.config_diff(data.configs(gen), sel, all_keys)
if lacking := compare.without_config(data.configs(gen), sel):
    st.caption(md(f"No config logged by {', '.join(lacking)} (an empty column each)."))
if diff.is_empty():
    st.info(
        "Their configs are the same."
        if not all_keys and data.configs(gen)["run_id"].is_in(sel).any()
        else "None of these runs logged a config (hparams, trainer arguments, a DeepSpeed config)."
    )
else:
    st.caption(
        f"{diff.height} keys {'in all' if all_keys else 'differ'}; {compare.MISSING}: the run has no such key."
    )
    st.dataframe(
        diff,
        hide_index=True,
        width="stretch",
        key="compare_config",
        column_config={compare.KEY: st.column_config.TextColumn(compare.KEY, pinned=True)},
    )

st.subheader("Curves")
tag_df = data.tags(gen, tuple(sel))
shared = compare.shared_tags(tag_df, len(sel))
if tag_filter:
    try:
        shared = [t for t, hit in zip(shared, untrusted.matches(tag_filter, shared), strict=True) if hit]
    except untrusted.BadPattern as e:
        st.warning(md(f"Tags {tag_filter}: {e}"))
        shared = []
if not shared:
    st.info("These runs share no tag" + (" matching the filter." if tag_filter else "."))
else:
    if len(shared) > MAX_CHARTS:
        st.caption(f"The first {MAX_CHARTS} of {len(shared)} shared tags: narrow the regex for the rest.")
    shown = shared[:MAX_CHARTS]
    metric_of = dict(tag_df.select("tag", "metric").iter_rows())
    data.prefetch(gen, [(r, t) for t in shown for r in sel])
    legend = len(sel) <= charts.LEGEND_MAX
    buckets = max(8, min(BUCKETS, POINTS_PER_CHART // (4 * len(sel))))
    for i in range(0, len(shown), 2):
        for col, tag in zip(st.columns(2), shown[i : i + 2], strict=False):
            if legend:  # a few runs, each cached alone
                curves = {r: data.display_curve(gen, r, tag, smoothing, "step", False, buckets) for r in sel}
            else:  # a sweep: smoothed together, one cached result per chart
                curves = dict(data.display_curves(gen, tuple(sel), tag, smoothing, "step", False, buckets))
            lines = [
                {**d, "name": run, "color": styles[run][0], "dash": styles[run][1]}
                for run in sel
                if (d := curves.get(run)) and "smooth_x" in d
            ]
            metric = metric_of.get(tag)
            col.plotly_chart(
                charts.curve_figure(
                    tag + (f"  ({metric})" if metric and metric != tag else ""),
                    lines,
                    smoothing=smoothing,
                    show_raw=False,
                    legend_lines=legend,
                    height=330,
                ),
                key=f"compare_chart_{tag}",
                width="stretch",
            )

st.subheader("Alerts")
alerts = data.alerts(gen, tuple(sel))
if alerts.is_empty():
    st.info("None of these runs has an alert (`workbench replay` raises them over stored runs).")
else:
    side_by_side = len(sel) <= SIDE_BY_SIDE_MAX
    st.caption(
        "Alerts per rule and run; "
        + ("each run's alerts below, side by side." if side_by_side else "every alert below, by run.")
    )
    st.dataframe(
        compare.alert_counts(alerts, sel), hide_index=True, width="stretch", key="compare_alert_counts"
    )
    if not side_by_side:
        st.dataframe(
            alerts.select("run_id", "rule", "step_fired", "severity", "value", "message"),
            hide_index=True,
            width="stretch",
            key="compare_alerts",
            column_config={"run_id": st.column_config.TextColumn("run", pinned=True)},
        )
    per_row = min(len(sel), 3) if side_by_side else 0
    for i in range(0, len(sel) if side_by_side else 0, max(per_row, 1)):
        for col, run in zip(st.columns(per_row), sel[i : i + per_row], strict=False):
            mine = alerts.filter(pl.col("run_id") == run)
            col.markdown(f"**{md(run)}** · {mine.height} alert{'s' if mine.height != 1 else ''}")
            if not mine.is_empty():
                col.dataframe(
                    mine.select("rule", "step_fired", "severity", "value", "message"),
                    hide_index=True,
                    width="stretch",
                    key=f"compare_alerts_{run}",
                )
