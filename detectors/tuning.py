"""Honest tuning: pick each rule's parameters within a false-alarm budget, and measure the pick on
runs it was not picked on.

- The pick: among a rule's sweep points, the one with the highest recall whose false alarms per
  1k steps stay within the budget (ties: fewer false alarms, then the larger separation of
  trigger rates, then the shipped default); when none fits, the point with the fewest false
  alarms.
- In-sample: the pick made on the tuning runs, scored on the same runs (what a plain sweep shows).
- Cross-validated: the tuning runs are split into groups (runs joined by lineage, a resume or a
  restart of one another, are one group, so that a run's continuation never grades its pick);
  each fold holds out one group (leave-one-run-out when runs are unrelated), or one of k folds of
  groups, makes the pick on the rest and scores the held-out runs at it. The held-out outcomes of
  all folds together are the cross-validated score. In-sample minus cross-validated recall is
  the optimism: how much of the in-sample score is the threshold fitting these very runs.
- Holdout: runs kept out of tuning altogether, scored at the in-sample pick and at the rule's
  shipped default.
- Leave one family out (detectors.families): for each family of each attribute of the labels,
  the pick made on the tuning runs of every other family (a group of related runs that reaches
  into the family is held out whole) and scored on the family's runs; per score, the worst
  family's figure (lofo_<score>, lofo_<score>_family) beside the in-sample and cross-validated
  ones, and each family's pick and scores as rows. An attribute with one family is skipped
  (holding it out leaves nothing to pick on).
"""

from __future__ import annotations

import numpy as np

from detectors.families import Families, worst
from detectors.rules import Rule
from detectors.scoring import LOFO_KEYS, Outcome, metrics

_KEYS = ("recall", "trigger_rate_failed", "trigger_rate_healthy", "false_alarms_per_1k")
TUNE_FAMILY_FIELDS = [
    "rule",
    "attribute",
    "family",
    "runs",
    "evaluable_failed",
    "evaluable_healthy",
    "picked_params",
    *_KEYS,
]
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
    *[f for k in _KEYS for f in (f"lofo_{k}", f"lofo_{k}_family")],
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
    """A rule's sweep points x the tuning runs as count matrices, so that every point's score on
    any subset of runs (all but one fold) is one masked sum, not a pass over Outcome objects."""

    def __init__(self, points: list[dict[str, Outcome]], runs: list[str]):
        o = [[p.get(r) for r in runs] for p in points]

        def grid(f, dtype=bool):
            return np.array([[f(x) if x is not None else 0 for x in row] for row in o], dtype=dtype)

        self.ok = grid(lambda x: True)
        self.failed = grid(lambda x: x.failed)
        self.healthy = self.ok & ~self.failed
        self.detected = grid(lambda x: x.detected)
        self.triggered = grid(lambda x: x.triggered)
        self.alarms = grid(lambda x: x.neg_alarms, float)
        self.steps = grid(lambda x: x.neg_steps, float)

    def keys(self, mask: np.ndarray, budget: float, default: int | None) -> list[tuple]:
        """Per point: (fits the budget, recall, -false alarms per 1k, separation, is the default)."""
        f, h, ok = self.failed & mask, self.healthy & mask, self.ok & mask
        steps, alarms = (self.steps * ok).sum(1), (self.alarms * ok).sum(1)
        fa = np.divide(1000 * alarms, steps, out=np.zeros_like(steps), where=steps > 0)
        nf, nh = f.sum(1), h.sum(1)
        recall = np.divide((self.detected & f).sum(1), nf, out=np.zeros(len(nf)), where=nf > 0)
        tf = np.divide((self.triggered & f).sum(1), nf, out=np.zeros(len(nf)), where=nf > 0)
        th = np.divide((self.triggered & h).sum(1), nh, out=np.zeros(len(nh)), where=nh > 0)
        sep = np.where((nf > 0) & (nh > 0), tf - th, -1.0)
        return [(fa[i] <= budget, recall[i], -fa[i], sep[i], i == default) for i in range(len(fa))]


def pick(counts: _Counts, mask: np.ndarray, budget: float, default: int | None = None) -> int:
    """Index of the point picked on the runs in `mask` (see the module docstring); on a tie the
    default; when nothing fits the budget, the quietest point."""
    keys = counts.keys(mask, budget, default)
    if not any(k[0] for k in keys):
        return max(range(len(keys)), key=lambda i: (keys[i][2], keys[i][1], keys[i][4]))
    return max(range(len(keys)), key=lambda i: keys[i])


def tune_rule(
    rule_points: list[tuple[Rule, dict[str, Outcome], bool]],
    tuning_runs: list[str],
    holdout_runs: list[str],
    folds: list[list[str]],
    budget: float,
    groups: list[list[str]] | None = None,
    fams: Families | None = None,
) -> tuple[dict, list[dict]]:
    """One rule's tuning report and its rows per held-out family; rule_points are (point,
    outcomes per run, is the default); `groups` of related runs stay together when a family
    is held out."""
    outs = [o for _, o, _ in rule_points]
    default = next((i for i, (_, _, d) in enumerate(rule_points) if d), None)
    counts = _Counts(outs, tuning_runs)
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
    fam_rows = _family_picks(
        rule_points, counts, tuning_runs, groups or [[r] for r in tuning_runs], fams or {}, budget, default
    )
    row.update(worst(fam_rows, {k: LOFO_KEYS[k] for k in _KEYS}))
    return {k: row.get(k) for k in TUNE_FIELDS}, fam_rows


def _family_picks(
    rule_points: list[tuple[Rule, dict[str, Outcome], bool]],
    counts: _Counts,
    tuning_runs: list[str],
    groups: list[list[str]],
    fams: Families,
    budget: float,
    default: int | None,
) -> list[dict]:
    """Per family of each attribute with more than one: the pick on the other families' runs,
    scored on the family's (see the module docstring)."""
    group_of = {r: g for g in groups for r in g}
    tuning = set(tuning_runs)
    rows = []
    for attr, fam in fams.items():
        if len(fam) < 2:
            continue
        for value, runs in fam.items():
            members = [r for r in runs if r in tuning]
            held = {x for r in members for x in group_of.get(r, [r])}
            if not members or held >= tuning:
                continue
            i = pick(counts, ~np.isin(tuning_runs, sorted(held)), budget, default)
            point, outs, _ = rule_points[i]
            if not any(r in outs for r in members):
                continue  # the rule could evaluate none of the family's runs
            m = _scores(outs, members)
            rows.append(
                {
                    "rule": point.id,
                    "attribute": attr,
                    "family": value,
                    "runs": sum(r in outs for r in members),
                    "evaluable_failed": m["evaluable_failed"],
                    "evaluable_healthy": m["evaluable_healthy"],
                    "picked_params": point.params_json,
                    **{k: m[k] for k in _KEYS},
                }
            )
    return rows
