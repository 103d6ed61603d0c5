"""Scoring by failure kind: which kinds of failure each rule catches (a rule x kind matrix), what
"any of these rules" catches together (the ensemble), and the seed-style summary per rule.

- kind matrix: per rule point and per failure kind of the labelled runs (the `kind` of a label),
  the runs of that kind, how many the rule could be evaluated on, triggered and detected, recall
  and lead time; plus a `healthy` row per rule with its trigger rate and false alarms per 1k
  healthy steps. Rates are over the runs the rule could be evaluated on (null when none).
- ensemble: the union of the alarms of its members (alarms of different rules closer than the
  refractory are one event), scored like a rule over the runs any member could be evaluated on
  and the failed runs none could, which count as missed.
- scorecard: per rule at its own parameters and per failure kind (and `all`), precision,
  recall, false alarms per 1k steps, median lead and first trigger mean +- std over the runs
  of that kind and the healthy runs, in-sample and leave-one-family-out (detectors.families).
- summary: per rule at its own parameters, the figures the guides quote: first trigger step
  mean +- std on failed runs, trigger rate on failed vs healthy runs (with bootstrap intervals),
  recovery success where restarts are logged, and the kinds it catches (recall >= 0.5).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from detectors.families import Families, family_rows, worst
from detectors.rules import Rule
from detectors.scoring import (
    LOFO_FIELDS,
    Outcome,
    RunInfo,
    Settings,
    json_num,
    metrics,
    not_evaluated,
    outcomes,
    score_outcomes,
)

HEALTHY = "healthy"
KIND_FIELDS = [
    "rule",
    "params",
    "kind",
    "runs",
    "evaluable",
    "triggered",
    "detected",
    "trigger_rate",
    "recall",
    "lead_time_median",
    "lead_time_mean",
    "first_trigger_mean",
    "false_alarms_per_1k",
]
SUMMARY_FIELDS = [
    "rule",
    "params",
    "origin",
    "runs_evaluable",
    "not_evaluable_failed",
    "not_evaluable_healthy",
    "first_trigger_mean",
    "first_trigger_std",
    "first_trigger_runs",
    "never_fired",
    "trigger_rate_failed",
    "trigger_rate_failed_ci_low",
    "trigger_rate_failed_ci_high",
    "trigger_rate_healthy",
    "trigger_rate_healthy_ci_low",
    "trigger_rate_healthy_ci_high",
    "separation",
    "separation_p",
    "recall",
    "recall_all",
    "false_alarms_per_1k_healthy",
    "lead_time_median",
    "recoveries_after_alarm",
    "recoveries_healthy",
    "recovery_success",
    "recoveries_automatic",
    "recoveries_automatic_healthy",
    "recovery_success_automatic",
    "recoveries_manual",
    "recoveries_manual_healthy",
    "recovery_success_manual",
    "kinds_caught",
    *LOFO_FIELDS,
    "description",
]
FIRST_TRIGGER_MIN_RUNS = 5  # the guides quote first-trigger steps over at least this many failed runs
ALL_KINDS = "all"
# the scorecard's scores, True where higher is better
SCORECARD_KEYS = {"precision": True, "recall": True, "false_alarms_per_1k": False, "lead_time_median": True}
SCORECARD_FIELDS = [
    "rule",
    "origin",
    "kind",
    "runs",
    "evaluable",
    *SCORECARD_KEYS,
    "first_trigger_mean",
    "first_trigger_std",
    "first_trigger_runs",
    *[f for k in SCORECARD_KEYS for f in (f"lofo_{k}", f"lofo_{k}_family")],
    "lofo_first_trigger_mean",
    "lofo_first_trigger_mean_family",
]


def failure_kinds(runs: dict[str, RunInfo]) -> list[str]:
    return sorted({r.kind for r in runs.values() if r.outcome == "failed" and r.kind})


def kind_rows(rule_id: str, params: str, outs: dict[str, Outcome], runs: dict[str, RunInfo]) -> list[dict]:
    """The rule's row per failure kind, then its healthy row."""
    rows = []
    for kind in [*failure_kinds(runs), HEALTHY]:
        members = [r for r in runs.values() if (r.outcome == HEALTHY if kind == HEALTHY else r.kind == kind)]
        o = [outs[r.run_id] for r in members if r.run_id in outs]  # not evaluable: counted as missed
        leads = [x.lead for x in o if x.lead is not None]
        firsts = [x.first for x in o if x.failed and x.first is not None]
        steps = sum(x.neg_steps for x in o)
        healthy = kind == HEALTHY
        rows.append(
            {
                "rule": rule_id,
                "params": params,
                "kind": kind,
                "runs": len(members),
                "evaluable": sum(x.evaluable for x in o),
                "triggered": sum(x.triggered for x in o),
                "detected": None if healthy else sum(x.detected for x in o),
                "trigger_rate": json_num(sum(x.triggered for x in o) / len(o)) if o else None,
                "recall": None if healthy or not o else json_num(sum(x.detected for x in o) / len(o)),
                "lead_time_median": json_num(np.median(leads)) if leads else None,
                "lead_time_mean": json_num(np.mean(leads)) if leads else None,
                "first_trigger_mean": json_num(np.mean(firsts)) if firsts else None,
                "false_alarms_per_1k": json_num(1000 * sum(x.neg_alarms for x in o) / steps)
                if healthy and steps
                else None,
            }
        )
    return rows


