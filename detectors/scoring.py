"""Scoring primitives of the backtest: what one rule did on each labelled run (`Outcome`) and
the metrics over a set of runs (trigger rates, recall, precision, false alarms, lead time,
first trigger, bootstrap intervals). See detectors/backtest.py for the definitions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from detectors.rules import Rule

# the scores that get a leave-one-family-out figure (detectors.families): True where higher is better
LOFO_KEYS = {
    "trigger_rate_failed": True,
    "trigger_rate_healthy": False,
    "separation": True,
    "recall": True,
    "precision": True,
    "false_alarms_per_1k": False,
    "false_alarms_per_1k_healthy": False,
    "lead_time_median": True,
}
LOFO_FIELDS = [f for k in LOFO_KEYS for f in (f"lofo_{k}", f"lofo_{k}_family")]
RULE_FIELDS = [
    "rule",
    "params",
    "origin",
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
    "first_trigger_runs",
    "never_fired",
    "recall_ci_low",
    "recall_ci_high",
    "precision_ci_low",
    "precision_ci_high",
    "recoveries_after_alarm",
    "recoveries_healthy",
    "default",
    "evaluable_failed",
    "evaluable_healthy",
    "separation",
    "separation_ci_low",
    "separation_ci_high",
    "separation_p",
    "trigger_rate_failed_ci_low",
    "trigger_rate_failed_ci_high",
    "trigger_rate_healthy_ci_low",
    "trigger_rate_healthy_ci_high",
    "false_alarms_per_1k_healthy",
    "not_evaluable_failed",
    "not_evaluable_healthy",
    "recall_all",
    "recoveries_automatic",
    "recoveries_automatic_healthy",
    "recoveries_manual",
    "recoveries_manual_healthy",
    *LOFO_FIELDS,
    "description",
]


@dataclass
class Settings:
    horizon: int = 100  # an alarm up to onset + horizon still counts
    lead: int = 500  # the earliest before onset an alarm counts as a detection
    warmup: int = 0  # steps from each run's first step in which alarms are ignored
    bootstrap: int = 1000
    seed: int = 0
    refractory: int = 20  # ensemble: alarms of different rules this close are one event
    families: list[str] | None = None  # label attributes to hold families out by (None: every one)


@dataclass
class RunInfo:
    run_id: str
    outcome: str
    onset: int | None
    first_step: int
    steps: np.ndarray  # the run's distinct logged steps, sorted
    kind: str | None = None  # the failure kind of a failed run (labels), else None
    attrs: dict[str, str] = field(default_factory=dict)  # the label's attributes (its families)


@dataclass(frozen=True)
class Outcome:
    """What one rule did on one labelled run."""

    failed: bool
    triggered: bool  # failed: an alarm no later than onset + horizon; healthy: any alarm
    detected: bool  # an alarm inside [onset - lead, onset + horizon]
    false_positive: bool  # healthy with an alarm, or failed whose only alarms came too early
    neg_alarms: int  # alarm events on negative stretches
    neg_steps: int  # logged steps of those stretches
    lead: int | None = None  # onset - the first alarm in the window
    first: int | None = None  # the first alarm step (first trigger counts failed runs only)
    alarms: int = 0  # alarms after warm-up
    evaluable: bool = True
    reason: str | None = None  # why the rule could not be evaluated on the run

    @classmethod
    def not_evaluable(cls, failed: bool, reason: str) -> Outcome:
        """A run the rule could not be evaluated on: it never fired there (a failed run it could
        not see counts as missed wherever the score counts every labelled run)."""
        return cls(failed, False, False, False, 0, 0, evaluable=False, reason=reason)

    @property
    def verdict(self) -> str:
        """The judgement in words: a failed run is detected, missed, late (alarms only after
        onset + horizon) or a false alarm (alarms only before onset - lead); a healthy run is
        quiet or a false alarm; either is `not evaluable` where the rule could not run."""
        if not self.evaluable:
            return "not evaluable"
        if not self.failed:
            return "false alarm" if self.alarms else "quiet"
        if self.detected:
            return "detected"
        if self.false_positive:
            return "false alarm (before the window)"
        return "late" if self.alarms else "missed"


def json_num(x) -> float | None:
    """JSON-safe: None for NaN/inf/None."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def alarms_by_run(alerts: pl.DataFrame, runs: dict[str, RunInfo], settings: Settings) -> dict[str, list[int]]:
    """Alarm steps (each alert's step_fired) per labelled run, after warm-up, sorted."""
    fired: dict[str, list[int]] = {}
    for run, step in alerts.select("run_id", "step_fired").iter_rows():
        if run in runs and step >= runs[run].first_step + settings.warmup:
            fired.setdefault(run, []).append(step)
    return {run: sorted(steps) for run, steps in fired.items()}


