"""Hostile rule files: every case is refused with a message that says where and why, or loads
and replays correctly. Rule text is typed by anyone (the app's backtest page parses it too), so
no case may hang, exhaust the stack or crash `workbench rules` / `replay` later.

A guard turns a hang into a failure (a generous bound; what each case costs is measured outside
the unit tests)."""

from __future__ import annotations

import json
import signal

import pytest
from click.testing import CliRunner
from conftest import ingest_paths

from detectors.replay import replay
from detectors.rules import RuleFileError, rules_from_text
from workbench.cli import main
from workbench.errors import WorkbenchError
from workbench.store import Store


def rule(when: str, extra: str = "") -> str:
    return f'[[rule]]\nid = "r"\nwhen = {json.dumps(when)}\n{extra}'


def sweep(n_keys: int, n_values: int) -> str:
    keys = [f"k{i}" for i in range(n_keys)]
    values = ", ".join(str(v) for v in range(n_values))
    return rule(
        " and ".join(f"loss > {k}" for k in keys),
        "[rule.params]\n"
        + "".join(f"{k} = 5\n" for k in keys)
        + "[rule.sweep]\n"
        + "".join(f"{k} = [{values}]\n" for k in keys),
    )


REFUSED = {
    # nesting and size: bounded before anything recurses or scans twice
    "10k nested parentheses": (rule("(" * 10_000 + "loss > 1" + ")" * 10_000), "the limit is 4,096"),
    "150 nested parentheses": (rule("(" * 150 + "loss > 1" + ")" * 150), "nested more than 100 levels deep"),
    "5000 nots": (rule("not " * 5000 + "loss > 1"), "the limit is 4,096"),
    "150 nots": (rule("not " * 150 + "loss > 1"), "nested more than 100 levels deep"),
    "1 MB expression": (rule("loss > 1 and " * 80_000 + "loss > 1"), "a rule of 1,040,008 characters"),
    "300 chained ands": (rule(" and ".join(["loss > 1"] * 300)), "more than 100 operators deep"),
    "100 KB tag in backticks": (rule("`" + "a" * 100_000 + "` > 1"), "the limit is 4,096"),
    # sweeps: bounded per rule and per file
    "4-parameter sweep of 100 values": (sweep(4, 100), "100,000,000 combinations; the limit is 1,000"),
    "one sweep of 2000 values": (sweep(1, 2000), "2,000 combinations"),
    "5000 rules of 3 sweep points": (
        "".join(
            rule("loss > k", "[rule.sweep]\nk = [1, 2, 3]\n").replace('"r"', f'"r{i}"') for i in range(5000)
        ),
        "15,000 sweep points in all; the limit is 10,000",
    ),
    "string sweep values": (
        rule("loss > k", '[rule.sweep]\nk = ["a", "b"]\n'),
        "sweep.k must list finite numbers",
    ),
    "sweep of for_steps 0": (rule("loss > 1", "[rule.sweep]\nfor_steps = [1, 0]\n"), "whole numbers >= 1"),
    "a swept name without a value": (
        rule("loss > k", "[rule.sweep]\nk = [1, 2]\n"),
        "needs a value in [rule.params]",
    ),
    "a 2 MB rule file": (
        rule("loss > 1", "# " + "x" * (2 << 20) + "\n"),
        "a rule file holds at most 1,048,576",
    ),
    # windows, lags and weights: checked where they are written, and for every parameter value
    "mean(x, 1e30)": (rule("loss > mean(loss, 1e30)"), "at column 8"),
    "mean(x, 0)": (rule("loss > mean(loss, 0)"), "mean(): the window must be a whole number from 1"),
    "slope(x, 0)": (rule("slope(loss, 0) < 0"), "slope(): the window must be a whole number from 2"),
    "slope(x, 1)": (rule("slope(loss, 1) < 0"), "from 2 to 1,000,000, got 1"),
    "std(x, 2.5)": (rule("loss > std(loss, 2.5)"), "got 2.5"),
    "delta(x, -1)": (
        rule("delta(loss, -1) > 0"),
        "delta(): the lag must be a whole number from 1 to 1,000,000, got -1",
    ),
    "ema(x, loss)": (rule("loss > ema(loss, loss * 2)"), "must be a number or a parameter"),
    "ema(x, 1.5)": (rule("loss > ema(loss, 1.5)"), "ema(): the smoothing weight must be a number in [0, 1)"),
    "mean(x, w) with w = 1e30": (rule("loss > mean(loss, w)", "[rule.params]\nw = 1e30\n"), "got 1e+30"),
    "mean(x, w) swept to 0": (
        rule("loss > mean(loss, w)", "[rule.params]\nw = 10\n[rule.sweep]\nw = [10, 0]\n"),
        "got 0",
    ),
    "mean(x, w) with w undefined": (
        rule("loss > mean(loss, w)"),
        "'w' is no number (define it in [rule.params])",
    ),
    "mean(loss * 2, 10)": (rule("loss > mean(loss * 2, 10)"), "the first argument must be a metric or tag"),
    # keys of the wrong type
    "n = nan": (rule("loss > n", "[rule.params]\nn = nan\n"), "params.n must be a finite number, got nan"),
    "n = inf": (rule("loss > n", "[rule.params]\nn = inf\n"), "params.n must be a finite number, got inf"),
    "n = 'abc'": (rule("loss > n", '[rule.params]\nn = "abc"\n'), "params.n must be a finite number"),
    "params nested tables": (
        rule("loss > n", "[rule.params.n]\nx = 1\n"),
        "params.n must be a finite number",
    ),
    "on = 5": (rule("loss > 1", "on = 5\n"), "'on' must be a string, got 5"),
    "on = ''": (rule("loss > 1", 'on = ""\n'), "'on' must name a metric or tag"),
    "description = 5": (rule("loss > 1", "description = 5\n"), "'description' must be a string"),
    "severity = [1]": (rule("loss > 1", "severity = [1]\n"), "'severity' must be a string"),
    "for_steps = true": (
        rule("loss > 1", "for_steps = true\n"),
        "'for_steps' must be a whole number >= 1, got True",
    ),
    "for_steps = 2.5": (rule("loss > 1", "for_steps = 2.5\n"), "'for_steps' must be a whole number"),
    "cooldown = -1": (rule("loss > 1", "cooldown = -1\n"), "'cooldown' must be a whole number >= 0"),
    "when = 5": ('[[rule]]\nid = "r"\nwhen = 5\n', "'when' is required (a string)"),
    "rule = [1, 2]": ("rule = [1, 2]\n", "[[rule]] must be tables"),
    "rule = 5": ("rule = 5\n", "no [[rule]] tables found"),
    "a NUL in the file": ('[[rule]]\nid = "r"\nwhen = "loss > 1\x00"\n', "not valid TOML"),
    "a unicode operator": (rule("loss ≥ 1"), "unexpected character '≥'"),
    "python in the rule": (rule("__import__('os').system('true') > 0"), "unexpected character"),
}


