"""Which labelled runs a rule could not evaluate, and why: no run is silently out of a score.

A rule cannot be evaluated on a run when:
- `no such metric`: a metric or tag it reads is not logged there (`no eval` when that is an
  evaluation series, e.g. a run that never evaluates and a rule on `eval_loss`); the reason
  quotes the replay's own message for that run alone;
- `too few steps`: the run logged fewer steps than the rule needs before it can fire: its
  longest window, lag or baseline (`history_needed`: from its condition; for a built-in in
  code the `min_points` it declares, else its parameters named in HISTORY_PARAMS) plus its
  `for_steps` and `warmup`. On a failed run only the steps up to onset + horizon count (later
  ones cannot detect it). Steps are those of the run's most-logged series, so a rule over a
  sparser series is given the benefit of the doubt, and so is a rule that fired on the run.
Such runs leave the rule's own score (its rates are over the runs it could see) and are listed
with their reason; scores over every labelled run (`recall_all`, the ensemble) count a failed
run nobody could see as missed.
"""

from __future__ import annotations

import polars as pl

from detectors import language
from detectors.engine import evaluate
from detectors.replay import load
from detectors.rules import Rule
from detectors.scoring import RunInfo, Settings
from detectors.series import ReplayError, SeriesData
from workbench.store import Store

LOAD_RUNS = 50  # runs loaded at once while explaining
# parameters of built-ins computed in code that are a count of logged points they need first
HISTORY_PARAMS = ("window", "baseline", "train_window")
NOT_EVALUABLE_FIELDS = ["rule", "params", "run_id", "outcome", "kind", "reason"]


def history_needed(rule: Rule) -> int:
    """Logged steps a run needs before the rule can fire: its longest window, lag or count
    (from its condition, or for a built-in in code from parameters named in HISTORY_PARAMS
    or a `min_points` it declares), plus for_steps - 1 and its warm-up."""
    if rule.when is not None:
        need = max((_points(c) for c in _calls(rule.ast())), default=1)
    else:
        declared = getattr(rule.detector, "min_points", None)
        sizes = [v for k, v in rule.params.items() if k in HISTORY_PARAMS and isinstance(v, int | float)]
        need = int(declared) if declared else int(max(sizes, default=1))
    return max(1, need) + rule.for_steps - 1 + rule.warmup


def _calls(node) -> list[language.Call]:
    if isinstance(node, language.Call):
        return [node, *[c for a in node.args for c in _calls(a)]]
    if isinstance(node, language.Unary):
        return _calls(node.arg)
    if isinstance(node, language.Binary):
        return _calls(node.left) + _calls(node.right)
    return []


def _points(call: language.Call) -> int:
    """Points a window function needs: its window or count, a lag k needs k + 1."""
    spec = language.WINDOWS.get(call.fn)
    if spec is None or not spec[2] or not isinstance(call.args[1], language.Num):
        return 1
    n = int(call.args[1].value)
    return n + 1 if spec[3] == "lag" else n


def too_short(
    rule: Rule,
    evaluable: list[str],
    runs: dict[str, RunInfo],
    settings: Settings,
    fired: dict[str, list[int]] | None = None,
) -> dict[str, str]:
    """The labelled runs among `evaluable` with fewer logged steps than the rule needs (on a
    failed run, before onset + horizon), with the reason in words; a run the rule fired on
    (`fired`) had enough, whatever the estimate says."""
    need = history_needed(rule)
    out = {}
    for run in evaluable:
        info = runs.get(run)
        if info is None or (fired or {}).get(run):
            continue
        steps = info.steps
        if info.outcome == "failed" and info.onset is not None:
            steps = steps[steps <= info.onset + settings.horizon]
        if len(steps) < need:
            where = " before the failure" if info.outcome == "failed" and info.onset is not None else ""
            out[run] = f"too few steps: {len(steps)} logged{where}, the rule needs {need}"
    return out


def missing_reasons(
    store: Store, rules: list[Rule], missing: list[list[str]], runs: dict[str, RunInfo], con=None
) -> list[dict[str, str]]:
    """Per rule, why it could not be evaluated on each of its `missing` runs: the rule replayed
    on those runs alone says what they lack (all of them at once when it is evaluable on none,
    then each run alone). Runs are loaded LOAD_RUNS at a time, each once; `con`: a connection
    to the store to reuse."""
    wanted = sorted({r for m in missing for r in m if r in runs})
    out: list[dict[str, str]] = [{} for _ in rules]
    for i in range(0, len(wanted), LOAD_RUNS):
        data = load(store, wanted[i : i + LOAD_RUNS], con)
        subsets: dict[tuple[str, ...], SeriesData] = {}  # rules missing the same runs share them
        for k, rule in enumerate(rules):
            lacking = set(missing[k])
            mine = [r for r in data.runs if r in lacking]
            if not mine:
                continue
            if tuple(mine) not in subsets:
                subsets[tuple(mine)] = _only(data, mine)
            why = _why(rule, subsets[tuple(mine)])
            out[k].update(
                dict.fromkeys(mine, why)
                if why
                else {r: _why(rule, _only(data, [r])) or "no such metric" for r in mine}
            )
    return out


def _only(data: SeriesData, runs: list[str]) -> SeriesData:
    """Some runs of a loaded batch as their own SeriesData."""
    points = data.points.filter(pl.col("run_id").is_in(runs))  # type: ignore[union-attr]  # decoded on access
    return SeriesData(points, data.events.filter(pl.col("run_id").is_in(runs)), runs)


def _why(rule: Rule, some: SeriesData) -> str | None:
    """What the replay says these runs lack, or None when it names nothing all of them lack."""
    try:
        evaluate(rule, some)
    except ReplayError as e:
        text = str(e).split(";")[0].removeprefix(f"rule {rule.id}: ").removeprefix(f"{rule.id}: ")
        text = text.replace(" found in no selected run", " not logged").replace(
            " found in a selected run", " logged"
        )
        return ("no eval: " if "eval" in text else "no such metric: ") + text
    return None


def reason_rows(rule_id: str, params: str, missing: dict, runs: dict[str, RunInfo]) -> list[dict]:
    """The report's rows for one rule (or the ensemble): one per labelled run it could not
    evaluate (`missing`: run -> its `not evaluable` Outcome), with the reason."""
    return [
        {
            "rule": rule_id,
            "params": params,
            "run_id": run,
            "outcome": runs[run].outcome,
            "kind": runs[run].kind,
            "reason": o.reason,
        }
        for run, o in sorted(missing.items())
    ]
