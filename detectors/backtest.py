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
- recovery outcomes: of the recoveries of runs in which the rule fired before the recovery was
  triggered, how many continuations ended healthy, in all and split into automatic and manual
  ones (`load_recoveries`).
- default: the point is the rule's own parameters (the one the kind matrix, the ensemble and
  the summary use).
- not evaluable: the labelled runs the rule could not be evaluated on, and why
  (detectors.coverage): they are out of its rates, counted in not_evaluable_failed/healthy and
  listed in `not_evaluable`; recall_all counts such failed runs as missed, as the ensemble does.
- leave one family out (detectors.families): beside each score, its worst family's figure
  (lofo_<score>, lofo_<score>_family) over the attributes of the labels; each family's scores
  in `families`.
- the in-job detector: the training job's own alert lines (events of kind `in_job_alert`),
  scored like a rule (`in_job_alerts`) on every labelled run (a run without such lines counts
  as quiet), beside the replayed rules but not in the ensemble.
Beyond the rules: per failure kind, the ensemble, the summary and the scorecard
(detectors.kinds), the cross-validated and leave-one-family-out tuning (detectors.tuning, with
`tune`), the predictors and evaluation schedules (detectors.predictors). An alarm is an
alert's step_fired. Undefined values are null, never NaN. No point-adjusted F1.
"""

from __future__ import annotations

import fnmatch
import io
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import duckdb
import numpy as np
import polars as pl

from detectors.coverage import missing_reasons, reason_rows, too_short
from detectors.families import Families, attributes, families, family_rows, worst
from detectors.kinds import ensemble, kind_rows, scorecard_rows, summary_rows
from detectors.predictors import PREDICTOR_RULES, evaluate_predictors
from detectors.replay import RuleReplay, batches, default_rules, needs_peers, replay_batches, replay_on
from detectors.rules import Rule
from detectors.scoring import (  # noqa: F401 (the scoring API is used from here)
    RULE_FIELDS,
    Outcome,
    RunInfo,
    Settings,
    alarms_by_run,
    not_evaluated,
    outcomes,
    score,
    score_outcomes,
)
from detectors.series import ReplayError
from detectors.tuning import folds_of, run_groups, tune_rule
from workbench.store import Store, atomic, reads

if TYPE_CHECKING:
    from workbench.executor import Executor


def load_labels(store: Store, run_ids: list[str], con=None) -> tuple[dict[str, RunInfo], int]:
    """Labelled runs of the selection (failed/healthy, with their attributes; steps filled in
    during replay) and the count of the rest (unknown or unlabelled); `con`: a connection to
    the store to reuse (each connect builds the views)."""
    rows = reads.labels(["run_id", "outcome", "onset", "kind", "attrs"]).rows(con or store.connect())
    labels = {r[0]: r for r in rows}
    runs, unknown = {}, 0
    for run in run_ids:
        lab = labels.get(run)
        if lab is None or lab[1] not in ("failed", "healthy"):
            unknown += 1
            continue
        kind = (lab[3] or "unspecified") if lab[1] == "failed" else None
        attrs = {k: _attr(v) for k, v in json.loads(lab[4]).items() if v != ""} if lab[4] else {}
        runs[run] = RunInfo(run, lab[1], lab[2], 0, np.array([], dtype=np.int64), kind, attrs)
    return runs, unknown


def _attr(v) -> str:
    """An attribute's value as a family name (true, not True; 0.25 as written)."""
    return json.dumps(v) if isinstance(v, bool) else str(v)


