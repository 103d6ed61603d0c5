"""The training job's own alert lines (the guides' in-job detectors) become `in_job_alert`
events at ingest, from a console and from TensorBoard `ALERT/...` text summaries, and the
backtest scores them as the in-job detector beside the replayed rules (tests/data/in_job_alerts:
two real runs written by its generate.py; counts from grep and tbparse in its PROVENANCE.md)."""

from __future__ import annotations

import json

import pytest
from conftest import DATA, ingest_paths

from detectors.backtest import Settings, backtest
from detectors.rules import Rule
from workbench.store import Store


@pytest.fixture(scope="module")
def alerts_store(tmp_path_factory) -> Store:
    store = Store(tmp_path_factory.mktemp("in_job") / "store")
    ingest_paths(store, DATA / "in_job_alerts")
    return store


def test_alert_lines_and_alert_summaries_are_events(alerts_store):
    rows = alerts_store.query(
        "SELECT run_id, step, message, attrs FROM events WHERE kind = 'in_job_alert' ORDER BY ALL",
    ).rows()
    by_source: dict[tuple[str, str], list[int]] = {}  # torch names a text summary tag/text_summary
    for run, step, _message, attrs in rows:
        a = json.loads(attrs)
        by_source.setdefault((run, a.get("tag") or a["alert"]), []).append(step)
    grad = by_source.pop(("lr_spike", "grad_anomaly"))
    assert len(grad) == 53 and (grad[0], grad[-1]) == (151, 234)
    assert by_source == {
        ("lr_spike", "ALERT/loss_spike/text_summary"): [151, 152, 153, 154, 155],
        ("lr_spike", "loss_anomaly"): [151, 152, 153, 154, 155],
        ("noisy_healthy", "ALERT/loss_spike/text_summary"): [232, 250],
        ("noisy_healthy", "loss_anomaly"): [232, 250],
    }
    text = dict(
        alerts_store.query(
            "SELECT step, message FROM events WHERE kind = 'in_job_alert' AND run_id = 'noisy_healthy'",
        ).rows()
    )
    assert text[232] in (
        "[232] LOSS ANOMALY: loss 13.6851 > mean 1.9253 + 3 std 2.0697",
        "step 232: loss 13.6851 > mean 1.9253 + 3 std 2.0697",
    )


def test_the_in_job_detector_is_scored_beside_the_replayed_rules(alerts_store):
    res = backtest(
        alerts_store, [Rule("big_loss", "loss > 100")], None, Settings(bootstrap=0), predictors=False
    )
    rows = {r["rule"]: r for r in res.rules}
    job = rows["in_job_alerts"]
    # the spike's first alert at its onset (151); the noisy healthy run's two false alarms
    assert (job["origin"], job["runs_evaluable"], job["recall"], job["lead_time_median"]) == (
        "guides",
        2,
        1.0,
        0.0,
    )
    assert (job["trigger_rate_healthy"], job["precision"]) == (1.0, 0.5)
    assert job["false_alarms_per_1k_healthy"] == pytest.approx(1000 * 2 / 300)
    assert rows["big_loss"]["trigger_rate_healthy"] == 0.0 and rows["big_loss"]["first_trigger_mean"] == 152.0
    assert res.ensemble["members"] == ["big_loss"]  # the in-job detector is scored, not an ensemble member
    assert [s["rule"] for s in res.summary] == ["big_loss", "in_job_alerts"]
