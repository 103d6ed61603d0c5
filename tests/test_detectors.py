"""Detectors and the replay engine: truth tables (values -> alert intervals), edge cases, and
the causality property (truncating a run never changes what fired before the cut)."""

from __future__ import annotations

import json
import math

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detectors import builtins as B
from detectors.engine import ReplayError, SeriesData, evaluate
from detectors.rules import Rule

NAN, INF = float("nan"), float("inf")


def data(runs: dict, metrics: dict | None = None, events: list | None = None) -> SeriesData:
    """runs: {run: {tag: [values at steps 0.. ] or [(step, value), ...]}}"""
    rows = []
    for run, tags in runs.items():
        for tag, pts in tags.items():
            pts = list(enumerate(pts)) if pts and not isinstance(pts[0], tuple) else pts
            rows += [
                {"run_id": run, "tag": tag, "metric": (metrics or {}).get(tag), "step": s, "value": float(v)}
                for s, v in pts
            ]
    frame = pl.DataFrame(
        rows,
        schema={
            "run_id": pl.String,
            "tag": pl.String,
            "metric": pl.String,
            "step": pl.Int64,
            "value": pl.Float64,
        },
    )
    ev = pl.DataFrame(
        events or [], schema={"run_id": pl.String, "step": pl.Int64, "kind": pl.String, "attrs": pl.String}
    )
    return SeriesData(frame, ev, sorted(runs))


def fired(rule, d) -> list[tuple]:
    alerts, _ = evaluate(rule, d)
    return [
        (r["run_id"], r["step_start"], r["step_fired"], r["step_end"]) for r in alerts.iter_rows(named=True)
    ]


def test_threshold_for_steps_truth_table():
    d = data({"r": {"x": [0, 5, 5, 5, 0, 5, 5, 5, 5, 0, 5]}})
    assert fired(Rule("t", "x > 4"), d) == [("r", 1, 1, 3), ("r", 5, 5, 8), ("r", 10, 10, 10)]
    assert fired(Rule("t", "x > 4", for_steps=3), d) == [("r", 1, 3, 3), ("r", 5, 7, 8)]
    assert fired(Rule("t", "x > 4", for_steps=4), d) == [("r", 5, 8, 8)]
    assert fired(Rule("t", "x > 4", warmup=2), d) == [("r", 2, 2, 3), ("r", 5, 5, 8), ("r", 10, 10, 10)]


def test_cooldown_merges_alerts():
    d = data({"r": {"x": [5, 0, 5, 0, 0, 0, 0, 5]}})
    assert fired(Rule("t", "x > 4"), d) == [("r", 0, 0, 0), ("r", 2, 2, 2), ("r", 7, 7, 7)]
    assert fired(Rule("t", "x > 4", cooldown=2), d) == [("r", 0, 0, 2), ("r", 7, 7, 7)]
    assert fired(Rule("t", "x > 4", cooldown=5), d) == [("r", 0, 0, 7)]


def test_nan_compares_false_and_not_catches_it():
    d = data({"r": {"x": [1, NAN, INF, -INF, 2]}})
    assert fired(Rule("t", "x > 0"), d) == [("r", 0, 0, 0), ("r", 2, 2, 2), ("r", 4, 4, 4)]
    assert fired(Rule("t", "x < 1e30"), d) == [("r", 0, 0, 0), ("r", 3, 3, 4)]
    assert fired(Rule("t", "not (x < 1e30)"), d) == [("r", 1, 1, 2)]
    assert fired(B.NonFinite(metric="x").rule(), d) == [("r", 1, 1, 3)]


def test_missing_metric_is_null_and_sparse_metric_is_as_of():
    # eval logged every 3 steps: carried forward; y starts at step 2: null (false) before
    d = data(
        {
            "r": {
                "loss": [1, 1, 1, 1, 1, 1],
                "eval_loss": [(0, 5), (3, 1)],
                "y": [(2, 1), (3, 1), (4, 1), (5, 1)],
            }
        }
    )
    assert fired(Rule("t", "eval_loss > loss"), d) == [("r", 0, 0, 2)]
    assert fired(Rule("t", "y > 0 or loss > 5"), d) == [("r", 2, 2, 5)]
    assert fired(Rule("t", "not (y > 5)"), d) == [("r", 2, 2, 5)]
    # on = eval_loss: evaluated only at eval steps
    assert fired(Rule("t", "eval_loss > 0", on="eval_loss"), d) == [("r", 0, 0, 3)]


