"""Backtest metrics on hand-built alerts and labels with known answers; a golden summary of the
guides' rule set on sample_runs/ (regenerate: WORKBENCH_UPDATE_GOLDEN=1 pytest tests/test_backtest.py)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from conftest import ingest_paths

from detectors.backtest import RULE_FIELDS, RunInfo, Settings, backtest, best_under_budget, frontier, score
from detectors.engine import ALERT_SCHEMA
from detectors.rules import Rule
from workbench.store import Store

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
def sample_store(tmp_path_factory):
    s = Store(tmp_path_factory.mktemp("bt") / "store")
    ingest_paths(s, ROOT / "sample_runs")
    return s


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
    assert set(doc) == {"rules", "predictors"}
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
    assert {p["predictor"] for p in doc["predictors"]} >= {"slope_rule", "curve_fit"}
    assert all(set(pred) <= set(p) for p in doc["predictors"])
    assert (tmp_path / "out/rules.parquet").exists() and (tmp_path / "out/backtest.json").exists()