def merge_alarms(alarm_sets: list[dict[str, list[int]]], refractory: int) -> dict[str, list[int]]:
    """Per run, the union of several rules' alarm steps; an alarm within `refractory` steps of
    the last kept one belongs to the same event."""
    out: dict[str, list[int]] = {}
    for run in sorted({r for s in alarm_sets for r in s}):
        kept: list[int] = []
        for step in sorted(a for s in alarm_sets for a in s.get(run, [])):
            if not kept or step > kept[-1] + refractory:
                kept.append(step)
        out[run] = kept
    return out


def ensemble(
    members: list[tuple[Rule, dict[str, list[int]], list[str]]],
    runs: dict[str, RunInfo],
    settings: Settings,
    recoveries: Sequence[tuple] = (),
    fams: Families | None = None,
) -> tuple[dict, list[dict], list[dict], dict[str, Outcome]]:
    """The "any of these rules" score (a rule object plus `members`), its kind rows, its
    family rows and its outcome on every labelled run (`not evaluable` where no member could
    be evaluated); members are (rule point, alarms per run, evaluable runs). A failed run no
    member could evaluate counts as missed."""
    ids = [m[0].id for m in members]
    rule = Rule(
        "ensemble",
        None,
        params={"members": ids, "refractory": settings.refractory},
        description=f"any of {len(ids)} rules: " + ", ".join(ids),
    )
    alarms = merge_alarms([m[1] for m in members], settings.refractory)
    evaluable = sorted({r for m in members for r in m[2]})
    outs = outcomes(alarms, evaluable, runs, settings)
    missing = not_evaluated(runs, evaluable, dict.fromkeys(runs, "no member rule could evaluate it"))
    counted = outs | {r: o for r, o in missing.items() if o.failed}
    fam_rows = family_rows(rule.id, rule.params_json, counted, fams or {})
    row = score_outcomes(rule, counted, runs, settings, alarms, recoveries, True, missing, worst(fam_rows))
    row["runs_evaluable"] = len(outs)
    return (
        {**row, "members": ids},
        kind_rows(rule.id, row["params"], counted, runs),
        fam_rows,
        counted | missing,
    )


def summary_rows(results: list[dict], kinds: list[dict]) -> list[dict]:
    """Per rule at its own parameters: the guides' table (see the module docstring)."""
    caught: dict[tuple[str, str], list[str]] = {}
    for k in kinds:
        if k["kind"] != HEALTHY and k["recall"] is not None and k["recall"] >= 0.5:
            caught.setdefault((k["rule"], k["params"]), []).append(k["kind"])
    out = []
    for r in results:
        if not r["default"]:
            continue
        row = {**r, "kinds_caught": caught.get((r["rule"], r["params"]), [])}
        for mode in ("", "_automatic", "_manual"):
            n = r.get(f"recoveries{mode or '_after_alarm'}") or 0
            row[f"recovery_success{mode}"] = (
                json_num(r.get(f"recoveries{mode or ''}_healthy", 0) / n) if n else None
            )
        out.append({k: row.get(k) for k in SUMMARY_FIELDS})
    return out


def scorecard_rows(
    rule: Rule, outs: dict[str, Outcome], runs: dict[str, RunInfo], fams: Families
) -> list[dict]:
    """One rule at its own parameters, per failure kind (and all kinds): its scores over the runs
    of that kind and the healthy runs, in-sample and on the worst family (see the module
    docstring); the first trigger's leave-one-family-out figure is the family mean farthest
    from the in-sample one."""
    healthy = {r for r, i in runs.items() if i.outcome == HEALTHY}
    rows = []
    for kind in [ALL_KINDS, *failure_kinds(runs)]:
        failed = {r for r, i in runs.items() if i.outcome == "failed" and kind in (ALL_KINDS, i.kind)}
        among = failed | healthy
        m = metrics([outs[r] for r in sorted(among) if r in outs])
        fr = family_rows(rule.id, rule.params_json, outs, fams, among)
        far = [
            (abs(f["first_trigger_mean"] - m["first_trigger_mean"]), f)
            for f in fr
            if f["first_trigger_mean"] is not None and m["first_trigger_mean"] is not None
        ]
        pick = max(far, key=lambda x: x[0])[1] if far else None
        row = {
            "rule": rule.id,
            "origin": rule.origin,
            "kind": kind,
            "runs": len(failed),
            "evaluable": m["evaluable_failed"],
            **m,
            **worst(fr, SCORECARD_KEYS),
            "lofo_first_trigger_mean": pick["first_trigger_mean"] if pick else None,
            "lofo_first_trigger_mean_family": f"{pick['attribute']}={pick['family']}" if pick else None,
        }
        rows.append({k: row.get(k) for k in SCORECARD_FIELDS})
    return rows
