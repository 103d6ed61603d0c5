"""Backtest: how good is each rule, measured on labelled runs.

Per rule and per point of its sweep, over the labelled runs where it could be evaluated
(`unknown` runs are left out and counted):
- trigger_rate_failed: failed runs with an alarm after warm-up and no later than onset + horizon
  (a very early alarm still counts: vanishing gradients can start at step 0);
  trigger_rate_healthy: healthy runs with any alarm after warm-up.
- recall: failed runs with an alarm inside [onset - lead, onset + horizon].
- precision: detected failed runs / (detected + healthy runs with an alarm + failed runs whose
  only alarms came before onset - lead).
- false_alarms_per_1k: alarms per 1000 logged steps (the steps of the run's most-logged series)
  on negative stretches (healthy runs, and failed runs before onset - lead).
- lead time: onset - the first alarm in the recall window (positive = early): median, mean, std.
- first trigger: the first alarm step on failed runs: mean, std; never_fired counts the rest.
- 95 % intervals by bootstrap over runs (steps within a run are not independent).
- recovery outcomes: of the restarts (lineage) of runs in which the rule fired before the restart
  was triggered, how many continuations ended healthy.
An alarm is an alert's step_fired. Undefined values are null, never NaN. No point-adjusted F1.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from detectors.engine import ReplayError
from detectors.predictors import PREDICTOR_RULES, evaluate_predictors
from detectors.replay import batches, default_rules, replay_batches
from detectors.rules import Rule
from workbench.store import Store

RULE_FIELDS = [
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
    "recall_ci_low",
    "recall_ci_high",
    "precision_ci_low",
    "precision_ci_high",
    "recoveries_after_alarm",
    "recoveries_healthy",
    "description",
]


@dataclass
class Settings:
    horizon: int = 100  # an alarm up to onset + horizon still counts
    lead: int = 500  # the earliest before onset an alarm counts as a detection
    warmup: int = 0  # steps from each run's first step in which alarms are ignored
    bootstrap: int = 1000
    seed: int = 0


@dataclass
class RunInfo:
    run_id: str
    outcome: str
    onset: int | None
    first_step: int
    steps: np.ndarray  # the run's distinct logged steps, sorted


def _num(x) -> float | None:
    """JSON-safe: None for NaN/inf/None."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def load_labels(store: Store, run_ids: list[str]) -> tuple[dict[str, RunInfo], int]:
    """Labelled runs of the selection (failed/healthy; steps filled in during replay) and the
    count of the rest (unknown or unlabelled)."""
    labels = {
        r[0]: r for r in store.connect().execute("SELECT run_id, outcome, onset FROM labels").fetchall()
    }
    runs, unknown = {}, 0
    for run in run_ids:
        lab = labels.get(run)
        if lab is None or lab[1] not in ("failed", "healthy"):
            unknown += 1
            continue
        runs[run] = RunInfo(run, lab[1], lab[2], 0, np.array([], dtype=np.int64))
    return runs, unknown


def load_recoveries(store: Store) -> list[tuple[str, int | None, bool]]:
    """(parent run, step the restart was triggered or rolled back at, did the continuation end healthy)
    for every restart of one run by another (lineage `recovery` and `fork` edges)."""
    return (
        store.connect()
        .execute("""
        SELECT l.parent_run, coalesce(e.step, l.parent_step), coalesce(lb.outcome = 'healthy' OR r.status = 'completed', false)
        FROM lineage l LEFT JOIN labels lb ON lb.run_id = l.child_run LEFT JOIN runs r ON r.run_id = l.child_run
        LEFT JOIN (SELECT run_id, min(step) step FROM events WHERE kind = 'recovery' GROUP BY run_id) e ON e.run_id = l.child_run
        WHERE l.child_run <> l.parent_run""")
        .fetchall()
    )


