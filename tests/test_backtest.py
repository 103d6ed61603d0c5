"""Backtest metrics on hand-built alerts and labels with known answers (per rule, per failure
kind, the ensemble, cross-validated tuning, predictors and evaluation schedules); golden
summaries of the guides' rule set and of the built-ins on sample_runs/ (regenerate:
WORKBENCH_UPDATE_GOLDEN=1 pytest tests/test_backtest.py)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from conftest import cli
from hypothesis import given, settings
from hypothesis import strategies as hst

from detectors.backtest import RULE_FIELDS, RunInfo, Settings, backtest, best_under_budget, frontier, score
from detectors.kinds import KIND_FIELDS, SUMMARY_FIELDS, ensemble, kind_rows, merge_alarms, summary_rows
from detectors.predictors import (
    EPS,
    EVAL_EMA_WEIGHT,
    MIN_EVAL_POINTS,
    W,
    always_calls,
    fit_curve,
    forecast_plateau,
    plateau_labels,
    plateau_onset,
    schedule_scores,
    verdict,
)
from detectors.rules import Rule
from detectors.scoring import fisher_greater, outcomes
from detectors.streaks import ALERT_SCHEMA
from detectors.tuning import TUNE_FIELDS, _Counts, folds_of, pick, run_groups, tune_rule

ROOT = Path(__file__).parent.parent
GOLDEN = Path(__file__).parent / "golden" / "backtest_guides.json"


def runs():
    def r(run, outcome, onset, last=199):
        return RunInfo(run, outcome, onset, 0, np.arange(0, last + 1))

    return {
        "f1": r("f1", "failed", 100),
        "f2": r("f2", "failed", 50),
        "f3": r("f3", "failed", 300, 399),
        "h1": r("h1", "healthy", None),
        "h2": r("h2", "healthy", None),
    }


def alerts(fired: dict[str, list[int]]) -> pl.DataFrame:
    rows = [
        {
            "run_id": run,
            "rule": "t",
            "tag": "",
            "step_start": s,
            "step_fired": s,
            "step_end": s,
            "value": 1.0,
            "message": "",
            "params": "{}",
            "severity": "warning",
        }
        for run, steps in fired.items()
        for s in steps
    ]
    return pl.DataFrame(rows, schema=ALERT_SCHEMA)


def test_metrics_on_known_alerts():
    st = Settings(horizon=20, lead=30, bootstrap=0)
    m = score(Rule("t", "x > 1"), alerts({"f1": [90], "f2": [10], "h1": [50, 150]}), list(runs()), runs(), st)
    assert list(m) == RULE_FIELDS
    assert (m["runs_failed"], m["runs_healthy"], m["runs_evaluable"]) == (3, 2, 5)
    assert m["trigger_rate_failed"] == pytest.approx(2 / 3)  # f2's early alarm still triggers
    assert m["trigger_rate_healthy"] == 0.5
    assert m["recall"] == pytest.approx(1 / 3)  # only f1 inside [onset - 30, onset + 20]
    assert m["precision"] == pytest.approx(1 / 3)  # f2 (early only) and h1 are false positives
    # negative stretches: h1 200 + h2 200 + f1 [0, 70) + f2 [0, 20) + f3 [0, 270) = 760 steps, 3 alarms
    assert m["false_alarms_per_1k"] == pytest.approx(1000 * 3 / 760)
    assert (m["lead_time_median"], m["lead_time_mean"], m["lead_time_std"]) == (10.0, 10.0, None)
    assert m["first_trigger_mean"] == 50.0 and m["first_trigger_std"] == pytest.approx(math.sqrt(3200))
    assert m["never_fired"] == 1
    assert (m["evaluable_failed"], m["evaluable_healthy"]) == (3, 2)
    assert m["separation"] == pytest.approx(2 / 3 - 0.5)
    assert m["false_alarms_per_1k_healthy"] == pytest.approx(1000 * 2 / 400)  # h1's two alarms
    # one-sided Fisher exact test of 2/3 failed vs 1/2 healthy firing
    assert m["separation_p"] == pytest.approx(0.7)


@pytest.mark.parametrize(
    "step, detected, triggered", [(120, True, True), (121, False, False), (70, True, True), (69, False, True)]
)
def test_window_edges(step, detected, triggered):
    st = Settings(horizon=20, lead=30, bootstrap=0)
    only = {"f1": runs()["f1"]}
    m = score(Rule("t", "x > 1"), alerts({"f1": [step]}), ["f1"], only, st)
    assert m["recall"] == (1.0 if detected else 0.0)
    assert m["trigger_rate_failed"] == (1.0 if triggered else 0.0)


def test_warmup_ignores_early_alarms_and_failed_without_onset_counts_any_alarm():
    rs = runs()
    rs["f4"] = RunInfo("f4", "failed", None, 0, np.arange(100))
    m = score(
        Rule("t", "x > 1"),
        alerts({"h1": [5], "f4": [80]}),
        ["h1", "f4"],
        {k: rs[k] for k in ("h1", "f4")},
        Settings(warmup=10, bootstrap=0),
    )
    assert m["trigger_rate_healthy"] == 0.0 and m["recall"] == 1.0 and m["lead_time_median"] is None


def test_never_firing_rule_has_nulls_not_nans():
    m = score(Rule("t", "x > 1"), alerts({}), list(runs()), runs(), Settings(bootstrap=50))
    assert (
        m["recall"] == 0.0
        and m["precision"] is None
        and m["lead_time_mean"] is None
        and m["never_fired"] == 3
    )
    json.dumps(m, allow_nan=False)


def test_bootstrap_interval_contains_the_estimate():
    rs = {f"f{i}": RunInfo(f"f{i}", "failed", 100, 0, np.arange(200)) for i in range(20)}
    fired = {f"f{i}": [95] for i in range(12)}
    m = score(Rule("t", "x > 1"), alerts(fired), list(rs), rs, Settings(bootstrap=500, seed=1))
    assert m["recall"] == 0.6 and m["recall_ci_low"] < 0.6 < m["recall_ci_high"]
    assert m["recall_ci_low"] > 0.3 and m["recall_ci_high"] < 0.85


def test_sweep_frontier_and_budget():
    res = [
        {"rule": "s", "params": "a", "recall": 0.9, "false_alarms_per_1k": 5.0},
        {"rule": "s", "params": "b", "recall": 0.7, "false_alarms_per_1k": 1.0},
        {"rule": "s", "params": "c", "recall": 0.6, "false_alarms_per_1k": 2.0},  # dominated
        {"rule": "s", "params": "d", "recall": 0.2, "false_alarms_per_1k": 0.0},
    ]
    assert [r["params"] for r in frontier(res, "s")] == ["d", "b", "a"]
    assert best_under_budget(res, "s", 1.5)["params"] == "b" and best_under_budget(res, "s", -1) is None


@pytest.fixture(scope="module")
def sample_store(sample_runs_store):
    return sample_runs_store  # backtests only read


def _round(x):
    return round(x, 4) if isinstance(x, float) else x


def test_golden_summary_of_the_guides_rule_set(sample_store):
    from detectors.rules import load_rule_file

    res = backtest(
        sample_store, load_rule_file(ROOT / "detectors/guides.toml"), None, Settings(bootstrap=200)
    )
    summary = sorted(
        ({k: _round(v) for k, v in r.items() if k != "description"} for r in res.rules),
        key=lambda r: (r["rule"], r["params"]),
    )
    summary = {"rules": summary, "predictors": [{k: _round(v) for k, v in p.items()} for p in res.predictors]}
    if os.environ.get("WORKBENCH_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    assert summary == json.loads(GOLDEN.read_text())
    p1 = next(r for r in summary["rules"] if r["rule"] == "guides_P1" and "1e-05" in r["params"])
    assert (
        p1["trigger_rate_healthy"] == 0.0 and p1["never_fired"] == 11
    )  # fires only where attention collapsed


def test_cli_backtest_json_contract(sample_store, tmp_path):
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "workbench",
            "backtest",
            "--store",
            str(sample_store.root),
            "--format",
            "json",
            "--bootstrap",
            "50",
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr

    def no_bare_constants(token):
        raise AssertionError(f"bare {token} in JSON output")

    doc = json.loads(p.stdout, parse_constant=no_bare_constants)
    assert set(doc) == {
        "rules",
        "predictors",
        "kinds",
        "ensemble",
        "summary",
        "tuning",
        "schedule",
        "attributes",
        "skipped",
        "families",
        "not_evaluable",
        "scorecard",
        "tuning_families",
    }
    assert doc["attributes"] == ["trainer"] and doc["families"] and doc["not_evaluable"]
    assert all(r["origin"] for r in doc["rules"])
    assert all(
        r["lofo_recall_family"].startswith("trainer=") for r in doc["rules"] if r["lofo_recall"] is not None
    )
    required = [
        "rule",
        "params",
        "runs_failed",
        "runs_healthy",
        "runs_evaluable",
        "trigger_rate_failed",
        "trigger_rate_healthy",
        "recall",
        "precision",
        "false_alarms_per_1k",
        "lead_time_median",
        "lead_time_mean",
        "lead_time_std",
        "first_trigger_mean",
        "first_trigger_std",
        "never_fired",
    ]
    assert all(set(required) <= set(r) for r in doc["rules"])
    assert len({(r["runs_failed"], r["runs_healthy"]) for r in doc["rules"]}) == 1
    pred = [
        "predictor",
        "calls",
        "calls_true",
        "precision",
        "timing_error_median",
        "final_loss_error_at_10",
        "final_loss_error_at_25",
        "final_loss_error_at_50",
        "baseline_error_at_10",
        "baseline_error_at_25",
        "baseline_error_at_50",
    ]
    pred += ["recall", "false_calls_per_1k", "ema_error_at_10", "verdict", "criterion"]
    assert {p["predictor"] for p in doc["predictors"]} == {
        "slope_rule",
        "reduce_lr_on_plateau",
        "curve_fit",
        "always",
    }
    assert all(set(pred) <= set(p) for p in doc["predictors"])
    assert (tmp_path / "out/rules.parquet").exists() and (tmp_path / "out/backtest.json").exists()


# --- trigger-rate intervals, failure kinds, the ensemble, the summary ------------------------------
def kinded():
    def r(run, outcome, onset, kind=None, last=199):
        return RunInfo(run, outcome, onset, 0, np.arange(0, last + 1), kind)

    return {
        "s1": r("s1", "failed", 100, "loss_spike"),
        "s2": r("s2", "failed", 100, "loss_spike"),
        "c1": r("c1", "failed", 150, "collapse"),
        "h1": r("h1", "healthy", None),
        "h2": r("h2", "healthy", None),
    }


def test_trigger_rate_intervals_resample_runs_within_each_cohort():
    rs = {f"f{i}": RunInfo(f"f{i}", "failed", 100, 0, np.arange(200)) for i in range(20)}
    rs |= {f"h{i}": RunInfo(f"h{i}", "healthy", None, 0, np.arange(200)) for i in range(20)}
    fired = {**{f"f{i}": [95] for i in range(14)}, **{f"h{i}": [50] for i in range(2)}}
    m = score(Rule("t", "x > 1"), alerts(fired), list(rs), rs, Settings(bootstrap=500, seed=3))
    assert (m["trigger_rate_failed"], m["trigger_rate_healthy"]) == (0.7, 0.1)
    assert m["trigger_rate_failed_ci_low"] < 0.7 < m["trigger_rate_failed_ci_high"]
    assert 0.0 <= m["trigger_rate_healthy_ci_low"] < 0.1 < m["trigger_rate_healthy_ci_high"] < 0.35
    assert m["separation"] == pytest.approx(0.6)
    assert 0.3 < m["separation_ci_low"] < 0.6 < m["separation_ci_high"]
    assert m["separation_p"] < 1e-3


def test_kind_matrix_rows_on_known_alarms():
    rs = kinded()
    outs = outcomes({"s1": [100], "c1": [400], "h2": [10, 90]}, list(rs), rs, Settings(horizon=20, lead=30))
    rows = {r["kind"]: r for r in kind_rows("t", "{}", outs, rs)}
    assert list(rows) == ["collapse", "loss_spike", "healthy"] and list(rows["healthy"]) == KIND_FIELDS
    assert (
        rows["loss_spike"]["detected"],
        rows["loss_spike"]["evaluable"],
        rows["loss_spike"]["recall"],
    ) == (1, 2, 0.5)
    assert rows["loss_spike"]["lead_time_median"] == 0.0
    assert (
        rows["collapse"]["recall"] == 0.0 and rows["collapse"]["triggered"] == 0
    )  # 400 is past onset + horizon
    h = rows["healthy"]
    assert (h["triggered"], h["trigger_rate"], h["recall"]) == (1, 0.5, None)
    assert h["false_alarms_per_1k"] == pytest.approx(1000 * 2 / 400)
    # a kind the rule could not be evaluated on has nulls, not zeros
    only_h = kind_rows("t", "{}", {"h1": outs["h1"]}, rs)
    assert next(r for r in only_h if r["kind"] == "collapse")["recall"] is None


def test_ensemble_merges_alarms_within_the_refractory_and_scores_like_a_rule():
    assert merge_alarms([{"a": [10, 100]}, {"a": [15, 40], "b": [5]}], 20) == {"a": [10, 40, 100], "b": [5]}
    rs = kinded()
    st = Settings(horizon=20, lead=30, bootstrap=0, refractory=20)
    spike = (Rule("spike", "x > 1"), {"s1": [100], "s2": [101], "h1": [50]}, ["s1", "s2", "h1", "h2"])
    collapse = (Rule("collapse", "y > 1"), {"c1": [150], "h1": [60]}, ["c1", "h1", "h2"])
    row, kinds, _, _ = ensemble([spike, collapse], rs, st)
    assert row["members"] == ["spike", "collapse"] and json.loads(row["params"])["members"] == [
        "spike",
        "collapse",
    ]
    assert row["recall"] == 1.0 and row["trigger_rate_healthy"] == 0.5
    assert row["false_alarms_per_1k_healthy"] == pytest.approx(1000 * 1 / 400)  # 50 and 60: one event
    assert {k["kind"]: k["detected"] for k in kinds if k["kind"] != "healthy"} == {
        "collapse": 1,
        "loss_spike": 2,
    }


def test_a_failed_run_no_member_could_evaluate_counts_as_missed_in_the_ensemble():
    rs = kinded()
    st = Settings(horizon=20, lead=30, bootstrap=0, refractory=20)
    spike = (Rule("spike", "x > 1"), {"s1": [100], "s2": [101]}, ["s1", "s2", "h1", "h2"])
    row, kinds, _, outs = ensemble([spike], rs, st)
    # c1 (collapse) is out of reach of every member: missed, not dropped from the recall
    assert outs["c1"].verdict == "not evaluable" and outs["c1"].reason == "no member rule could evaluate it"
    assert row["recall"] == pytest.approx(2 / 3) and row["recall_all"] == pytest.approx(2 / 3)
    assert (row["runs_evaluable"], row["evaluable_failed"], row["not_evaluable_failed"]) == (4, 2, 1)
    assert row["never_fired"] == 1
    collapse = next(k for k in kinds if k["kind"] == "collapse")
    assert (collapse["runs"], collapse["evaluable"], collapse["detected"], collapse["recall"]) == (
        1,
        0,
        0,
        0.0,
    )


def test_summary_rows_carry_the_kinds_a_rule_catches_and_recovery_success():
    results = [
        {**{k: None for k in RULE_FIELDS}, "rule": "r", "params": "{}", "default": True}
        | {"recoveries_after_alarm": 4, "recoveries_healthy": 3},
        {**{k: None for k in RULE_FIELDS}, "rule": "r", "params": "{x}", "default": False},
    ]
    kinds = [
        {"rule": "r", "params": "{}", "kind": "a", "recall": 0.5},
        {"rule": "r", "params": "{}", "kind": "b", "recall": 0.4},
        {"rule": "r", "params": "{}", "kind": "healthy", "recall": None},
    ]
    (row,) = summary_rows(results, kinds)
    assert list(row) == SUMMARY_FIELDS
    assert row["kinds_caught"] == ["a"] and row["recovery_success"] == 0.75


# --- honest tuning ------------------------------------------------------------------------------
def test_run_groups_keep_lineage_together_and_folds_deal_groups():
    groups = run_groups(["a", "b", "c", "d"], [("b", "a"), ("x", "c")])
    assert groups == [["a", "b"], ["c"], ["d"]]
    assert folds_of(groups, None) == groups
    two = folds_of(groups, 2, seed=0)
    assert len(two) == 2 and sorted(r for f in two for r in f) == ["a", "b", "c", "d"]
    assert any(set(f) >= {"a", "b"} for f in two)  # a group is never split


def test_cross_validation_shows_what_the_in_sample_pick_hides():
    """P1 catches more but fires on h1: within a zero budget the in-sample pick is the default
    P0. Leaving h1 out makes P1 look free, so that fold picks it and h1, scored at P1, fires:
    the cross-validated score shows the false alarm the in-sample one hides."""
    rs = {
        "f1": RunInfo("f1", "failed", 100, 0, np.arange(200), "k"),
        "f2": RunInfo("f2", "failed", 100, 0, np.arange(200), "k"),
        "h1": RunInfo("h1", "healthy", None, 0, np.arange(200)),
        "h2": RunInfo("h2", "healthy", None, 0, np.arange(200)),
        "f3": RunInfo("f3", "failed", 100, 0, np.arange(200), "k"),
    }
    st = Settings(horizon=20, lead=30)
    p0 = outcomes({"f1": [100]}, list(rs), rs, st)
    p1 = outcomes({"f1": [100], "f2": [100], "f3": [100], "h1": [50]}, list(rs), rs, st)
    rule_points = [
        (Rule("t", "x > 1", params={"k": 0}), p0, True),
        (Rule("t", "x > 1", params={"k": 1}), p1, False),
    ]
    runs = ["f1", "f2", "h1", "h2"]
    row, _ = tune_rule(rule_points, runs, [], [[r] for r in runs], budget=0.0)
    assert list(row) == TUNE_FIELDS
    assert row["picked_params"] == '{"k": 0}' and row["default_params"] == '{"k": 0}'
    assert (row["in_sample_recall"], row["in_sample_trigger_rate_healthy"]) == (0.5, 0.0)
    assert (row["cv_recall"], row["cv_trigger_rate_healthy"]) == (0.5, 0.5)
    assert row["pick_agreement"] == 0.75 and row["optimism_recall"] == 0.0
    # with a budget that lets P1's false alarm through, P1 wins in-sample; scored on held-out runs
    loose, _ = tune_rule(rule_points, ["f1", "f3", "h1"], ["f2", "h2"], [["f1"], ["f3"], ["h1"]], budget=10.0)
    assert loose["picked_params"] == '{"k": 1}' and loose["holdout_recall"] == 1.0
    assert loose["default_holdout_recall"] == 0.0 and loose["holdout_trigger_rate_healthy"] == 0.0


def test_leaving_a_family_out_shows_what_picking_on_the_others_costs_it():
    """P1 catches every failed run but fires on x's healthy h1; P0 is quiet and catches f1 only.
    Picked on y alone, P1 looks free and fires on x's healthy run; picked on x alone, P0 wins
    and misses y's failed runs: both worst families show what the in-sample pick (P0) hides."""
    from detectors.families import families

    def r(run, outcome, trainer):
        return RunInfo(
            run, outcome, 100 if outcome == "failed" else None, 0, np.arange(200), "k", {"trainer": trainer}
        )

    x = ["f1", "f2", "f4", "h1", "h3", "h4"]
    rs = {
        n: r(n, "failed" if n[0] == "f" else "healthy", "x" if n in x else "y")
        for n in [*x, "f3", "f5", "f6", "h2", "h5", "h6"]
    }
    st = Settings(horizon=20, lead=30)
    p0 = outcomes({"f1": [100]}, list(rs), rs, st)
    p1 = outcomes({**{f: [100] for f in rs if f[0] == "f"}, "h1": [50]}, list(rs), rs, st)
    points = [
        (Rule("t", "x > 1", params={"k": 0}), p0, True),
        (Rule("t", "x > 1", params={"k": 1}), p1, False),
    ]
    runs, fams = sorted(rs), families(rs, ["trainer"])
    row, held = tune_rule(points, runs, [], [[n] for n in runs], 0.0, fams=fams)
    assert row["picked_params"] == '{"k": 0}' and row["in_sample_trigger_rate_healthy"] == 0.0
    assert [(f["family"], f["picked_params"], f["recall"], f["trigger_rate_healthy"]) for f in held] == [
        ("x", '{"k": 1}', 1.0, pytest.approx(1 / 3)),
        ("y", '{"k": 0}', 0.0, 0.0),
    ]
    assert (row["lofo_recall"], row["lofo_recall_family"]) == (0.0, "trainer=y")
    assert (row["lofo_trigger_rate_healthy"], row["lofo_trigger_rate_healthy_family"]) == (
        pytest.approx(1 / 3),
        "trainer=x",
    )
    # a group of related runs reaching into the held-out family is held out whole: with h1 a
    # restart of h2, holding y out holds h1 out too, so P1 looks free on x's runs
    groups = [[n] for n in runs if n not in ("h1", "h2")] + [["h1", "h2"]]
    _, grouped = tune_rule(points, runs, [], [[n] for n in runs], 0.0, groups=groups, fams=fams)
    assert [(f["family"], f["runs"], f["picked_params"], f["recall"]) for f in grouped] == [
        ("x", 6, '{"k": 1}', 1.0),
        ("y", 6, '{"k": 1}', 1.0),
    ]


