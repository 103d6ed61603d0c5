"""Leaves: window functions of one series (delta, pct_change, mean, std, min, max, median, mad,
slope, ema, max_first) computed on its own logged points, the peer function (peer_z) computed
over a run's group, and the numba kernels behind them.

Every leaf value is a function of a bounded stretch of its series' past points (the window),
or of a small state carried from the points before (ema, max_first: their seeds). So a live watch
that keeps the last points of each series and those states computes the very numbers a
replay over the whole run computes (detectors.live); the window kernels therefore recompute
each window instead of sliding a running sum whose rounding depends on all earlier points.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from detectors.series import UNIT, ReplayError, group_starts
from workbench.jit import njit

WINDOW_STATS = {"mean": 0, "std": 1, "min": 2, "max": 3}
ROBUST = {"median": False, "mad": True}  # window medians: of the values, of their deviations
SEEDED = ("ema", "max_first")  # leaves carrying state from every earlier point


def leaf_values(fn: str, n: float, s: pl.DataFrame, seed: pl.DataFrame | None = None) -> pl.Series:
    """One leaf over a series frame (rid, key, step, value sorted); `seed` (rid, key, s0, s1) is
    the state of a seeded leaf before each unit's first row (none: the unit starts here)."""
    v = pl.col("value")
    k = int(n)
    if fn == "delta":
        return s.select(v - v.shift(k).over(UNIT)).to_series()
    if fn == "pct_change":
        return s.select(v / v.shift(k).over(UNIT) - 1).to_series()
    if fn == "ema" and not 0 <= n < 1:
        raise ReplayError(f"ema(x, w): the smoothing weight must be in [0, 1), got {n}")
    if fn not in WINDOW_STATS and fn not in SEEDED and fn not in ROBUST and fn != "slope":
        raise ReplayError(f"{fn}() needs a metric as its first argument")
    starts = group_starts(s["rid"], s["key"])
    x = s["value"].to_numpy().astype(np.float64)
    if fn == "slope":
        out = _rolling_slope(starts, s["step"].to_numpy().astype(np.float64), x, k)
        return pl.Series(out)  # NaN (not null) before the first full window, as always
    if fn in WINDOW_STATS:
        out, valid = _window_stat(starts, x, k, WINDOW_STATS[fn])
    elif fn in ROBUST:
        out, valid = _window_median(starts, x, k, ROBUST[fn])
    else:
        s0, s1 = _seed_arrays(s, seed)
        kernel = _ema if fn == "ema" else _max_first
        out, valid = kernel(starts, x, float(n), s0, s1)[:2]
    return pl.Series(out).set(pl.Series(~valid), None)


def _seed_arrays(s: pl.DataFrame, seed: pl.DataFrame | None) -> tuple[np.ndarray, np.ndarray]:
    """Per unit of `s` (in order) the seed state (s0, s1); zeros where none was given."""
    units = s.select(UNIT).unique(maintain_order=True)
    if seed is not None and seed.height:
        units = units.join(seed, on=UNIT, how="left", maintain_order="left")
    else:
        units = units.with_columns(s0=pl.lit(None, pl.Float64), s1=pl.lit(None, pl.Float64))
    return (
        units["s0"].fill_null(0.0).to_numpy().astype(np.float64),
        units["s1"].fill_null(0.0).to_numpy().astype(np.float64),
    )


def fold_seed(fn: str, n: float, s: pl.DataFrame, seed: pl.DataFrame | None) -> pl.DataFrame:
    """The seed (rid, key, s0, s1) after the points of `s`: what a seeded leaf carries past them."""
    s0, s1 = _seed_arrays(s, seed)
    kernel = _ema if fn == "ema" else _max_first
    _, _, e0, e1 = kernel(
        group_starts(s["rid"], s["key"]), s["value"].to_numpy().astype(np.float64), float(n), s0, s1
    )
    return s.select(UNIT).unique(maintain_order=True).with_columns(s0=pl.Series(e0), s1=pl.Series(e1))