def test_windows_use_only_past_values():
    d = data({"r": {"loss": [1.0] * 10 + [1.5, 0.5, 1.0]}})
    assert fired(Rule("t", "loss > mean(loss, 5)"), d) == [("r", 10, 10, 10)]
    assert fired(Rule("t", "loss > max(loss, 3)"), d) == [("r", 10, 10, 10)]
    assert fired(Rule("t", "loss < min(loss, 3)"), d) == [("r", 11, 11, 11)]
    # constant series: std 0, a sigma spike needs strictly more than the mean
    assert fired(B.SigmaSpike(window=5, k=3).rule(), data({"r": {"loss": [2.0] * 20}})) == []


def test_ema_delta_pct_change_slope_max_first():
    d = data({"r": {"g": [1, 1, 1, 1, 10, 1]}})
    assert fired(Rule("t", "g > 5 * ema(g, 0.9)"), d) == [("r", 4, 4, 4)]
    assert fired(Rule("t", "delta(g, 1) > 5"), d) == [("r", 4, 4, 4)]
    assert fired(Rule("t", "pct_change(g, 1) < -0.5"), d) == [("r", 5, 5, 5)]
    # slope per step, on irregular steps
    lin = data({"r": {"x": [(0, 0.0), (10, 1.0), (30, 3.0), (31, 3.1)]}})
    frame, _, _ = __import__("detectors.engine", fromlist=["conditions"]).conditions(
        Rule("t", "slope(x, 3) > 0.099"), lin
    )
    assert frame["cond"].to_list() == [False, False, True, True]
    # Megatron: |x| >= 10 x max of the first 3 finite values, known only after them
    m = data({"r": {"gn": [1, NAN, 2, 3, 25, 31, 100]}})
    assert fired(B.MegatronSpike(metric="gn", baseline=3).rule(), m) == [("r", 5, 5, 6)]


def test_empty_and_single_point_runs():
    d = data({"one": {"loss": [3.0]}, "two": {"loss": [1.0, 100.0]}})
    assert fired(Rule("t", "loss > 2"), d) == [("one", 0, 0, 0), ("two", 1, 1, 1)]
    assert fired(B.SigmaSpike(window=100).rule(), d) == []


def test_glob_evaluates_each_tag_and_alerts_carry_it():
    d = data({"r": {"gn/layer_0": [1, 1e-9, 1e-9], "gn/layer_1": [1, 1, 1e-9], "loss": [1, 1, 1]}})
    alerts, runs = evaluate(Rule("t", "`gn/layer_*` < 1e-8 and loss > 0"), d)
    assert [(r["tag"], r["step_start"]) for r in alerts.iter_rows(named=True)] == [
        ("gn/layer_0", 1),
        ("gn/layer_1", 2),
    ]
    assert "gn/layer_0" in alerts["message"][0] or "`gn/layer_*`" in alerts["message"][0]


def test_glob_rule_takes_a_plain_series_as_of_each_step_for_every_matched_tag():
    # every matched tag sees loss as logged at or before its own step, never a later value
    loss = [(s, s + 0.5) for s in range(1, 60, 3)]  # steps 1, 4, 7, ...
    run = {"gn/layer_0": list(range(60)), "gn/layer_1": list(range(60)), "loss": loss}
    d = data({"a": run, "b": run})
    alerts, _ = evaluate(Rule("t", "`gn/layer_*` >= 0 and loss < 4"), d)
    assert [
        (r["run_id"], r["tag"], r["step_start"], r["step_end"]) for r in alerts.iter_rows(named=True)
    ] == [(run_id, tag, 1, 3) for run_id in "ab" for tag in ("gn/layer_0", "gn/layer_1")]


def test_metric_names_resolve_through_aliases_and_absence_rules():
    d = data({"a": {"train/loss": [1, 9]}, "b": {"other": [1, 2]}}, metrics={"train/loss": "loss"})
    alerts, runs = evaluate(Rule("t", "loss > 5"), d)
    assert runs == ["a"] and alerts["run_id"].to_list() == ["a"]  # b is not evaluable, counted
    with pytest.raises(ReplayError, match="grad_norm found in no selected run.*Available metrics: loss"):
        evaluate(Rule("t", "grad_norm > 5"), d)
    slash = data({"a": {"grad_norm/layer_0": [1, 2]}})
    with pytest.raises(ReplayError, match=r"Did you mean `grad_norm/layer_0`\?"):
        evaluate(Rule("t", "grad_norm/layer_0 > 5"), slash)


def test_p1_truth_table():
    gn = [1.0] * 5 + [1e-6] * 6 + [1.0]
    ent = [2.0] * 3 + [0.1] * 9
    d = data({"r": {"grad_norm": gn, "attn_entropy": ent}})
    assert fired(B.PatternP1().rule(), d) == [("r", 5, 9, 10)]