def test_families_too_small_are_listed_but_never_the_worst_and_unique_values_are_no_family():
    from detectors.families import attributes, families, family_rows, worst

    def r(run, outcome, opt, secs):
        return RunInfo(
            run,
            outcome,
            100 if outcome == "failed" else None,
            0,
            np.arange(200),
            "k",
            {"opt": opt, "seconds": secs},
        )

    rs = {n: r(n, "failed", "adam" if i < 3 else "sgd", str(i)) for i, n in enumerate(["a", "b", "c", "d"])}
    rs["a"].attrs["spike_step"] = "150"  # a detail of one run
    assert attributes(rs) == ["opt"]  # `seconds` differs on every run, `spike_step` is on one: no family
    outs = outcomes({"a": [100], "b": [100], "c": [100]}, list(rs), rs, Settings(horizon=20, lead=30))
    rows = family_rows("t", "{}", outs, families(rs, ["opt"]))
    assert [(f["family"], f["recall"]) for f in rows] == [("adam", 1.0), ("sgd", 0.0)]
    assert worst(rows)["lofo_recall"] == 1.0  # sgd's one failed run is too few to be the worst


def test_pick_prefers_the_default_on_a_tie_and_the_quietest_point_when_nothing_fits():
    rs = {
        "f": RunInfo("f", "failed", 100, 0, np.arange(200), "k"),
        "h": RunInfo("h", "healthy", None, 0, np.arange(200)),
    }
    st = Settings(horizon=20, lead=30)
    same = [outcomes({"f": [100]}, list(rs), rs, st) for _ in range(3)]
    assert pick(_Counts(same, ["f", "h"]), np.ones(2, bool), 0.0, default=2) == 2
    noisy = [
        outcomes({"f": [100], "h": list(range(0, 200, 10 * (i + 1)))}, list(rs), rs, st) for i in range(3)
    ]
    assert pick(_Counts(noisy, ["f", "h"]), np.ones(2, bool), 0.0) == 2