def score(
    rule: Rule,
    alerts: pl.DataFrame,
    evaluable: list[str],
    runs: dict[str, RunInfo],
    settings: Settings,
    recoveries: list[tuple] = (),
) -> dict:
    """All metrics of one rule at one parameter point."""
    ev = [r for r in evaluable if r in runs]
    failed = [r for r in ev if runs[r].outcome == "failed"]
    healthy = [r for r in ev if runs[r].outcome == "healthy"]
    fired = {}
    for run, step in alerts.select("run_id", "step_fired").iter_rows():
        if run in runs and step >= runs[run].first_step + settings.warmup:
            fired.setdefault(run, []).append(step)
    per_run = {}
    for run in failed + healthy:
        info, alarms = runs[run], sorted(fired.get(run, []))
        if info.outcome == "healthy":
            neg_alarms, neg_steps = len(alarms), _count(info.steps, info.first_step + settings.warmup, None)
            per_run[run] = {
                "trig": bool(alarms),
                "tp": False,
                "fp": bool(alarms),
                "neg_alarms": neg_alarms,
                "neg_steps": neg_steps,
            }
            continue
        onset = info.onset
        if onset is None:  # a failed run without an onset: any alarm detects it, no lead time
            per_run[run] = {
                "trig": bool(alarms),
                "tp": bool(alarms),
                "fp": False,
                "neg_alarms": 0,
                "neg_steps": 0,
                "first": alarms[0] if alarms else None,
            }
            continue
        in_window = [a for a in alarms if onset - settings.lead <= a <= onset + settings.horizon]
        early = [a for a in alarms if a < onset - settings.lead]
        per_run[run] = {
            "trig": any(a <= onset + settings.horizon for a in alarms),
            "tp": bool(in_window),
            "fp": bool(early) and not in_window,
            "lead": onset - in_window[0] if in_window else None,
            "first": alarms[0] if alarms else None,
            "neg_alarms": len(early),
            "neg_steps": _count(info.steps, info.first_step + settings.warmup, onset - settings.lead),
        }
    out = {
        "rule": rule.id,
        "params": rule.params_json,
        "runs_failed": sum(1 for r in runs.values() if r.outcome == "failed"),
        "runs_healthy": sum(1 for r in runs.values() if r.outcome == "healthy"),
        "runs_evaluable": len(failed) + len(healthy),
        "description": " ".join((rule.description or "").split()),
    }
    out.update(_metrics(per_run, failed, healthy))
    lo, hi = _bootstrap(per_run, failed, healthy, settings)
    out.update(
        recall_ci_low=lo.get("recall"),
        recall_ci_high=hi.get("recall"),
        precision_ci_low=lo.get("precision"),
        precision_ci_high=hi.get("precision"),
    )
    # recovery outcomes: restarts that followed an alarm of this rule in the run they restarted
    after = [
        healthy
        for parent, step, healthy in recoveries
        if any(a <= (step if step is not None else a) for a in fired.get(parent, []))
    ]
    out.update(recoveries_after_alarm=len(after), recoveries_healthy=sum(after))
    return {k: out.get(k) for k in RULE_FIELDS}


def _count(steps: np.ndarray, lo: int, hi: int | None) -> int:
    """Logged steps in [lo, hi)."""
    a = np.searchsorted(steps, lo, "left")
    b = len(steps) if hi is None else np.searchsorted(steps, hi, "left")
    return int(max(0, b - a))


def _metrics(per_run: dict, failed: list[str], healthy: list[str]) -> dict:
    f = [per_run[r] for r in failed]
    h = [per_run[r] for r in healthy]
    tp = sum(x["tp"] for x in f)
    fp = sum(x["fp"] for x in f) + sum(x["fp"] for x in h)
    leads = [x["lead"] for x in f if x.get("lead") is not None]
    firsts = [x["first"] for x in f if x.get("first") is not None]
    neg_steps = sum(x["neg_steps"] for x in f + h)
    return {
        "trigger_rate_failed": _num(sum(x["trig"] for x in f) / len(f)) if f else None,
        "trigger_rate_healthy": _num(sum(x["trig"] for x in h) / len(h)) if h else None,
        "recall": _num(tp / len(f)) if f else None,
        "precision": _num(tp / (tp + fp)) if tp + fp else None,
        "false_alarms_per_1k": _num(1000 * sum(x["neg_alarms"] for x in f + h) / neg_steps)
        if neg_steps
        else None,
        "lead_time_median": _num(np.median(leads)) if leads else None,
        "lead_time_mean": _num(np.mean(leads)) if leads else None,
        "lead_time_std": _num(np.std(leads, ddof=1)) if len(leads) > 1 else None,
        "first_trigger_mean": _num(np.mean(firsts)) if firsts else None,
        "first_trigger_std": _num(np.std(firsts, ddof=1)) if len(firsts) > 1 else None,
        "never_fired": sum(1 for x in f if x.get("first") is None),
    }