def test_sigma_spike_with_flagged_points_kept_out_of_the_baseline():
    base = [1.0, 1.1, 0.9, 1.05, 0.95] * 4
    vals = base + [5.0, 5.0, 5.0] + [1.0]
    d = data({"r": {"loss": vals}})
    plain = fired(B.SigmaSpike(window=10, k=3).rule(), d)
    kept_out = fired(B.SigmaSpike(window=10, k=3, exclude_flagged=True).rule(), d)
    assert plain == [("r", 20, 20, 20)]  # the first spike inflates the window: the next two pass
    assert kept_out == [("r", 20, 20, 22)]


def test_plateau_reduce_lr_on_plateau_semantics():
    # improvements until 4, then within the 10 % threshold: counter 1, 2, 3 -> fires when > 2
    d = data({"r": {"eval_loss": [10, 8, 6, 5, 4, 3.9, 3.8, 3.7, 3.0, 2.9]}})
    assert fired(B.Plateau(threshold=0.1, patience=2).rule(), d) == [("r", 7, 7, 7)]
    # absolute threshold: 3.9 -> 3.8 is an improvement of 0.1 from the best (4), so no plateau
    assert fired(B.Plateau(threshold=0.1, patience=2, relative=False).rule(), d) == []


def test_gradient_flow_uses_first_and_last_layer_per_run():
    d = data(
        {
            "r": {
                "grad_norm/layer_0": [1, 1e-5, 1e-5],
                "grad_norm/layer_3": [1, 1, 1e-8],
                "grad_norm/layer_1": [9, 9, 9],
            }
        }
    )
    # vanishing at step 1 (1e-5 / 1), exploding at step 2 (1e-5 / 1e-8): one interval
    assert fired(B.GradientFlow().rule(), d) == [("r", 1, 1, 2)]


def test_loss_scale_collapse_from_events():
    ev = [{"run_id": "r", "step": s, "kind": "overflow", "attrs": "{}"} for s in (10, 20, 30, 31, 32, 33, 34)]
    ev.append({"run_id": "r", "step": 90, "kind": "min_loss_scale", "attrs": "{}"})
    d = data({"r": {"loss": [1.0] * 100}}, events=ev)
    assert fired(B.LossScaleCollapse(overflows=5, window=50).rule(), d) == [
        ("r", 32, 32, 34),
        ("r", 90, 90, 90),
    ]


def test_llmfoundry_persistent_spike():
    vals = [1.0] * 100 + [2.5] * 4 + [1.0] + [2.5] * 5
    d = data({"r": {"loss": vals}})
    assert fired(B.LlmFoundrySpike().rule(), d) == [("r", 105, 109, 109)]


def fired_before(cut):
    def pick(alerts):
        return sorted(
            (r["step_start"], r["step_fired"]) for r in alerts.iter_rows(named=True) if r["step_fired"] < cut
        )

    return pick


# --- causality ----------------------------------------------------------------------------------
CAUSAL_RULES = [
    Rule("spike", "x > mean(x, 8) + 2 * std(x, 8)", cooldown=3),
    Rule("ema", "x > 1.5 * ema(x, 0.8)", for_steps=2),
    Rule("slope", "slope(x, 5) < -0.1 and delta(y, 2) > 0"),
    Rule("first", "abs(x) > 2 * max_first(x, 5)"),
    Rule("sparse", "y > x", on="y", for_steps=2),
    B.SigmaSpike(metric="x", window=6, k=2, exclude_flagged=True).rule(),
    B.Plateau(metric="x", threshold=0.01, patience=3).rule(),
]
series = st.lists(st.one_of(st.floats(-5, 5), st.just(NAN), st.just(INF)), min_size=1, max_size=60)


@settings(deadline=None, max_examples=60)
@given(x=series, y=series, cut=st.integers(1, 60), stride=st.integers(1, 4))
def test_truncating_a_run_never_changes_what_fired_before_the_cut(x, y, cut, stride):
    xs = [(i * stride, v) for i, v in enumerate(x)]
    ys = [(i * stride * 2, v) for i, v in enumerate(y)]
    full = data({"r": {"x": xs, "y": ys}})
    part = data({"r": {"x": [p for p in xs if p[0] < cut], "y": [p for p in ys if p[0] < cut]}})
    for rule in CAUSAL_RULES:
        try:
            a_full, _ = evaluate(rule, full)
            a_part, _ = evaluate(rule, part)
        except ReplayError:
            continue  # a metric absent from the truncated run
        before = fired_before(cut)
        assert before(a_full) == before(a_part), rule.id


def test_alert_fields_and_message():
    d = data({"r": {"loss": [1, 1, 7]}})
    alerts, _ = evaluate(Rule("t", "loss > k", params={"k": 5}, severity="critical"), d)
    row = alerts.row(0, named=True)
    assert row["value"] == 7 and row["severity"] == "critical" and json.loads(row["params"]) == {"k": 5}
    assert row["message"] == "t: loss=7.0" and not math.isnan(row["value"])