def test_backtest_tune_scores_builtin_grids_by_cross_validation(sample_store):
    from detectors.builtins.loss import SigmaSpike
    from detectors.builtins.nonfinite import NonFiniteGradNorm

    rules = [SigmaSpike().rule(), NonFiniteGradNorm().rule()]
    res = backtest(
        sample_store, rules, None, Settings(bootstrap=0), predictors=False, tune=True, holdout_glob="*spike*"
    )
    by_rule = {t["rule"]: t for t in res.tuning}
    assert set(by_rule) == {"loss_spike", "non_finite_grad_norm"}
    spike = by_rule["loss_spike"]
    assert spike["points"] == len(SigmaSpike.grid["k"]) * len(SigmaSpike.grid["window"])
    assert spike["holdout_runs"] == 2 and spike["holdout_recall"] is not None
    # the resumed and recovered runs stay with the runs they continue: fewer folds than runs
    assert spike["folds"] < res.rules[0]["runs_failed"] + res.rules[0]["runs_healthy"] - 2
    assert 0.0 <= spike["pick_agreement"] <= 1.0
    # each trainer held out in turn: the MoE runs' failures are the hardest for loss_spike
    held = {f["family"]: f for f in res.tuning_families if f["rule"] == "loss_spike"}
    assert set(held) == {
        "deepspeed",
        "loop",
        "moe",
    }  # at the pick (window 100) the HF, Keras, TRL runs are too short
    assert (held["moe"]["runs"], held["moe"]["recall"]) == (6, pytest.approx(1 / 3))
    assert (spike["lofo_recall"], spike["lofo_recall_family"]) == (pytest.approx(1 / 3), "trainer=moe")