@njit(cache=True, nogil=True)
def _mean_std4(x, lo, k, std):
    """Mean (or std, ddof 1) of the windows x[lo:lo+k] ... x[lo+3:lo+3+k]: four sums side by
    side, each added in the order of one window alone (so bit for bit the same), which the
    processor overlaps."""
    m0 = m1 = m2 = m3 = 0.0
    for j in range(lo, lo + k):
        m0 += x[j]
        m1 += x[j + 1]
        m2 += x[j + 2]
        m3 += x[j + 3]
    m0 /= k
    m1 /= k
    m2 /= k
    m3 /= k
    if not std:
        return m0, m1, m2, m3
    s0 = s1 = s2 = s3 = 0.0
    for j in range(lo, lo + k):
        s0 += (x[j] - m0) ** 2
        s1 += (x[j + 1] - m1) ** 2
        s2 += (x[j + 2] - m2) ** 2
        s3 += (x[j + 3] - m3) ** 2
    return np.sqrt(s0 / (k - 1)), np.sqrt(s1 / (k - 1)), np.sqrt(s2 / (k - 1)), np.sqrt(s3 / (k - 1))


@njit(cache=True, nogil=True)
def _window_stat(starts, x, k, stat):
    """mean, std (ddof 1), min or max of the k values before each point, per group; a window
    holding NaN gives NaN; null (valid False) until k values came before."""
    out = np.full(x.shape[0], np.nan)
    valid = np.zeros(x.shape[0], np.bool_)
    for g in range(starts.shape[0] - 1):
        if stat >= 2:
            _window_extreme(x, starts[g], starts[g + 1], k, stat == 3, out, valid)
            continue
        rest = starts[g] + k
        if stat == 0 or (stat == 1 and k > 1):  # four points at a time, the rest one by one below
            while rest + 4 <= starts[g + 1]:
                out[rest], out[rest + 1], out[rest + 2], out[rest + 3] = _mean_std4(x, rest - k, k, stat == 1)
                valid[rest : rest + 4] = True
                rest += 4
        for i in range(rest, starts[g + 1]):
            m = 0.0
            for j in range(i - k, i):
                m += x[j]
            m /= k
            if stat == 0:
                out[i] = m
            elif k > 1:
                ss = 0.0
                for j in range(i - k, i):
                    ss += (x[j] - m) ** 2
                out[i] = np.sqrt(ss / (k - 1))
            valid[i] = stat == 0 or k > 1
    return out, valid


@njit(cache=True, nogil=True)
def _window_median(starts, x, k, mad):
    """Median (or median absolute deviation from the median) of the k values before each point,
    per group; a window holding NaN gives NaN; null (valid False) until k values came before."""
    out = np.full(x.shape[0], np.nan)
    valid = np.zeros(x.shape[0], np.bool_)
    for g in range(starts.shape[0] - 1):
        for i in range(starts[g] + k, starts[g + 1]):
            w = x[i - k : i]
            valid[i] = True
            if np.isnan(w).any():
                continue
            m = np.median(w)
            out[i] = np.median(np.abs(w - m)) if mad else m
    return out, valid


def peer_z(s: pl.DataFrame, group: pl.DataFrame, min_peers: int = 3) -> pl.Series:
    """Per point of `s` (rid, key, step, value, sorted), the z-score of its value against the
    other runs of its group at that step: each peer's latest finite value at or before the step
    (a peer counts from its first logged step to its last), their mean and sample standard
    deviation; null with fewer than `min_peers` peers or no spread. `group` maps rid -> group."""
    v = s.select("rid", "key", "step", x=finite_or_null_value()).with_row_index("_i")
    v = v.join(group, on="rid", how="left")
    steps = v.select("group", "step").unique()
    spans = v.group_by("rid", "key", "group").agg(lo=pl.col("step").min(), hi=pl.col("step").max())
    # every (peer, step of its group) inside the peer's logged span, with its latest value
    grid = spans.join(steps, on="group").filter(pl.col("step").is_between("lo", "hi")).sort("step")
    latest = grid.join_asof(
        v.drop_nulls("x").select("rid", "key", "step", "x").sort("step"),
        on="step",
        by=["rid", "key"],
        strategy="backward",
        check_sortedness=False,
    ).drop_nulls("x")
    # peers in one order, whatever order the joins left them in: a float sum depends on it
    latest = latest.sort("group", "step", "rid", "key")
    sums = latest.group_by("group", "step", maintain_order=True).agg(
        n=pl.len(), s1=pl.col("x").sum(), s2=(pl.col("x") ** 2).sum()
    )
    me = latest.select("rid", "key", "step", own=pl.col("x"))
    j = (
        v.join(sums, on=["group", "step"], how="left")
        .join(me, on=["rid", "key", "step"], how="left")
        .sort("_i")
    )
    own = pl.col("own").fill_null(0.0)
    n = pl.col("n") - pl.col("own").is_not_null().cast(pl.Int64)  # the run itself is no peer
    s1 = pl.col("s1") - own
    s2 = pl.col("s2") - own**2
    mean = s1 / n
    var = (s2 - s1 * mean) / (n - 1)
    z = (pl.col("x") - mean) / var.sqrt()
    ok = (n >= min_peers) & (var > 0)
    return j.select(pl.when(ok).then(z)).to_series()


