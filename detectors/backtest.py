"""Backtest: how good is each rule, measured on labelled runs.

Per rule and per point of its sweep, over the labelled runs where it could be evaluated
(`unknown` runs are left out and counted):
- trigger_rate_failed: failed runs with an alarm after warm-up and no later than onset + horizon
  (a very early alarm still counts: vanishing gradients can start at step 0);
  trigger_rate_healthy: healthy runs with any alarm after warm-up; separation: their difference,
  with a one-sided Fisher exact p (separation_p); evaluable_failed/healthy: the runs behind them.
- recall: failed runs with an alarm inside [onset - lead, onset + horizon].
- precision: detected failed runs / (detected + healthy runs with an alarm + failed runs whose
  only alarms came before onset - lead).
- false_alarms_per_1k: alarms per 1000 logged steps (the steps of the run's most-logged series)
  on negative stretches (healthy runs, and failed runs before onset - lead);
  false_alarms_per_1k_healthy: on healthy runs only.
- lead time: onset - the first alarm in the recall window (positive = early): median, mean, std.
- first trigger: the first alarm step on failed runs: mean, std; never_fired counts the rest.
- 95 % intervals by bootstrap over runs (steps within a run are not independent) of recall,
  precision, both trigger rates and the separation.
- recovery outcomes: of the restarts (lineage) of runs in which the rule fired before the restart
  was triggered, how many continuations ended healthy.
- default: the point is the rule's own parameters (the one the kind matrix, the ensemble and
  the summary use).
Beyond the rules: per failure kind, the ensemble and the summary (detectors.kinds), the
cross-validated tuning (detectors.tuning, with `tune`), the predictors and evaluation
schedules (detectors.predictors). An alarm is an alert's step_fired. Undefined values are null,
never NaN. No point-adjusted F1.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from detectors.kinds import ensemble, kind_rows, summary_rows
from detectors.predictors import PREDICTOR_RULES, evaluate_predictors
from detectors.replay import RuleReplay, batches, default_rules, replay_batches, replay_on
from detectors.rules import Rule
from detectors.scoring import (  # noqa: F401 (the scoring API is used from here)
    RULE_FIELDS,
    Outcome,
    RunInfo,
    Settings,
    alarms_by_run,
    outcomes,
    score,
    score_outcomes,
)
from detectors.series import ReplayError
from detectors.tuning import folds_of, run_groups, tune_rule
from workbench.store import Store, reads

if TYPE_CHECKING:
    from workbench.executor import Executor


def load_labels(store: Store, run_ids: list[str]) -> tuple[dict[str, RunInfo], int]:
    """Labelled runs of the selection (failed/healthy; steps filled in during replay) and the
    count of the rest (unknown or unlabelled)."""
    labels = {r[0]: r for r in store.rows(reads.labels(["run_id", "outcome", "onset", "kind"]))}
    runs, unknown = {}, 0
    for run in run_ids:
        lab = labels.get(run)
        if lab is None or lab[1] not in ("failed", "healthy"):
            unknown += 1
            continue
        kind = (lab[3] or "unspecified") if lab[1] == "failed" else None
        runs[run] = RunInfo(run, lab[1], lab[2], 0, np.array([], dtype=np.int64), kind)
    return runs, unknown


def load_recoveries(store: Store) -> list[tuple[str, int | None, bool]]:
    """(parent run, step the restart was triggered or rolled back at, did the continuation end healthy)
    for every restart of one run by another (lineage `recovery` and `fork` edges)."""
    return store.rows(reads.recoveries())


@dataclass
class BacktestResult:
    rules: list[dict]
    predictors: list[dict]
    unknown_runs: int
    runs: int
    kinds: list[dict] = field(default_factory=list)  # rule x failure kind (detectors.kinds)
    ensemble: dict | None = None  # "any of these rules"
    summary: list[dict] = field(default_factory=list)  # per rule at its own parameters
    tuning: list[dict] = field(default_factory=list)  # with tune=True (detectors.tuning)
    schedule: list[dict] = field(default_factory=list)  # dynamic evaluation schedules (predictors)

    def to_dict(self) -> dict:
        return {
            "rules": self.rules,
            "predictors": self.predictors,
            "kinds": self.kinds,
            "ensemble": self.ensemble,
            "summary": self.summary,
            "tuning": self.tuning,
            "schedule": self.schedule,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    def rules_frame(self) -> pl.DataFrame:
        return pl.DataFrame(self.rules, infer_schema_length=None)

    def write(self, out_dir: Path) -> None:
        """backtest.json, rules.csv, rules.parquet, predictors.csv, kinds.csv, summary.csv (and
        tuning.csv after tuning) in `out_dir`."""
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "backtest.json").write_text(self.to_json() + "\n")
        self.rules_frame().write_csv(out_dir / "rules.csv")
        self.rules_frame().write_parquet(out_dir / "rules.parquet")
        for name in ("predictors", "kinds", "summary", "tuning", "schedule"):
            if getattr(self, name):
                table(getattr(self, name)).write_csv(out_dir / f"{name}.csv")


def table(rows: list[dict]) -> pl.DataFrame:
    """Report rows as a flat frame (list values joined by spaces), for CSV and Parquet."""
    frame = pl.DataFrame(rows, infer_schema_length=None)
    lists = [c for c, t in frame.schema.items() if isinstance(t, pl.List)]
    return frame.with_columns(pl.col(c).list.join(" ") for c in lists)


def backtest(
    store: Store,
    rules: list[Rule] | None,
    runs_glob: str | None,
    settings: Settings | None = None,
    predictors: bool = True,
    tune: bool = False,
    budget: float = 1.0,
    folds: int | None = None,
    holdout_glob: str | None = None,
    executor: Executor | None = None,
) -> BacktestResult:
    """Replay every rule (and sweep point) and score it against the labels: per rule, per
    failure kind, the ensemble of the rules at their own parameters, the summary; with `tune`,
    each rule's pick within `budget` false alarms per 1k steps, cross-validated (`folds` None:
    one fold per group of related runs) and scored on the `holdout_glob` runs kept out of it.
    `executor`: replay as tasks per rule chunk x run batch there (`replay_on`); the scoring,
    which needs every run of a rule at once, stays here."""
    settings = settings or Settings()
    explicit = rules is not None
    rules = rules if explicit else default_rules()
    if tune:  # built-ins carry a grid of their own
        rules = [replace(r, sweep=r.detector.grid) if r.detector and not r.sweep else r for r in rules]
    groups = batches(store, runs_glob)
    if not groups:
        raise ReplayError(f"no runs match {runs_glob!r}; list them with: workbench runs")
    run_ids = [r for g in groups for r in g]
    runs, unknown = load_labels(store, run_ids)
    if not runs:
        raise ReplayError(
            "no labelled runs in the selection: add a labels.toml beside the runs "
            "(see the README) or use: workbench label RUN --outcome failed --onset STEP"
        )
    points = [(p, p.params_json == rule.params_json, rule) for rule in rules for p in _points(rule)]
    extra = list(PREDICTOR_RULES.values()) if predictors else []  # replayed in the same pass
    done = replay_labelled(store, [p for p, _, _ in points] + extra, groups, runs, executor)
    recoveries = load_recoveries(store)
    results, kinds, scored = [], [], []
    for (p, default, parent), d in zip(points, done, strict=False):
        if d.error:
            if explicit:
                raise ReplayError(d.error)
            continue
        alarms = alarms_by_run(d.alerts, runs, settings)
        outs = outcomes(alarms, d.evaluable, runs, settings)
        row = score_outcomes(p, outs, runs, settings, alarms, recoveries, default)
        results.append(row)
        kinds += kind_rows(p.id, row["params"], outs, runs)
        scored.append((p, default, parent, alarms, d.evaluable, outs))
    members = [
        (p, a, ev) for p, default, parent, a, ev, _ in scored if default and _in_ensemble(parent, explicit)
    ]
    ens, ens_kinds = ensemble(members, runs, settings, recoveries) if members else (None, [])
    result = BacktestResult(
        results,
        [],
        unknown,
        len(run_ids),
        kinds=kinds + ens_kinds,
        ensemble=ens,
        summary=summary_rows(results, kinds),
    )
    if predictors:
        replayed = dict(zip(PREDICTOR_RULES, done[len(points) :], strict=True))
        result.predictors, result.schedule = evaluate_predictors(store, runs, replayed)
    if tune:
        result.tuning = _tune(store, scored, runs, settings, budget, folds, holdout_glob)
    return result


def replay_labelled(
    store: Store,
    rules: list[Rule],
    groups: list[list[str]],
    runs: dict[str, RunInfo],
    executor: Executor | None = None,
) -> list[RuleReplay]:
    """Replay the rules over the run batches, filling in each labelled run's logged steps and
    first step from the batch already in memory (what warm-up and false alarms count from)."""

    def note_steps(logged):
        for run, steps in logged.items():
            if run in runs:
                runs[run].steps = steps
                runs[run].first_step = int(steps[0]) if len(steps) else 0

    if executor is None:
        return replay_batches(store, rules, groups, on_batch=lambda data: note_steps(data.logged_steps()))
    done, logged = replay_on(executor, store, rules, groups, steps=True)
    note_steps(logged)
    return done


@dataclass
class Judgement:
    """What one rule (one sweep point) did on each labelled run of a selection."""

    runs: dict[str, RunInfo]  # every labelled run of the selection
    outcomes: dict[str, Outcome]  # those where the rule could be evaluated
    evaluable: list[str]  # every run where it could be evaluated, labelled or not
    alerts: pl.DataFrame
    error: str | None = None  # why it could be evaluated nowhere


def judge(store: Store, rule: Rule, runs_glob: str | None, settings: Settings) -> Judgement:
    """One rule's outcome per labelled run, judged as `backtest` judges it (the same replay,
    warm-up and `scoring.outcome`): what the app's per-run table shows."""
    groups = batches(store, runs_glob)
    runs, _ = load_labels(store, [r for g in groups for r in g])
    done = replay_labelled(store, [rule], groups, runs)[0]
    if done.error:
        return Judgement(runs, {}, [], done.alerts, done.error)
    outs = outcomes(alarms_by_run(done.alerts, runs, settings), done.evaluable, runs, settings)
    return Judgement(runs, outs, done.evaluable, done.alerts)