# --- predictors: curve fits, plateau forecasts, evaluation schedules ------------------------------
def test_fit_curve_recovers_exact_families_and_forecasts_their_plateau():
    t = np.arange(1, 201, dtype=float)
    exp = 1.0 + 2.0 * np.exp(-t / 40)
    curve = fit_curve(t, exp, 400.0)
    assert np.allclose(curve(t), exp, rtol=2e-3)
    # the definition on the true curve: the first s with (f(s) - f(s + W)) / f(s) < EPS
    s = np.arange(1, 1000)
    f = 1.0 + 2.0 * np.exp(-s / 40)
    g = 1.0 + 2.0 * np.exp(-(s + W) / 40)
    truth = int(s[np.argmax((f - g) / f < EPS)])
    assert abs(forecast_plateau(curve, 1.0, 1.0) - truth) <= 3
    power = 0.5 + 3.0 * t**-0.7
    assert np.allclose(fit_curve(t, power, 200.0)(t), power, rtol=5e-3)
    assert fit_curve(t[:3], power[:3], 10.0) is None


def test_plateau_labels_come_from_the_eval_curve_where_one_is_logged():
    """A train loss still falling while the eval loss has flattened: the label is the eval
    curve's onset; a run without eval points is labelled from its train loss."""
    steps = np.arange(0, 1000)
    train = 1.0 + 2.0 * np.exp(-steps / 100)  # improves > 0.5 % per 100 steps until ~step 550
    ev_steps = np.arange(0, 1000, 25)
    evals = 1.5 + 2.0 * np.exp(-ev_steps / 40)  # flat by ~step 200
    onsets, from_eval = plateau_labels({"a": (steps, train), "b": (steps, train)}, {"a": (ev_steps, evals)})
    assert from_eval == {"a"}
    assert onsets["a"] == plateau_onset(ev_steps, evals, EVAL_EMA_WEIGHT) and onsets["a"] <= 300
    assert onsets["b"] == plateau_onset(steps, train) and 550 <= onsets["b"] <= 650
    few = plateau_labels(
        {"c": (steps, train)}, {"c": (ev_steps[: MIN_EVAL_POINTS - 1], evals[: MIN_EVAL_POINTS - 1])}
    )
    assert few == ({"c": onsets["b"]}, set())  # too few eval points: the train loss decides