def finite_or_null_value() -> pl.Expr:
    v = pl.col("value")
    return pl.when(v.is_finite()).then(v)


@njit(cache=True, nogil=True)
def _window_extreme(x, lo, hi, k, is_max, out, valid):
    """min (max) of the k values before each point of x[lo:hi] by a monotone queue of indices:
    exact, so the same as scanning each window (the earliest of equal extremes; NaN when the
    window holds one)."""
    q = np.empty(hi - lo, np.int64)
    h = t = 0
    nans = 0
    for j in range(lo, hi - 1):  # x[j] enters the window of point j + 1: x[j + 1 - k .. j]
        if np.isnan(x[j]):
            nans += 1
        else:
            while t > h and ((x[q[t - 1]] < x[j]) if is_max else (x[q[t - 1]] > x[j])):
                t -= 1
            q[t] = j
            t += 1
        if j - k >= lo and np.isnan(x[j - k]):
            nans -= 1
        while h < t and q[h] <= j - k:
            h += 1
        if j + 1 >= lo + k:
            valid[j + 1] = True
            out[j + 1] = np.nan if nans > 0 else x[q[h]]


@njit(cache=True, nogil=True)
def _ema(starts, x, w, s0, s1):
    """EMA with weight w of the values before each point (e = w·e + (1−w)·x, starting at the first
    value; NaN stays); per group seeded with (e, has) = (s0, s1). Returns out, valid, final seeds."""
    out = np.full(x.shape[0], np.nan)
    valid = np.zeros(x.shape[0], np.bool_)
    e0 = s0.copy()
    e1 = s1.copy()
    for g in range(starts.shape[0] - 1):
        e = e0[g]
        has = e1[g] > 0
        for i in range(starts[g], starts[g + 1]):
            if has:
                out[i] = e
                valid[i] = True
                e = w * e + (1.0 - w) * x[i]
            else:
                e = x[i]
                has = True
        e0[g] = e
        e1[g] = 1.0 if has else 0.0
    return out, valid, e0, e1


@njit(cache=True, nogil=True)
def _max_first(starts, x, k, s0, s1):
    """Megatron's baseline: the maximum of the first k finite values, known once k finite values
    came before; per group seeded with (running max, finite values seen) = (s0, s1)."""
    out = np.full(x.shape[0], np.nan)
    valid = np.zeros(x.shape[0], np.bool_)
    e0 = s0.copy()
    e1 = s1.copy()
    for g in range(starts.shape[0] - 1):
        mx = e0[g]
        seen = e1[g]
        for i in range(starts[g], starts[g + 1]):
            if seen >= k:
                out[i] = mx
                valid[i] = True
            elif np.isfinite(x[i]):
                mx = x[i] if seen == 0 or x[i] > mx else mx
                seen += 1
        e0[g] = mx
        e1[g] = seen
    return out, valid, e0, e1


@njit(cache=True, nogil=True)
def _rolling_slope(starts, x, y, k):
    """Least-squares slope of the last k points (this one included), per group; two passes per
    window, so large step numbers lose no precision."""
    out = np.full(y.shape[0], np.nan)
    for gi in range(starts.shape[0] - 1):
        for i in range(starts[gi] + k - 1, starts[gi + 1]):
            lo = i - k + 1
            mx = 0.0
            my = 0.0
            for j in range(lo, i + 1):
                mx += x[j]
                my += y[j]
            mx /= k
            my /= k
            sxy = 0.0
            sxx = 0.0
            for j in range(lo, i + 1):
                sxy += (x[j] - mx) * (y[j] - my)
                sxx += (x[j] - mx) ** 2
            out[i] = sxy / sxx if sxx > 0 else np.nan
    return out