def outcome(info: RunInfo, alarms: list[int], settings: Settings) -> Outcome:
    """One run's outcome under a rule whose alarms (sorted steps) are given."""
    start = info.first_step + settings.warmup
    first = alarms[0] if alarms else None
    if info.outcome == "healthy":
        neg_steps = _count(info.steps, start, None)
        return Outcome(
            False, bool(alarms), False, bool(alarms), len(alarms), neg_steps, None, first, len(alarms)
        )
    if info.onset is None:  # a failed run without an onset: any alarm detects it, no lead time
        return Outcome(True, bool(alarms), bool(alarms), False, 0, 0, None, first, len(alarms))
    lo, hi = info.onset - settings.lead, info.onset + settings.horizon
    in_window = [a for a in alarms if lo <= a <= hi]
    early = [a for a in alarms if a < lo]
    return Outcome(
        failed=True,
        triggered=any(a <= hi for a in alarms),
        detected=bool(in_window),
        false_positive=bool(early) and not in_window,
        neg_alarms=len(early),
        neg_steps=_count(info.steps, start, lo),
        lead=info.onset - in_window[0] if in_window else None,
        first=first,
        alarms=len(alarms),
    )


def outcomes(
    alarms: dict[str, list[int]], evaluable: list[str], runs: dict[str, RunInfo], settings: Settings
) -> dict[str, Outcome]:
    """Outcome per labelled run where the rule could be evaluated."""
    return {r: outcome(runs[r], alarms.get(r, []), settings) for r in evaluable if r in runs}


def not_evaluated(
    runs: dict[str, RunInfo], evaluable: list[str], reasons: dict[str, str] | None = None
) -> dict[str, Outcome]:
    """A `not evaluable` outcome for every labelled run outside `evaluable`, with its reason."""
    ok, reasons = set(evaluable), reasons or {}
    return {
        r: Outcome.not_evaluable(info.outcome == "failed", reasons.get(r, "not evaluable"))
        for r, info in runs.items()
        if r not in ok
    }


def score(
    rule: Rule,
    alerts: pl.DataFrame,
    evaluable: list[str],
    runs: dict[str, RunInfo],
    settings: Settings,
    recoveries: Sequence[tuple] = (),
    default: bool = True,
) -> dict:
    """All metrics of one rule at one parameter point."""
    fired = alarms_by_run(alerts, runs, settings)
    outs = outcomes(fired, evaluable, runs, settings)
    return score_outcomes(
        rule, outs, runs, settings, fired, recoveries, default, not_evaluated(runs, evaluable)
    )


def score_outcomes(
    rule: Rule,
    outs: dict[str, Outcome],
    runs: dict[str, RunInfo],
    settings: Settings,
    fired: dict[str, list[int]],
    recoveries: Sequence[tuple] = (),
    default: bool = True,
    missing: dict[str, Outcome] | None = None,
    lofo: dict | None = None,
) -> dict:
    """The rule object of the report from the outcomes of the runs it was evaluated on (and
    alarms, for recoveries); `missing`: the labelled runs it could not evaluate, which
    `recall_all` counts as missed; `lofo`: its leave-one-family-out figures."""
    missing = missing or {}
    n_missing = sum(o.failed for o in missing.values())
    out: dict = {
        "rule": rule.id,
        "params": rule.params_json,
        "origin": rule.origin,
        "runs_failed": sum(1 for r in runs.values() if r.outcome == "failed"),
        "runs_healthy": sum(1 for r in runs.values() if r.outcome == "healthy"),
        "runs_evaluable": len(outs),
        "default": default,
        "description": " ".join((rule.description or "").split()),
        "not_evaluable_failed": n_missing,
        "not_evaluable_healthy": sum(not o.failed for o in missing.values()),
    }
    out.update(metrics(list(outs.values())))
    out.update(intervals(list(outs.values()), settings))
    n_failed = sum(o.failed for o in outs.values() if o.evaluable) + n_missing
    if n_failed:
        out["recall_all"] = json_num(sum(o.detected for o in outs.values() if o.failed) / n_failed)
    out.update(recovery_counts(fired, recoveries))
    out.update(lofo or {})
    return {k: out.get(k) for k in RULE_FIELDS}


def recovery_counts(fired: dict[str, list[int]], recoveries: Sequence[tuple]) -> dict:
    """Of the recoveries (parent run, step, continuation ended healthy, automatic | manual) that
    followed an alarm in the run they recovered: how many, how many ended healthy, in all and
    by how they were made."""
    after = [
        (healthy, mode)
        for parent, step, healthy, mode in recoveries
        if any(a <= (step if step is not None else a) for a in fired.get(parent, []))
    ]
    out = {"recoveries_after_alarm": len(after), "recoveries_healthy": sum(h for h, _ in after)}
    for mode in ("automatic", "manual"):
        out[f"recoveries_{mode}"] = sum(m == mode for _, m in after)
        out[f"recoveries_{mode}_healthy"] = sum(h for h, m in after if m == mode)
    return out