def load_recoveries(con: duckdb.DuckDBPyConnection) -> list[tuple[str, int | None, bool, str]]:
    """(run recovered, step the recovery was triggered or rolled back to, did the continuation
    end healthy, automatic | manual) for every recovery the logs show (`con`: to the store).

    Automatic: inside the run: it resumed from an earlier checkpoint of its own (a lineage edge
    within the run) with its configuration unchanged, or it logged a recovery event
    (`RECOVERY TRIGGERED`) and no restart. Manual: a restart as another run (lineage's
    recovery and fork edges), or as a new segment with a changed configuration (lineage's
    `changes`). Healthy: the continuation is labelled healthy, or it completed and no failure
    of its label starts after the recovery."""
    return [tuple(r) for r in reads.recoveries().rows(con)]


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
    families: list[dict] = field(default_factory=list)  # per rule at its own parameters x family
    attributes: list[str] = field(default_factory=list)  # what families were held out by
    not_evaluable: list[dict] = field(default_factory=list)  # per rule: runs it could not evaluate, why
    skipped: dict[str, str] = field(default_factory=dict)  # default rules evaluable on no run -> why
    scorecard: list[dict] = field(default_factory=list)  # with scorecard=True (detectors.kinds)
    tuning_families: list[dict] = field(default_factory=list)  # tune: each held-out family's score

    TABLES: ClassVar[tuple[str, ...]] = (
        *("predictors", "kinds", "summary", "tuning", "schedule"),
        *("families", "not_evaluable", "scorecard", "tuning_families"),
    )

    def to_dict(self) -> dict:
        return {
            "rules": self.rules,
            "ensemble": self.ensemble,
            "attributes": self.attributes,
            "skipped": self.skipped,
            **{name: getattr(self, name) for name in self.TABLES},
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    def rules_frame(self) -> pl.DataFrame:
        return pl.DataFrame(self.rules, infer_schema_length=None)

    def write(self, out_dir: Path) -> None:
        """backtest.json, rules.csv, rules.parquet, and each other table that has rows as CSV
        (predictors, kinds, summary, families, not_evaluable, ...) in `out_dir`."""
        out_dir.mkdir(parents=True, exist_ok=True)
        rules, parquet = self.rules_frame(), io.BytesIO()
        rules.write_parquet(parquet)
        files = {
            out_dir / "backtest.json": (self.to_json() + "\n").encode(),
            out_dir / "rules.csv": rules.write_csv().encode(),
            out_dir / "rules.parquet": parquet.getvalue(),
        }
        for name in self.TABLES:
            if getattr(self, name):
                files[out_dir / f"{name}.csv"] = table(getattr(self, name)).write_csv().encode()
        atomic.write_files(files)  # all new or all as before, whatever stops it


def table(rows: list[dict]) -> pl.DataFrame:
    """Report rows as a flat frame (list values joined by spaces), for CSV and Parquet."""
    frame = pl.DataFrame(rows, infer_schema_length=None)
    lists = [c for c, t in frame.schema.items() if isinstance(t, pl.List)]
    return frame.with_columns(pl.col(c).list.join(" ") for c in lists)


@dataclass
class Scored:
    """One rule point judged on the labelled runs."""

    point: Rule
    default: bool  # the rule's own parameters
    parent: Rule  # the rule the point belongs to
    alarms: dict[str, list[int]]  # per labelled run
    evaluable: list[str]  # runs it could be evaluated on (enough steps too)
    outs: dict[str, Outcome]  # per labelled run among them
    missing: dict[str, Outcome]  # per labelled run it could not evaluate (with the reason)


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
    scorecard: bool = False,
) -> BacktestResult:
    """Replay every rule (and sweep point) and score it against the labels: per rule, per
    failure kind, per family, the ensemble of the rules at their own parameters, the summary;
    with `scorecard`, the scorecard; with `tune`, each rule's pick within `budget` false alarms
    per 1k steps, cross-validated (`folds` None: one fold per group of related runs), left out
    family by family, and scored on the `holdout_glob` runs kept out of it.
    `executor`: replay as tasks per rule chunk x run batch there (`replay_on`); the scoring,
    which needs every run of a rule at once, stays here."""
    settings = settings or Settings()
    explicit = rules is not None
    rules = default_rules() if rules is None else rules
    if tune:  # built-ins carry a grid of their own
        rules = [replace(r, sweep=r.detector.grid) if r.detector and not r.sweep else r for r in rules]
    groups = batches(store, runs_glob, whole_groups=needs_peers(rules))
    if not groups:
        raise ReplayError(f"no runs match {runs_glob!r}; list them with: workbench runs")
    run_ids = sorted(r for g in groups for r in g)
    con = store.connect()  # one connection (its views are built once) for every query below
    runs, unknown = load_labels(store, run_ids, con)
    if not runs:
        raise ReplayError(
            "no labelled runs in the selection: add a labels.toml beside the runs "
            "(see the README) or use: workbench label RUN --outcome failed --onset STEP"
        )
    attrs = attributes(runs, settings.families)
    fams = families(runs, attrs)
    points = [(p, p.params_json == rule.params_json, rule) for rule in rules for p in _points(rule)]
    extra = list(PREDICTOR_RULES.values()) if predictors else []  # replayed in the same pass
    done = replay_labelled(store, [p for p, _, _ in points] + extra, groups, runs, executor)
    scored, skipped = judge_points(store, points, done[: len(points)], runs, settings, explicit, con)
    in_job = in_job_detector(con, runs, settings)
    result = BacktestResult([], [], unknown, len(run_ids), attributes=attrs, skipped=skipped)
    _score_all(result, con, [*scored, *([in_job] if in_job else [])], runs, settings, fams, explicit)
    if scorecard:
        carded = [s for s in scored if s.default] + ([in_job] if in_job else [])
        result.scorecard = [row for s in carded for row in scorecard_rows(s.point, s.outs, runs, fams)]
    if predictors:
        replayed = dict(zip(PREDICTOR_RULES, done[len(points) :], strict=True))
        result.predictors, result.schedule = evaluate_predictors(con, runs, replayed)
    if tune:
        result.tuning, result.tuning_families = _tune(
            con, scored, runs, settings, budget, folds, holdout_glob, fams
        )
    return result


