"""Scoring by failure kind: which kinds of failure each rule catches (a rule x kind matrix), what
"any of these rules" catches together (the ensemble), and the seed-style summary per rule.

- kind matrix: per rule point and per failure kind of the labelled runs (the `kind` of a label),
  the runs of that kind, how many the rule could be evaluated on, triggered and detected, recall
  and lead time; plus a `healthy` row per rule with its trigger rate and false alarms per 1k
  healthy steps. Rates are over the runs the rule could be evaluated on (null when none).
- ensemble: the union of the alarms of its members (alarms of different rules closer than the
  refractory are one event), scored like a rule over the runs any member could be evaluated on.
- summary: per rule at its own parameters, the figures the guides quote: first trigger step
  mean +- std on failed runs, trigger rate on failed vs healthy runs (with bootstrap intervals),
  recovery success where restarts are logged, and the kinds it catches (recall >= 0.5).
"""

from __future__ import annotations

import numpy as np

from detectors.rules import Rule
from detectors.scoring import Outcome, RunInfo, Settings, json_num, outcomes, score_outcomes

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
    "runs_evaluable",
    "first_trigger_mean",
    "first_trigger_std",
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
    "false_alarms_per_1k_healthy",
    "lead_time_median",
    "recoveries_after_alarm",
    "recoveries_healthy",
    "recovery_success",
    "kinds_caught",
    "description",
]


def failure_kinds(runs: dict[str, RunInfo]) -> list[str]:
    return sorted({r.kind for r in runs.values() if r.outcome == "failed" and r.kind})


def kind_rows(rule_id: str, params: str, outs: dict[str, Outcome], runs: dict[str, RunInfo]) -> list[dict]:
    """The rule's row per failure kind, then its healthy row."""
    rows = []
    for kind in [*failure_kinds(runs), HEALTHY]:
        members = [r for r in runs.values() if (r.outcome == HEALTHY if kind == HEALTHY else r.kind == kind)]
        o = [outs[r.run_id] for r in members if r.run_id in outs]
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
                "evaluable": len(o),
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
    recoveries: list[tuple] = (),
) -> tuple[dict, list[dict]]:
    """The "any of these rules" score (a rule object plus `members`) and its kind rows;
    members are (rule point, alarms per run, evaluable runs)."""
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
    row = score_outcomes(rule, outs, runs, settings, alarms, recoveries)
    return {**row, "members": ids}, kind_rows(rule.id, row["params"], outs, runs)


def summary_rows(results: list[dict], kinds: list[dict]) -> list[dict]:
    """Per rule at its own parameters: the seed-style summary (see the module docstring)."""
    caught: dict[tuple[str, str], list[str]] = {}
    for k in kinds:
        if k["kind"] != HEALTHY and k["recall"] is not None and k["recall"] >= 0.5:
            caught.setdefault((k["rule"], k["params"]), []).append(k["kind"])
    out = []
    for r in results:
        if not r["default"]:
            continue
        after = r["recoveries_after_alarm"] or 0
        row = {
            **r,
            "recovery_success": json_num(r["recoveries_healthy"] / after) if after else None,
            "kinds_caught": caught.get((r["rule"], r["params"]), []),
        }
        out.append({k: row.get(k) for k in SUMMARY_FIELDS})
    return out