def _count(steps: np.ndarray, lo: int, hi: int | None) -> int:
    """Logged steps in [lo, hi)."""
    a = np.searchsorted(steps, lo, "left")
    b = len(steps) if hi is None else np.searchsorted(steps, hi, "left")
    return max(0, int(b) - int(a))


def metrics(outs: list[Outcome]) -> dict:
    """Trigger rates, recall, precision, false alarms, lead and first-trigger statistics over
    the given outcomes (a `not evaluable` one among them counts as a run that never fired)."""
    f = [o for o in outs if o.failed]
    h = [o for o in outs if not o.failed]
    tp = sum(o.detected for o in f)
    fp = sum(o.false_positive for o in outs)
    trig_f, trig_h = sum(o.triggered for o in f), sum(o.triggered for o in h)
    leads = [o.lead for o in f if o.lead is not None]
    firsts = [o.first for o in f if o.first is not None]
    neg_steps = sum(o.neg_steps for o in outs)
    h_steps = sum(o.neg_steps for o in h)
    tr_f = trig_f / len(f) if f else None
    tr_h = trig_h / len(h) if h else None
    p = None
    if f and h:  # one-sided: does the rule fire more often on failed runs than on healthy ones?
        p = fisher_greater(trig_f, len(f), trig_h, len(h))
    return {
        "evaluable_failed": sum(o.evaluable for o in f),
        "evaluable_healthy": sum(o.evaluable for o in h),
        "trigger_rate_failed": json_num(tr_f),
        "trigger_rate_healthy": json_num(tr_h),
        "separation": json_num(tr_f - tr_h) if tr_f is not None and tr_h is not None else None,
        "separation_p": json_num(p),
        "recall": json_num(tp / len(f)) if f else None,
        "precision": json_num(tp / (tp + fp)) if tp + fp else None,
        "false_alarms_per_1k": json_num(1000 * sum(o.neg_alarms for o in outs) / neg_steps)
        if neg_steps
        else None,
        "false_alarms_per_1k_healthy": json_num(1000 * sum(o.neg_alarms for o in h) / h_steps)
        if h_steps
        else None,
        "lead_time_median": json_num(np.median(leads)) if leads else None,
        "lead_time_mean": json_num(np.mean(leads)) if leads else None,
        "lead_time_std": json_num(np.std(leads, ddof=1)) if len(leads) > 1 else None,
        "first_trigger_mean": json_num(np.mean(firsts)) if firsts else None,
        "first_trigger_std": json_num(np.std(firsts, ddof=1)) if len(firsts) > 1 else None,
        "first_trigger_runs": len(firsts),
        "never_fired": sum(1 for o in f if o.first is None),
    }


def fisher_greater(fired_f: int, n_f: int, fired_h: int, n_h: int) -> float:
    """One-sided Fisher exact test: the probability, with the trigger counts' margins fixed, of
    at least `fired_f` of the failed runs firing (hypergeometric upper tail)."""
    fired, n = fired_f + fired_h, n_f + n_h
    total = math.comb(n, n_f)
    return (
        sum(math.comb(fired, x) * math.comb(n - fired, n_f - x) for x in range(fired_f, min(fired, n_f) + 1))
        / total
    )


def intervals(outs: list[Outcome], settings: Settings) -> dict:
    """95 % percentile bootstrap intervals of recall, precision, both trigger rates and their
    difference, resampling runs within each cohort (steps within a run are not independent)."""
    f = [o for o in outs if o.failed]
    h = [o for o in outs if not o.failed]
    if settings.bootstrap <= 0 or not (f or h):
        return {}
    rng = np.random.default_rng(settings.seed)
    b = settings.bootstrap
    out = {}

    def ci(name, samples):
        samples = samples[np.isfinite(samples)]
        if len(samples):
            out[f"{name}_ci_low"] = json_num(np.percentile(samples, 2.5))
            out[f"{name}_ci_high"] = json_num(np.percentile(samples, 97.5))

    tp = fp = 0
    if f:
        idx = rng.integers(0, len(f), (b, len(f)))
        det = np.array([o.detected for o in f])[idx]
        trf = np.array([o.triggered for o in f])[idx].mean(1)
        tp = det.sum(1)
        fp = np.array([o.false_positive for o in f])[idx].sum(1)
        ci("recall", det.mean(1))
        ci("trigger_rate_failed", trf)
    if h:
        idx = rng.integers(0, len(h), (b, len(h)))
        fired = np.array([o.triggered for o in h])[idx]
        fp = fp + fired.sum(1)
        ci("trigger_rate_healthy", fired.mean(1))
        if f:
            ci("separation", trf - fired.mean(1))
    if f:
        with np.errstate(invalid="ignore", divide="ignore"):
            ci("precision", tp / (tp + fp))
    return out
