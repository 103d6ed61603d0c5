"""Streaks: runs of consecutive true steps of a condition become alert intervals, with the
state a live watch carries between polls (`STREAK_STATE`); a replay starts from `zero_state`.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from detectors.rules import Rule
from detectors.series import SeriesData, group_starts
from workbench.jit import njit
from workbench.store import schema

ALERT_SCHEMA = schema.ALERT


# Per unit, what the streak pass carries from one stretch of rows to the next (a live watch
# evaluates a run a few new steps at a time): the current run of true steps (length, first
# step), the latest alert's end, and the rows evaluated so far (for warm-up). A replay starts
# every unit from zeros, so both compute the same alerts by the same code.
STREAK_STATE = {
    "run": pl.Int64,
    "first": pl.Int64,
    "has_last": pl.Int64,
    "last_end": pl.Int64,
    "seen": pl.Int64,
}


@njit(cache=True, nogil=True)
def _streak_alerts(starts, steps, cond, warmup, k, cooldown, run, first, has_last, last_end, seen):
    """One pass per group: runs of true steps become alerts once they last k steps; a firing
    within `cooldown` steps of the previous alert's end extends that alert instead.
    The state arrays (one entry per group, see STREAK_STATE) are updated in place. Returns, per
    alert touched: group, start step, the row where it fired and its end step; a fired row of -1
    is the group's alert from before these rows, extended."""
    cap = 64
    a_group = np.empty(cap, np.int64)
    a_start = np.empty(cap, np.int64)
    a_fired = np.empty(cap, np.int64)
    a_end = np.empty(cap, np.int64)
    n = 0
    for g in range(starts.shape[0] - 1):
        r = run[g]
        f = first[g]
        le = last_end[g]
        latest = -1 if has_last[g] > 0 else -2  # -1: the alert from before these rows; >= 0: a new one
        for i in range(starts[g], starts[g + 1]):
            if cond[i] and seen[g] >= warmup:
                if r == 0:
                    f = steps[i]
                r += 1
                new = r == k and not (latest != -2 and steps[i] - le <= cooldown)
                extend_carried = r >= k and latest == -1 and not new
                if new or (extend_carried and (n == 0 or a_group[n - 1] != g or a_fired[n - 1] != -1)):
                    if n == cap:
                        cap *= 2
                        a_group = np.concatenate((a_group, np.empty(cap - n, np.int64)))
                        a_start = np.concatenate((a_start, np.empty(cap - n, np.int64)))
                        a_fired = np.concatenate((a_fired, np.empty(cap - n, np.int64)))
                        a_end = np.concatenate((a_end, np.empty(cap - n, np.int64)))
                    a_group[n] = g
                    a_start[n] = f if new else -1
                    a_fired[n] = i if new else -1
                    n += 1
                    if new:
                        latest = n - 1
                if r >= k:
                    a_end[latest if latest >= 0 else n - 1] = steps[i]
                    le = steps[i]
            else:
                r = 0
            seen[g] += 1
        run[g] = r
        first[g] = f
        last_end[g] = le
        has_last[g] = 1 if latest != -2 else 0
    return a_group[:n], a_start[:n], a_fired[:n], a_end[:n]


def zero_state(units: int) -> dict[str, np.ndarray]:
    return {c: np.zeros(units, np.int64) for c in STREAK_STATE}


def stream_alerts(
    rule: Rule, frame: pl.DataFrame, texts: list[str], data: SeriesData, state: dict[str, np.ndarray]
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Streaks of true steps -> alert intervals (frame sorted by rid, key, step), continuing
    from `state` (one entry per unit of the frame, in order; updated in place).

    Returns the new alerts, and the alerts from before that these rows extended (rid, key,
    step_end)."""
    leaf_cols = [c for c in frame.columns if c.startswith("_l")]
    extended = pl.DataFrame(schema={"rid": pl.Int32, "key": pl.Int32, "step_end": pl.Int64})
    if frame.is_empty():
        return pl.DataFrame(schema=ALERT_SCHEMA), extended
    starts = group_starts(frame["rid"], frame["key"])
    steps = frame["step"].to_numpy()
    group, start, fired, end = _streak_alerts(
        starts,
        steps,
        frame["cond"].to_numpy(),
        int(rule.warmup),
        int(rule.for_steps),
        int(rule.cooldown),
        *(state[c] for c in STREAK_STATE),
    )
    if not len(group):
        return pl.DataFrame(schema=ALERT_SCHEMA), extended
    first_rows = starts[:-1][group]
    carried = fired < 0
    if carried.any():
        extended = pl.DataFrame(
            {
                "rid": frame["rid"].gather(first_rows[carried]),
                "key": frame["key"].gather(first_rows[carried]),
                "step_end": end[carried],
            }
        )
    fired, start, end, first_rows = fired[~carried], start[~carried], end[~carried], first_rows[~carried]
    merged = pl.DataFrame(
        {
            "rid": frame["rid"].gather(first_rows),
            "key": frame["key"].gather(first_rows),
            "step_start": start,
            "step_fired": steps[fired],
            "step_end": end,
            **{c: frame[c].gather(fired) for c in leaf_cols},
        }
    )
    if merged.is_empty():
        return pl.DataFrame(schema=ALERT_SCHEMA), extended
    msg = pl.concat_str(
        [pl.lit(f"{rule.id}: ")]
        + [
            e
            for i, c in enumerate(leaf_cols)
            for e in (
                (pl.lit(", ") if i else pl.lit("")),
                pl.lit(f"{texts[i]}="),
                pl.col(c).round_sig_figs(4).cast(pl.String).fill_null("null"),
            )
        ]
    )
    alerts = merged.select(
        run_id=pl.col("rid").replace_strict(data.run_name, return_dtype=pl.String),
        rule=pl.lit(rule.id),
        tag=pl.col("key").replace_strict({-1: "", **data.tag_name}, return_dtype=pl.String),
        step_start="step_start",
        step_fired="step_fired",
        step_end="step_end",
        value=pl.col(leaf_cols[0]) if leaf_cols else pl.lit(None, pl.Float64),
        message=msg,
        params=pl.lit(rule.params_json),
        severity=pl.lit(rule.severity),
    ).cast(ALERT_SCHEMA)  # type: ignore[arg-type]  # polars: cast's mapping keys are typed str | Selector | DataType, which no dict[str, ...] fits
    return alerts, extended


def alerts_from(rule: Rule, frame: pl.DataFrame, texts: list[str], data: SeriesData) -> pl.DataFrame:
    """Streaks of true steps -> alert intervals (frame sorted by rid, key, step)."""
    units = len(group_starts(frame["rid"], frame["key"])) - 1
    return stream_alerts(rule, frame, texts, data, zero_state(units))[0]