def _bootstrap(per_run: dict, failed: list[str], healthy: list[str], settings: Settings) -> tuple[dict, dict]:
    """95 % percentile intervals of recall and precision, resampling runs within each cohort."""
    if not failed or settings.bootstrap <= 0:
        return {}, {}
    rng = np.random.default_rng(settings.seed)
    rec, prec = [], []
    for _ in range(settings.bootstrap):
        f = list(rng.choice(failed, len(failed)))
        h = list(rng.choice(healthy, len(healthy))) if healthy else []
        keyed = {f"{i}:{r}": per_run[r] for i, r in enumerate(f + h)}
        m = _metrics(
            keyed, [f"{i}:{r}" for i, r in enumerate(f)], [f"{i + len(f)}:{r}" for i, r in enumerate(h)]
        )
        rec.append(m["recall"])
        if m["precision"] is not None:
            prec.append(m["precision"])
    lo = {
        "recall": _num(np.percentile(rec, 2.5)),
        "precision": _num(np.percentile(prec, 2.5)) if prec else None,
    }
    hi = {
        "recall": _num(np.percentile(rec, 97.5)),
        "precision": _num(np.percentile(prec, 97.5)) if prec else None,
    }
    return lo, hi


@dataclass
class BacktestResult:
    rules: list[dict]
    predictors: list[dict]
    unknown_runs: int
    runs: int

    def to_json(self) -> str:
        return json.dumps({"rules": self.rules, "predictors": self.predictors}, indent=2, sort_keys=False)

    def rules_frame(self) -> pl.DataFrame:
        return pl.DataFrame(self.rules, infer_schema_length=None)

    def write(self, out_dir: Path) -> None:
        """backtest.json, rules.csv, rules.parquet and predictors.csv in `out_dir`."""
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "backtest.json").write_text(self.to_json() + "\n")
        self.rules_frame().write_csv(out_dir / "rules.csv")
        self.rules_frame().write_parquet(out_dir / "rules.parquet")
        pl.DataFrame(self.predictors, infer_schema_length=None).write_csv(out_dir / "predictors.csv")


def backtest(
    store: Store,
    rules: list[Rule] | None,
    runs_glob: str | None,
    settings: Settings | None = None,
    predictors: bool = True,
) -> BacktestResult:
    """Replay every rule (and sweep point) and score it against the labels."""
    settings = settings or Settings()
    explicit = rules is not None
    rules = rules if explicit else default_rules()
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
    points = [p for rule in rules for p in rule.sweep_points()]
    extra = list(PREDICTOR_RULES.values()) if predictors else []  # replayed in the same pass

    def note_steps(data):  # logged steps per run, from the batch already in memory
        for run, steps in data.logged_steps().items():
            if run in runs:
                runs[run].steps = steps
                runs[run].first_step = int(steps[0]) if len(steps) else 0

    done = replay_batches(store, points + extra, groups, on_batch=note_steps)
    recoveries = load_recoveries(store)
    results = []
    for p, d in zip(points, done, strict=False):
        if d.error:
            if explicit:
                raise ReplayError(d.error)
            continue
        results.append(score(p, d.alerts, d.evaluable, runs, settings, recoveries))
    preds = (
        evaluate_predictors(store, runs, dict(zip(PREDICTOR_RULES, done[len(points) :], strict=True)))
        if predictors
        else []
    )
    return BacktestResult(results, preds, unknown, len(run_ids))


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