def test_a_predictor_that_does_not_beat_the_naive_one_says_so():
    row = {
        "predictor": "fit",
        "precision": 0.4,
        **{f"final_loss_error_at_{f}": e for f, e in zip((10, 25, 50), (1.4, 0.6, 1.1), strict=True)},
        **{f"baseline_error_at_{f}": e for f, e in zip((10, 25, 50), (0.9, 0.7, 4.0), strict=True)},
        **{f"ema_error_at_{f}": e for f, e in zip((10, 25, 50), (1.2, 0.5, 3.3), strict=True)},
    }
    assert verdict(row, 0.45) == (
        "plateau calls no more precise than calling at every checkpoint (40.0% vs 45.0%); "
        "final-loss forecast no better than the naive last value or EMA at 10 %, 25 %"
    )
    assert verdict({"predictor": "slope", "precision": 0.9}, 0.45) == (
        "plateau calls beat calling at every checkpoint (90.0% vs 45.0%)"
    )
    assert always_calls({"r": (np.arange(100), np.zeros(100))})["r"][:3] == [9, 14, 19]


def test_dynamic_schedule_counts_evals_saved_and_knees_missed():
    # steps 0..199, every 20 steps = 10 evals; stretched 4x inside [40, 199]
    row = schedule_scores("p", {"r": [(40, 199)]}, {"r": (0, 199)}, {"r": [30, 130]})
    assert (row["fixed_evals"], row["dynamic_evals"]) == (10, 4)  # 0, 20, 40, 120
    assert row["evals_saved"] == pytest.approx(0.6)
    assert (row["knees"], row["knees_missed"]) == (
        2,
        1,
    )  # 30 is seen at 40; after 120 the next eval is past the run
    quiet = schedule_scores("p", {}, {"r": (0, 199)}, {"r": [30, 130]})
    assert (quiet["dynamic_evals"], quiet["knees_missed"]) == (10, 0)


