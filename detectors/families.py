"""Leave one family out: how a score holds on runs unlike the ones it was measured or tuned on.

A family is one value of one attribute of the runs' labels (labels.toml: `trainer = "hf"`,
`optimizer = "sgd"`, `size = "small"`, ...); a run without the attribute is in the family
`(unset)` of it (an empty value is no value). Attributes are those asked for (`--family`),
else every one the labels carry that splits the runs into families: carried by at least half
of the runs (a detail of some runs, such as where a spike was injected, is not a family), with
at least two values and at most one per two runs (a run's duration is not a family).
- A rule at fixed parameters was fitted to no run, so holding a family out is scoring it on that
  family alone: `family_rows` gives its score on each family (the `families` table); `worst`
  takes, per score, the worst family's figure (lowest recall, precision, trigger rate on failed
  runs, separation and lead; highest trigger rate on healthy runs and false alarms), over every
  family of every attribute that holds at least MIN_FAMILY_RUNS runs the score counts (failed
  runs for recall, healthy runs for their trigger rate, ...), named `attribute=value`: the LOFO
  figure beside the in-sample one. Smaller families are in the table, not in the worst.
- With --tune, parameters are picked on all families but one and scored on the held-out one,
  for each family (`detectors.tuning.lofo`), and the worst family is reported the same way.
A family too small for a score (no failed run for recall, no healthy run for false alarms)
gives none for it.
"""

from __future__ import annotations

from detectors.scoring import LOFO_KEYS, Outcome, RunInfo, json_num, metrics
from detectors.series import ReplayError

UNSET = "(unset)"
MIN_FAMILY_RUNS = 3  # a family's score counts towards the worst with at least this many runs behind it
# the runs behind each score: failed, healthy, or both (every run of the family)
_BEHIND = {
    "trigger_rate_failed": ("evaluable_failed",),
    "recall": ("evaluable_failed",),
    "lead_time_median": ("evaluable_failed",),
    "trigger_rate_healthy": ("evaluable_healthy",),
    "false_alarms_per_1k_healthy": ("evaluable_healthy",),
    "separation": ("evaluable_failed", "evaluable_healthy"),
}
FAMILY_FIELDS = [
    "rule",
    "params",
    "attribute",
    "family",
    "runs",
    "evaluable_failed",
    "evaluable_healthy",
    *LOFO_KEYS,
    "first_trigger_mean",
    "first_trigger_std",
]
Families = dict[str, dict[str, list[str]]]  # attribute -> family (value) -> run ids


def attributes(runs: dict[str, RunInfo], wanted: list[str] | None = None) -> list[str]:
    """The attributes to hold families out by: `wanted`, else every one the labels carry that
    splits the runs into families (see the module docstring)."""
    present = sorted({k for r in runs.values() for k in r.attrs})
    if not wanted:
        values = {a: {r.attrs.get(a, UNSET) for r in runs.values()} for a in present}
        carried = {a: sum(a in r.attrs for r in runs.values()) for a in present}
        return [a for a in present if 2 * carried[a] >= len(runs) and 2 <= len(values[a]) <= len(runs) // 2]
    unknown = [a for a in wanted if a not in present]
    if unknown:
        raise ReplayError(
            f"no labelled run has the attribute {', '.join(unknown)}; "
            f"attributes in the labels: {', '.join(present) or 'none (add e.g. trainer = ... to labels.toml)'}"
        )
    return list(wanted)


def families(runs: dict[str, RunInfo], attrs: list[str]) -> Families:
    """Per attribute, its families and their runs (sorted)."""
    out: Families = {}
    for a in attrs:
        fam: dict[str, list[str]] = {}
        for run in sorted(runs):
            fam.setdefault(runs[run].attrs.get(a, UNSET), []).append(run)
        out[a] = dict(sorted(fam.items()))
    return out


def family_rows(
    rule_id: str, params: str, outs: dict[str, Outcome], fams: Families, among: set[str] | None = None
) -> list[dict]:
    """The score of one rule (outcomes per run) on each family alone; `among`: only these runs
    (e.g. one failure kind and the healthy runs)."""
    rows = []
    for attr, fam in fams.items():
        for value, members in fam.items():
            o = [outs[r] for r in members if r in outs and (among is None or r in among)]
            if not o:
                continue
            m = metrics(o)
            rows.append(
                {
                    "rule": rule_id,
                    "params": params,
                    "attribute": attr,
                    "family": value,
                    "runs": len(o),
                    **{k: m.get(k) for k in FAMILY_FIELDS[5:]},
                }
            )
    return rows


def worst(rows: list[dict], keys: dict[str, bool] = LOFO_KEYS) -> dict:
    """Per score, the worst family's figure (`lofo_<score>`) and which (`lofo_<score>_family`,
    `attribute=value`), among families with MIN_FAMILY_RUNS runs behind the score; None where
    none has. Ties: the first attribute, family."""
    out: dict = {}
    for key, higher_is_better in keys.items():
        have = [
            (r[key], f"{r['attribute']}={r['family']}")
            for r in rows
            if r.get(key) is not None and _behind(r, key) >= MIN_FAMILY_RUNS
        ]
        pick = (min if higher_is_better else max)(have, key=lambda c: c[0]) if have else (None, None)
        out[f"lofo_{key}"], out[f"lofo_{key}_family"] = json_num(pick[0]), pick[1]
    return out


def _behind(row: dict, key: str) -> int:
    """How many of the family's runs a score counts (every run when the row does not say)."""
    counts = [row.get(c) for c in _BEHIND.get(key, ())]
    if not counts or any(c is None for c in counts):
        return row.get("runs") or 0
    return min(c for c in counts if c is not None)