def _points(rule: Rule) -> list[Rule]:
    """A rule's sweep points, its own parameters always among them."""
    pts = rule.sweep_points()
    if rule.sweep and all(p.params_json != rule.params_json for p in pts):
        pts = [replace(rule, sweep={}), *pts]
    return pts


def _in_ensemble(rule: Rule, explicit: bool) -> bool:
    """Without a rule file the ensemble is the built-ins (the guides' set repeats them); with one,
    every rule of the file."""
    return explicit or rule.detector is not None


def _tune(store, scored, runs, settings, budget, folds, holdout_glob) -> list[dict]:
    held = [r for r in runs if holdout_glob and fnmatch.fnmatchcase(r, holdout_glob)]
    tuning_runs = sorted(r for r in runs if r not in held)
    edges = store.rows(reads.lineage(columns=["child_run", "parent_run"]))
    fold_list = folds_of(run_groups(tuning_runs, edges), folds, settings.seed)
    by_rule: dict[str, list] = {}
    for p, default, parent, _, _, outs in scored:
        by_rule.setdefault(parent.id, []).append((p, outs, default))
    return [
        tune_rule(pts, tuning_runs, sorted(held), fold_list, budget)
        for pts in by_rule.values()
        if len(pts) > 1
    ]


def frontier(results: list[dict], rule_id: str) -> list[dict]:
    """Sweep points of one rule on the recall / false-alarm Pareto frontier, fewest alarms first."""
    pts = [r for r in results if r["rule"] == rule_id and r["recall"] is not None]
    pts.sort(key=lambda r: (r["false_alarms_per_1k"] or 0.0, -(r["recall"] or 0.0)))
    best, out = -1.0, []
    for r in pts:
        if r["recall"] > best:
            out.append(r)
            best = r["recall"]
    return out


def best_under_budget(results: list[dict], rule_id: str, budget: float) -> dict | None:
    """The sweep point with the highest recall whose false alarms per 1k steps stay within budget."""
    ok = [
        r
        for r in results
        if r["rule"] == rule_id and r["recall"] is not None and (r["false_alarms_per_1k"] or 0.0) <= budget
    ]
    return max(ok, key=lambda r: (r["recall"], -(r["false_alarms_per_1k"] or 0.0)), default=None)