# --- golden summary of the built-ins -----------------------------------------------------------
GOLDEN_BUILTINS = Path(__file__).parent / "golden" / "backtest_builtins.json"


@pytest.fixture(scope="module")
def builtins_backtest(sample_store):
    """The built-ins and the guides' rules at their own parameters on sample_runs, with the scorecard."""
    return backtest(sample_store, None, None, Settings(bootstrap=200), predictors=False, scorecard=True)


def test_golden_summary_of_the_builtins(builtins_backtest):
    """Every built-in at its own parameters on sample_runs: the summary rows, the kind matrix as
    detected/evaluable cells, the ensemble; reviewed in the diff when a detector changes."""
    res = builtins_backtest
    keep = (
        "rule",
        "runs_evaluable",
        "trigger_rate_failed",
        "trigger_rate_healthy",
        "separation",
        "recall",
        "false_alarms_per_1k_healthy",
        "first_trigger_mean",
        "never_fired",
        "lead_time_median",
        "kinds_caught",
    )
    defaults = {(r["rule"], r["params"]) for r in res.rules if r["default"]}
    matrix: dict[str, dict[str, str]] = {}
    for k in res.kinds:
        if ((k["rule"], k["params"]) in defaults or k["rule"] == "ensemble") and k["evaluable"]:
            n = k["triggered"] if k["kind"] == "healthy" else k["detected"]
            matrix.setdefault(k["rule"], {})[k["kind"]] = f"{n}/{k['evaluable']}"
    ens = res.ensemble
    summary = {
        "summary": [{k: _round(r[k]) for k in keep} for r in res.summary],
        "kinds": matrix,
        "ensemble": {
            k: _round(ens[k])
            for k in (
                "recall",
                "trigger_rate_failed",
                "trigger_rate_healthy",
                "false_alarms_per_1k_healthy",
                "members",
            )
        },
    }
    if os.environ.get("WORKBENCH_UPDATE_GOLDEN"):
        GOLDEN_BUILTINS.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    assert summary == json.loads(GOLDEN_BUILTINS.read_text())
    # no built-in of the ensemble fires on a healthy run (the guides' and the published alarms,
    # ZClip's z 2.5 among them, are scored as written)
    builtin = [r for r in res.summary if r["rule"] in ens["members"]]
    assert all(r["trigger_rate_healthy"] in (0.0, None) for r in builtin)
    assert ens["recall"] >= 0.9 and ens["trigger_rate_healthy"] == 0.0


