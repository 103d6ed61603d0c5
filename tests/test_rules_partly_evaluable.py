"""A rule that cannot be evaluated costs only itself: the other rules of its file are replayed,
and it is reported with why; a rule that reads no series is refused by name; fractional steps
in a log are problem rows, not points moved onto another step."""

from __future__ import annotations

import json

import pytest
from conftest import cli, ingest_paths

from detectors.replay import replay
from detectors.rules import RuleFileError, rules_from_text
from workbench.store import Store

GOOD_AND_MISSING = """
[[rule]]
id = "good"
when = "loss > 0.5"

[[rule]]
id = "missing"
when = "no_such_metric > 1"
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("rules")
    for run in ("a", "b"):
        (root / "runs" / run).mkdir(parents=True)
        with open(root / "runs" / run / "log.jsonl", "w") as f:
            for i in range(20):
                f.write(json.dumps({"step": i, "loss": 1.0 if i < 5 else 0.1}) + "\n")
    s = Store(root / "store")
    ingest_paths(s, root / "runs")
    return s


def test_one_rule_on_a_missing_metric_leaves_the_others_replayed(store, tmp_path):
    result = replay(store, rules_from_text(GOOD_AND_MISSING, "rules.toml"), None)
    assert result.alerts.select("run_id", "rule", "step_start").rows() == [("a", "good", 0), ("b", "good", 0)]
    assert (
        list(result.skipped) == ["missing"]
        and "no_such_metric found in no selected run" in result.skipped["missing"]
    )
    assert store.query("SELECT run_id, rule FROM alerts ORDER BY run_id").rows() == [
        ("a", "good"),
        ("b", "good"),
    ]
    f = tmp_path / "rules.toml"
    f.write_text(GOOD_AND_MISSING)
    r = cli("replay", "--rules", f, store=store)
    said = " ".join(r.stderr.split())
    assert r.exit_code == 0, r.output
    assert "not evaluable here: missing: rule missing: no_such_metric found in no selected run" in said
    assert "2 alerts from 1 rules over 2 runs" in said


def test_a_file_of_rules_none_evaluable_is_an_error(store, tmp_path):
    f = tmp_path / "rules.toml"
    f.write_text(GOOD_AND_MISSING.replace("loss > 0.5", "other_missing > 0.5"))
    r = cli("replay", "--rules", f, store=store)
    assert r.exit_code == 1 and "error: rule good: other_missing found in no selected run" in r.stderr


@pytest.mark.parametrize(
    "when, params, said",
    [
        ("1 > 0", "", "rule #1 (r): 'when' reads no series (it compares numbers only)"),
        ("2 * 3 < 1 and not 4 > 5", "", "'when' reads no series (it compares numbers only)"),
        (
            "loss > 0",
            "[rule.params]\nloss = 3\n",
            "'when' reads no series (its names ['loss'] are all parameters",
        ),
    ],
)
def test_a_rule_that_reads_no_series_is_refused_by_name(store, tmp_path, when, params, said):
    text = f'[[rule]]\nid = "r"\nwhen = "{when}"\n{params}'
    with pytest.raises(RuleFileError, match="^rules.toml: ") as e:
        rules_from_text(text, "rules.toml")
    assert said in str(e.value)
    f = tmp_path / "rules.toml"
    f.write_text(text)
    for command in ("replay", "backtest", "rules"):
        r = cli(command, "--rules", f, store=None if command == "rules" else store)
        assert r.exit_code == 1 and said in " ".join(r.stderr.split()) and "Traceback" not in r.output


def test_fractional_steps_are_problem_rows_not_points_on_another_step(tmp_path):
    steps = [0, 1, 1.5, 2, 2.7, 3, "4.5", 5.0, 6]
    (tmp_path / "runs/f").mkdir(parents=True)
    with open(tmp_path / "runs/f/log.jsonl", "w") as f:
        for i, s in enumerate(steps):
            f.write(json.dumps({"step": s, "loss": float(i)}) + "\n")
    store = Store(tmp_path / "store")
    report = ingest_paths(store, tmp_path / "runs")
    fractional = [i + 1 for i, s in enumerate(steps) if float(s) != int(float(s))]
    assert fractional == [3, 5, 7]
    rows = store.query('SELECT "offset", kind, message FROM problems ORDER BY "offset"').rows()
    assert [(o, k) for o, k, _ in rows] == [(line, "bad_record") for line in fractional]
    assert "step 1.5 is not a whole number" in rows[0][2] and "step '4.5' is not a whole number" in rows[2][2]
    assert len(report.problems) == 3
    # every record with a whole step is a point at that step, with its own value
    assert store.query("SELECT step, value FROM scalars ORDER BY step").rows() == [
        (0, 0.0),
        (1, 1.0),
        (2, 3.0),
        (3, 5.0),
        (5, 7.0),
        (6, 8.0),
    ]