def judge_points(
    store: Store,
    points: list[tuple[Rule, bool, Rule]],
    done: list[RuleReplay],
    runs: dict[str, RunInfo],
    settings: Settings,
    explicit: bool,
    con=None,
) -> tuple[list[Scored], dict[str, str]]:
    """Each replayed point's outcomes on the labelled runs it could be evaluated on, and why
    not on the others (asked once per rule, of its own parameters); and the rules evaluable
    nowhere, with why (an error when none of the user's rules is evaluable)."""
    live: list[tuple[Rule, bool, Rule, RuleReplay]] = []
    skipped: dict[str, str] = {}
    for (p, default, parent), d in zip(points, done, strict=True):
        if d.error:
            skipped.setdefault(parent.id, d.error.split(";")[0])
            continue
        live.append((p, default, parent, d))
    if explicit and not live:  # none of the user's rules is evaluable: say why
        raise ReplayError(next(d.error for d in done if d.error))
    asked: dict[str, tuple[Rule, list[str]]] = {}
    for p, default, parent, d in live:
        if default or parent.id not in asked:
            ok = set(d.evaluable)
            asked[parent.id] = (p, [r for r in runs if r not in ok])
    reasons = missing_reasons(
        store, [p for p, _ in asked.values()], [m for _, m in asked.values()], runs, con
    )
    why = dict(zip(asked, reasons, strict=True))
    out = []
    for p, default, parent, d in live:
        alarms = alarms_by_run(d.alerts, runs, settings)
        short = too_short(p, d.evaluable, runs, settings, alarms)
        ok_runs = [r for r in d.evaluable if r not in short]
        outs = outcomes(alarms, ok_runs, runs, settings)
        missing = not_evaluated(runs, ok_runs, why.get(parent.id, {}) | short)
        out.append(Scored(p, default, parent, alarms, ok_runs, outs, missing))
    return out, skipped


def _score_all(
    result: BacktestResult,
    con: duckdb.DuckDBPyConnection,
    scored: list[Scored],
    runs: dict[str, RunInfo],
    settings: Settings,
    fams: Families,
    explicit: bool,
) -> None:
    """The rule rows, kind rows, family rows, not-evaluable rows, the ensemble and the summary."""
    recoveries = load_recoveries(con)
    for s in scored:
        fr = family_rows(s.point.id, s.point.params_json, s.outs, fams)
        result.rules.append(
            score_outcomes(
                s.point, s.outs, runs, settings, s.alarms, recoveries, s.default, s.missing, worst(fr)
            )
        )
        result.kinds += kind_rows(s.point.id, s.point.params_json, s.outs, runs)
        if s.default:
            result.families += fr
            result.not_evaluable += reason_rows(s.point.id, s.point.params_json, s.missing, runs)
    members = [
        (s.point, s.alarms, s.evaluable)
        for s in scored
        if s.default and s.point.id != IN_JOB and _in_ensemble(s.parent, explicit)
    ]
    if members:
        ens, ens_kinds, ens_fams, ens_outs = ensemble(members, runs, settings, recoveries, fams)
        result.ensemble = ens
        result.kinds += ens_kinds
        result.families += ens_fams
        gone = {r: o for r, o in ens_outs.items() if not o.evaluable}
        result.not_evaluable += reason_rows("ensemble", ens["params"], gone, runs)
    result.summary = summary_rows(result.rules, result.kinds)