def test_cli_summary_and_tune(sample_store):
    def backtest_cli(*args):
        p = cli("backtest", "--bootstrap", "20", *args, store=sample_store, columns=250)
        assert p.exit_code == 0, p.stderr
        return p.stdout

    text = backtest_cli("--summary")
    for needle in (
        "first trigger",
        "trig fail",
        "catches",
        "per failure kind",
        "Ensemble",
        "plateau within 200",
        "knees missed",
        "recovered manual",
        "(n=1 < 5)",  # first trigger over fewer failed runs than the guides quote
        "Leave one family out over trainer",
    ):
        assert needle in text
    # every (rule, labelled run) pair a rule could not run on is counted (more rules, more pairs)
    assert re.search(r"Not evaluable: \d{3} \(rule, labelled run\) pairs", text)
    card = backtest_cli("--scorecard", "--format", "markdown").splitlines()
    assert card[0].startswith("| rule | origin | kind | failed (eval) | precision | recall |")
    nf = next(line for line in card if line.startswith("| non_finite_loss | workbench | all |"))
    assert "15% \\| 0% (trainer=moe)" in nf  # recall in-sample | worst family
    unknown = cli("backtest", "--family", "optimiser", store=sample_store)
    assert unknown.exit_code != 0 and "no labelled run has the attribute optimiser" in unknown.stderr
    assert "attributes in the labels: trainer" in unknown.stderr
    rows = backtest_cli("--summary", "--format", "csv").splitlines()
    assert rows[0].split(",")[:4] == ["rule", "params", "origin", "runs_evaluable"] and len(rows) > 20
    tuned = backtest_cli(
        "--rules", str(ROOT / "detectors/guides.toml"), "--tune", "--holdout", "*spike*", "--budget", "0.5"
    )
    assert "cross-val recall / FA" in tuned and "holdout (2 runs) picked" in tuned
    assert "LOFO recall (worst family)" in tuned and "(trainer=" in tuned
    bad = cli("backtest", "--folds", "3", store=sample_store)
    assert bad.exit_code != 0 and "--tune" in bad.stderr