@pytest.fixture(autouse=True)
def no_hang():
    """A case that hangs fails here instead of blocking the suite."""

    def hung(*_):
        raise TimeoutError("the case hung")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_hostile_rule_file_is_refused_with_a_message(case):
    text, fragment = REFUSED[case]
    with pytest.raises(RuleFileError) as e:
        rules_from_text(text, "rules.toml")
    assert fragment in str(e.value)
    assert str(e.value).startswith("rules.toml")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    (root / "runs/a").mkdir(parents=True)
    with open(root / "runs/a/m.jsonl", "w") as f:
        for s in range(300):
            f.write(
                json.dumps({"step": s, "loss": 10.0 if s == 200 else 1.0 + s / 1000, "grad_norm": 0.5}) + "\n"
            )
    s = Store(root / "store")
    ingest_paths(s, root / "runs")
    return s


RUNS = {
    "a number beyond float": (rule("loss < 1e999999"), 1),
    "NaN-safe negation": (rule("not (loss < 1e30)"), 0),
    "for_steps = 10**18": (rule("loss > 5", "for_steps = 1000000000000000000\n"), 0),
    "an id that is Rich markup": (rule("loss > 5").replace('"r"', '"[/bold]"'), 1),
    "100 levels of parentheses": (rule("(" * 99 + "loss > 5" + ")" * 99), 1),
    "a sweep of 1000 points": (sweep(3, 10), 1),
    "a window of a million": (rule("loss > mean(loss, 1000000)"), 0),
}


@pytest.mark.parametrize("case", sorted(RUNS))
def test_an_odd_but_valid_rule_runs_correctly(store, case):
    text, alerts = RUNS[case]
    rules = rules_from_text(text, "rules.toml")
    result = replay(store, rules, None)
    assert result.alerts.height == alerts
    r = CliRunner().invoke(main, ["rules"], env={"COLUMNS": "10000"})  # built-ins list as before
    assert r.exit_code == 0


def test_a_rule_on_an_absent_metric_fails_with_a_message(store):
    rules = rules_from_text(rule("`" + "a" * 4000 + "` > 1"), "rules.toml")
    with pytest.raises(WorkbenchError, match="found in no selected run"):
        replay(store, rules, None)


def test_workbench_rules_lists_a_rule_file_with_markup(tmp_path):
    f = tmp_path / "r.toml"
    f.write_text(rule("loss > 5", 'description = "[/bold] not markup"\n').replace('"r"', '"[red]x"'))
    r = CliRunner().invoke(main, ["rules", "--rules", str(f), "--format", "table"], env={"COLUMNS": "10000"})
    assert r.exit_code == 0 and "[red]x" in r.stdout and "[/bold] not markup" in r.stdout