IN_JOB = "in_job_alerts"


def in_job_detector(
    con: duckdb.DuckDBPyConnection, runs: dict[str, RunInfo], settings: Settings
) -> Scored | None:
    """The training jobs' own alert lines (events of kind `in_job_alert`: a TensorBoard
    `ALERT/...` text summary, `grad_anomaly_step`, `LOSS ANOMALY`) as a detector, judged on
    every labelled run; None when no selected run logged any."""
    rows = reads.in_job_alerts().rows(con)
    fired: dict[str, list[int]] = {}
    for run, step in rows:
        if run in runs and step >= runs[run].first_step + settings.warmup:
            fired.setdefault(run, []).append(int(step))
    if not fired:
        return None
    alarms = {r: sorted(set(v)) for r, v in fired.items()}
    rule = Rule(
        IN_JOB,
        None,
        origin="guides",
        description="the training job's own alert lines (ALERT/ text summaries, grad_anomaly_step, "
        "LOSS ANOMALY), as logged; a run without them counts as quiet",
    )
    ok = sorted(runs)
    return Scored(rule, True, rule, alarms, ok, outcomes(alarms, ok, runs, settings), {})


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
    outcomes: dict[str, Outcome]  # every one of them: `not evaluable` (and why) where it could not run
    evaluable: list[str]  # every run where it could be evaluated, labelled or not
    alerts: pl.DataFrame
    error: str | None = None  # why it could be evaluated nowhere


def judge(store: Store, rule: Rule, runs_glob: str | None, settings: Settings) -> Judgement:
    """One rule's outcome per labelled run, judged as `backtest` judges it (the same replay,
    warm-up, coverage and `scoring.outcome`): what the app's per-run table shows."""
    groups = batches(store, runs_glob, whole_groups=needs_peers([rule]))
    con = store.connect()
    runs, _ = load_labels(store, sorted(r for g in groups for r in g), con)
    done = replay_labelled(store, [rule], groups, runs)
    if done[0].error:
        return Judgement(runs, {}, [], done[0].alerts, done[0].error)
    (s,), _ = judge_points(store, [(rule, True, rule)], done, runs, settings, True, con)
    unlabelled = [r for r in done[0].evaluable if r not in runs]
    return Judgement(runs, s.outs | s.missing, sorted(s.evaluable + unlabelled), done[0].alerts)


def _points(rule: Rule) -> list[Rule]:
    """A rule's sweep points, its own parameters always among them."""
    pts = rule.sweep_points()
    if rule.sweep and all(p.params_json != rule.params_json for p in pts):
        pts = [replace(rule, sweep={}), *pts]
    return pts


def _in_ensemble(rule: Rule, explicit: bool) -> bool:
    """Without a rule file the ensemble is the built-ins (the guides' set repeats them); with one,
    every rule of the file."""
    return explicit or (rule.detector is not None and rule.detector.in_ensemble)


def _tune(con, scored, runs, settings, budget, folds, holdout_glob, fams) -> tuple[list[dict], list[dict]]:
    held = [r for r in runs if holdout_glob and fnmatch.fnmatchcase(r, holdout_glob)]
    tuning_runs = sorted(r for r in runs if r not in held)
    edges = reads.lineage(columns=["child_run", "parent_run"]).rows(con)
    groups = run_groups(tuning_runs, edges)
    fold_list = folds_of(groups, folds, settings.seed)
    by_rule: dict[str, list] = {}
    for s in scored:
        by_rule.setdefault(s.parent.id, []).append((s.point, s.outs, s.default))
    rows, fam_rows = [], []
    for pts in by_rule.values():
        if len(pts) > 1:
            row, fr = tune_rule(pts, tuning_runs, sorted(held), fold_list, budget, groups, fams)
            rows.append(row)
            fam_rows += fr
    return rows, fam_rows


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