@settings(deadline=None, max_examples=80)
@given(hst.integers(1, 30), hst.integers(1, 30), hst.data())
def test_fisher_exact_upper_tail_matches_scipy(n_f, n_h, data):
    from scipy.stats import fisher_exact

    a, c = data.draw(hst.integers(0, n_f)), data.draw(hst.integers(0, n_h))
    p = fisher_exact([[a, n_f - a], [c, n_h - c]], alternative="greater")[1]
    assert fisher_greater(a, n_f, c, n_h) == pytest.approx(p, rel=1e-9, abs=1e-12)


# --- no run silently out of a score; leave one family out ----------------------------------------
def test_every_labelled_run_a_rule_could_not_evaluate_is_listed_with_why(builtins_backtest):
    res = builtins_backtest
    why = {(r["rule"], r["run_id"]): r["reason"] for r in res.not_evaluable}
    # the Keras run logs no gradient norm; it logged 12 epochs, fewer than a 50-step window
    assert why["non_finite_grad_norm", "keras_csvlogger_appended"] == "no such metric: grad_norm not logged"
    assert (
        why["loss_spike", "keras_csvlogger_appended"] == "too few steps: 12 logged, the rule needs 51"
    )  # window 50, two points
    # the overflow storm starts at step 70: 79 steps up to onset + horizon, not OLMo's 128
    assert why["olmo_spike", "fp16_overflow_storm"] == (
        "too few steps: 79 logged before the failure, the rule needs 128"
    )
    assert why["P3_eval_stalled", "deepspeed_default_log_level"] == "no eval: eval_loss not logged"
    rows = {r["rule"]: r for r in res.rules if r["default"]}
    for rule_id, row in rows.items():  # every labelled run is either scored or listed
        listed = sum(1 for r in res.not_evaluable if r["rule"] == rule_id)
        assert row["runs_evaluable"] + listed == row["runs_failed"] + row["runs_healthy"], rule_id
    olmo = rows["olmo_spike"]
    assert olmo["not_evaluable_failed"] == 2 and olmo["evaluable_failed"] == olmo["runs_failed"] - 2
    assert olmo["recall_all"] == pytest.approx(
        olmo["recall"] * olmo["evaluable_failed"] / olmo["runs_failed"]
    )


def test_each_score_has_its_worst_family_beside_it(builtins_backtest):
    """sample_runs' labels carry the trainer: the MoE runs' failures (a collapsed router, a
    dominating balance loss, a memory leak) never turn the loss NaN, so trainer=moe is
    non_finite_loss's worst family (recall 0 on 3 failed runs) while in-sample recall is not 0;
    the HF run whose NaN the Trainer filtered out is missed too, but one run is too few to be
    the worst family."""
    res = builtins_backtest
    assert res.attributes == ["trainer"]
    nf = next(r for r in res.rules if r["rule"] == "non_finite_loss")
    assert nf["recall"] > 0 and (nf["lofo_recall"], nf["lofo_recall_family"]) == (0.0, "trainer=moe")
    fam = {(r["rule"], r["family"]): r for r in res.families}
    assert (fam["non_finite_loss", "moe"]["runs"], fam["non_finite_loss", "moe"]["evaluable_failed"]) == (
        6,
        3,
    )
    assert (fam["non_finite_loss", "hf"]["evaluable_failed"], fam["non_finite_loss", "hf"]["recall"]) == (
        1,
        0.0,
    )
    assert fam["non_finite_loss", "deepspeed"]["recall"] == 1.0
    ens = res.ensemble
    assert ens["lofo_recall"] == 1.0 and ens["lofo_trigger_rate_healthy"] == 0.0
    assert {r["family"] for r in res.families if r["rule"] == "ensemble"} == {
        "deepspeed",
        "hf",
        "keras",
        "loop",
        "moe",
        "trl",
    }


def test_history_a_rule_needs_and_runs_too_short_for_it():
    from detectors.coverage import history_needed, too_short

    assert history_needed(Rule("a", "loss > mean(loss, 100) + 3 * std(loss, 50)", for_steps=5)) == 104
    assert history_needed(Rule("b", "delta(loss, 3) > 1", warmup=10)) == 4 + 10
    assert history_needed(Rule("c", "loss > 1")) == 1
    rs = {
        "short": RunInfo("short", "healthy", None, 0, np.arange(60)),
        "late": RunInfo("late", "failed", 150, 0, np.arange(400)),  # 151 steps up to 150 + 0
        "early": RunInfo("early", "failed", 40, 0, np.arange(400)),  # its failure comes at step 40
    }
    rule = Rule("w", "loss > mean(loss, 100)")
    st = Settings(horizon=0)
    assert too_short(rule, list(rs), rs, st) == {
        "short": "too few steps: 60 logged, the rule needs 100",
        "early": "too few steps: 41 logged before the failure, the rule needs 100",
    }
    assert too_short(rule, list(rs), rs, st, fired={"early": [30]}) == {
        "short": "too few steps: 60 logged, the rule needs 100"
    }  # it fired there, so it had enough
