"""Honest tuning: pick each rule's parameters within a false-alarm budget, and measure the pick on
runs it was not picked on.

- The pick: among a rule's sweep points, the one with the highest recall whose false alarms per
  1k steps stay within the budget (ties: fewer false alarms, then the larger separation of
  trigger rates); when none fits, the point with the fewest false alarms.
- In-sample: the pick made on the tuning runs, scored on the same runs (what a plain sweep shows).
- Cross-validated: the tuning runs are split into groups (runs joined by lineage, a resume or a
  restart of one another, are one group, so that a run's continuation never grades its pick);
  each fold holds out one group (leave-one-run-out when runs are unrelated), or one of k folds of
  groups, makes the pick on the rest and scores the held-out runs at it. The held-out outcomes of
  all folds together are the cross-validated score. In-sample minus cross-validated recall is
  the optimism: how much of the in-sample score is the threshold fitting these very runs.
- Holdout: runs kept out of tuning altogether, scored at the in-sample pick and at the rule's
  shipped default.
"""

from __future__ import annotations

import numpy as np

from detectors.rules import Rule
from detectors.scoring import Outcome, metrics

_KEYS = ("recall", "trigger_rate_failed", "trigger_rate_healthy", "false_alarms_per_1k")
TUNE_FIELDS = [
    "rule",
    "points",
    "budget",
    "folds",
    "default_params",
    "picked_params",
    "pick_agreement",
    "in_sample_recall",
    "in_sample_trigger_rate_failed",
    "in_sample_trigger_rate_healthy",
    "in_sample_false_alarms_per_1k",
    "cv_recall",
    "cv_trigger_rate_failed",
    "cv_trigger_rate_healthy",
    "cv_false_alarms_per_1k",
    "optimism_recall",
    "holdout_runs",
    "holdout_recall",
    "holdout_trigger_rate_failed",
    "holdout_trigger_rate_healthy",
    "holdout_false_alarms_per_1k",
    "default_holdout_recall",
    "default_holdout_trigger_rate_healthy",
    "default_holdout_false_alarms_per_1k",
]


def run_groups(run_ids: list[str], edges: list[tuple[str, str]]) -> list[list[str]]:
    """Connected components of runs under lineage edges (child, parent), sorted."""
    parent = {r: r for r in run_ids}

    def root(r):
        while parent[r] != r:
            parent[r] = parent[parent[r]]
            r = parent[r]
        return r

    for a, b in edges:
        if a in parent and b in parent:
            parent[root(a)] = root(b)
    groups: dict[str, list[str]] = {}
    for r in sorted(run_ids):
        groups.setdefault(root(r), []).append(r)
    return sorted(groups.values())


def folds_of(groups: list[list[str]], k: int | None, seed: int = 0) -> list[list[str]]:
    """One fold per group (k None), or the groups dealt into k folds in a seeded order."""
    if not k or k >= len(groups):
        return groups
    order = np.random.default_rng(seed).permutation(len(groups))
    folds: list[list[str]] = [[] for _ in range(k)]
    for i, g in enumerate(order):
        folds[i % k] += groups[g]
    return [sorted(f) for f in folds if f]


def _scores(outs: dict[str, Outcome], subset) -> dict:
    return metrics([outs[r] for r in subset if r in outs])


class _Counts:
    """One sweep point's outcomes on the tuning runs as count vectors, so that the score of
    any subset of runs (all but one fold) is a masked sum, not a pass over Outcome objects."""

    def __init__(self, outs: dict[str, Outcome], runs: list[str]):
        o = [outs.get(r) for r in runs]
        self.ok = np.array([x is not None for x in o])
        self.failed = np.array([x is not None and x.failed for x in o])
        self.healthy = self.ok & ~self.failed
        self.detected = np.array([x is not None and x.detected for x in o])
        self.triggered = np.array([x is not None and x.triggered for x in o])
        self.alarms = np.array([x.neg_alarms if x else 0 for x in o], dtype=float)
        self.steps = np.array([x.neg_steps if x else 0 for x in o], dtype=float)

    def key(self, mask: np.ndarray, budget: float, is_default: bool) -> tuple:
        """(fits the budget, recall, -false alarms per 1k, separation, is the default)."""
        f, h = self.failed & mask, self.healthy & mask
        steps = self.steps[mask & self.ok].sum()
        fa = 1000 * self.alarms[mask & self.ok].sum() / steps if steps else 0.0
        recall = self.detected[f].mean() if f.any() else 0.0
        sep = self.triggered[f].mean() - self.triggered[h].mean() if f.any() and h.any() else -1.0
        return (fa <= budget, recall, -fa, sep, is_default)


def pick(points: list[_Counts], mask: np.ndarray, budget: float, default: int | None = None) -> int:
    """Index of the point picked on the runs in `mask` (see the module docstring); on a tie the
    default; when nothing fits the budget, the quietest point."""
    keys = [p.key(mask, budget, i == default) for i, p in enumerate(points)]
    if not any(k[0] for k in keys):
        return max(range(len(points)), key=lambda i: (keys[i][2], keys[i][1], keys[i][4]))
    return max(range(len(points)), key=lambda i: keys[i])


def tune_rule(
    rule_points: list[tuple[Rule, dict[str, Outcome], bool]],
    tuning_runs: list[str],
    holdout_runs: list[str],
    folds: list[list[str]],
    budget: float,
) -> dict:
    """One rule's tuning report; rule_points are (point, outcomes per run, is the default)."""
    outs = [o for _, o, _ in rule_points]
    default = next((i for i, (_, _, d) in enumerate(rule_points) if d), None)
    counts = [_Counts(o, tuning_runs) for o in outs]
    chosen = pick(counts, np.ones(len(tuning_runs), bool), budget, default)
    fold_picks = []
    cv: dict[str, Outcome] = {}
    for fold in folds:
        i = pick(counts, ~np.isin(tuning_runs, fold), budget, default)
        fold_picks.append(i)
        cv.update({r: outs[i][r] for r in fold if r in outs[i]})
    ins, cvm = _scores(outs[chosen], tuning_runs), metrics(list(cv.values()))
    row = {
        "rule": rule_points[0][0].id,
        "points": len(rule_points),
        "budget": budget,
        "folds": len(folds),
        "default_params": rule_points[default][0].params_json if default is not None else None,
        "picked_params": rule_points[chosen][0].params_json,
        "pick_agreement": sum(i == chosen for i in fold_picks) / len(fold_picks) if fold_picks else None,
        "optimism_recall": (ins["recall"] - cvm["recall"])
        if ins["recall"] is not None and cvm["recall"] is not None
        else None,
        "holdout_runs": len(holdout_runs),
    }
    for prefix, m in (("in_sample", ins), ("cv", cvm)):
        row.update({f"{prefix}_{k}": m[k] for k in _KEYS})
    if holdout_runs:
        m = _scores(outs[chosen], holdout_runs)
        row.update({f"holdout_{k}": m[k] for k in _KEYS})
        if default is not None:
            m = _scores(outs[default], holdout_runs)
            row.update(
                default_holdout_recall=m["recall"],
                default_holdout_trigger_rate_healthy=m["trigger_rate_healthy"],
                default_holdout_false_alarms_per_1k=m["false_alarms_per_1k"],
            )
    return {k: row.get(k) for k in TUNE_FIELDS}
