"""Convergence predictors, scored against what each run really did.

Ground truth: a run's plateau onset is the first step s after which the EMA of the loss
(smoothing weight 0.9) improves by less than EPS (0.5 %) over the next W (100) steps; a run whose
loss turns NaN/Inf has none.
- `slope_rule` (the guides): |slope(loss, 20)| < 1e-4 for 10 steps and slope(grad_norm, 20) >
  -5e-4 calls "plateau within 200 steps". A call at t came true when the onset is at or before
  t + 200; timing error = (t + 200) - onset.
- `reduce_lr_on_plateau` (baseline): the built-in Plateau detector on the train loss (patience 50).
- `curve_fit`: at 10/25/50 % of each run, fits a + b·t^-c and a + b·e^(-c·t) to the loss so far
  (scipy), keeps the better fit and forecasts the final loss (mean of the last 5 % of the run);
  the baseline forecasts the mean of the last 5 % of the history. Errors are mean absolute.
"""

from __future__ import annotations

import warnings

import numpy as np
import polars as pl

from detectors.builtins import Plateau
from detectors.rules import Rule
from workbench.store import Store

EMA_WEIGHT, EPS, W, HORIZON = 0.9, 0.005, 100, 200
FRACTIONS = (10, 25, 50)
PREDICTOR_FIELDS = [
    "predictor",
    "calls",
    "calls_true",
    "precision",
    "timing_error_median",
    *[f"final_loss_error_at_{f}" for f in FRACTIONS],
    *[f"baseline_error_at_{f}" for f in FRACTIONS],
    "runs",
]
# the "plateau within HORIZON" callers, replayed in the backtest's own pass over the runs
PREDICTOR_RULES = {
    "slope_rule": Rule(
        "slope_rule", "abs(slope(loss, 20)) < 1e-4 and slope(grad_norm, 20) > -5e-4", for_steps=10
    ),
    "reduce_lr_on_plateau": Plateau(metric="loss", patience=50).rule(),
}


def loss_series(store: Store, run_ids: list[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per run, the steps and values of its loss (the tag with the most points if several)."""
    df = (
        store.connect()
        .sql("SELECT run_id, tag, step, value FROM scalars WHERE metric = 'loss' ORDER BY run_id, tag, step")
        .pl()
    )
    df = df.filter(pl.col("run_id").is_in(run_ids))
    best = (
        df.group_by("run_id", "tag")
        .agg(n=pl.len())
        .sort("run_id", pl.col("tag") != "loss", -pl.col("n").cast(pl.Int64))
        .group_by("run_id", maintain_order=True)
        .first()
    )
    df = df.join(best.select("run_id", "tag"), on=["run_id", "tag"])
    return {
        run: (g["step"].to_numpy(), g["value"].to_numpy())
        for (run,), g in df.group_by("run_id", maintain_order=True)
    }


def ema(values: np.ndarray, weight: float = EMA_WEIGHT) -> np.ndarray:
    out, last = np.empty(len(values)), values[0]
    for i, v in enumerate(values):
        last = weight * last + (1 - weight) * v
        out[i] = last
    return out


def plateau_onset(steps: np.ndarray, values: np.ndarray) -> int | None:
    if len(values) < 3 or not np.isfinite(values).all():
        return None
    e = ema(values)
    for i in range(len(e)):
        j = np.searchsorted(steps, steps[i] + W)
        if j >= len(e):
            return None
        if (e[i] - e[j]) / abs(e[i]) < EPS:
            return int(steps[i])
    return None


def _calls(replayed, run_ids: list[str]) -> dict[str, list[int]]:
    """Call steps per run from a rule's replay (a rule absent from every run makes none)."""
    out: dict[str, list[int]] = {}
    for run, step in replayed.alerts.select("run_id", "step_fired").iter_rows():
        if run in run_ids:
            out.setdefault(run, []).append(step)
    return out


def _score_calls(
    name: str, calls: dict[str, list[int]], onsets: dict[str, int | None], evaluated: list[str]
) -> dict:
    total = true = 0
    timing = []
    for run in evaluated:
        for t in calls.get(run, []):
            total += 1
            p = onsets.get(run)
            if p is not None and p <= t + HORIZON:
                true += 1
                timing.append(t + HORIZON - p)
    return {
        "predictor": name,
        "calls": total,
        "calls_true": true,
        "precision": true / total if total else None,
        "timing_error_median": float(np.median(timing)) if timing else None,
        "runs": len(evaluated),
    }


def _fit_forecast(t: np.ndarray, y: np.ndarray, t_final: float) -> float | None:
    from scipy.optimize import curve_fit

    x = (t - t[0] + 1.0) / max(1.0, t_final - t[0] + 1.0)  # scaled time: better conditioned fits
    xf = 1.0
    best, best_sse = None, np.inf
    # a loss falls towards a floor >= 0: a, b >= 0 keep every forecast between 0 and the fit's current level
    lo = max(float(np.min(y)), 0.0)
    families = [
        (
            lambda x, a, b, c: a + b * np.power(x, -c),
            [0.9 * lo, max(y[0] - lo, 1e-3), 0.5],
            ([0, 0, 1e-3], [np.inf, np.inf, 5]),
        ),
        (
            lambda x, a, b, c: a + b * np.exp(-c * x),
            [0.9 * lo, max(y[0] - lo, 1e-3), 5.0],
            ([0, 0, 1e-3], [np.inf, np.inf, 1e3]),
        ),
    ]
    for f, p0, bounds in families:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                p, _ = curve_fit(f, x, y, p0=p0, bounds=bounds, maxfev=5000)
        except (RuntimeError, ValueError):
            continue
        sse = float(np.sum((f(x, *p) - y) ** 2))
        pred = float(f(xf, *p))
        if sse < best_sse and np.isfinite(pred):
            best, best_sse = pred, sse
    return best


def curve_fit_scores(series: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict:
    errs = {f: [] for f in FRACTIONS}
    base = {f: [] for f in FRACTIONS}
    used = 0
    for steps, vals in series.values():
        if len(vals) < 40 or not np.isfinite(vals).all():
            continue
        used += 1
        tail = max(1, len(vals) // 20)
        actual = float(np.mean(vals[-tail:]))
        for f in FRACTIONS:
            n = max(10, len(vals) * f // 100)
            h_t, h_y = steps[:n].astype(float), vals[:n]
            pred = _fit_forecast(h_t, h_y, float(steps[-1]))
            last = float(np.mean(h_y[-max(1, n // 20) :]))
            errs[f].append(abs((pred if pred is not None else last) - actual))
            base[f].append(abs(last - actual))
    out = {
        "predictor": "curve_fit",
        "calls": None,
        "calls_true": None,
        "precision": None,
        "timing_error_median": None,
        "runs": used,
    }
    for f in FRACTIONS:
        out[f"final_loss_error_at_{f}"] = float(np.mean(errs[f])) if errs[f] else None
        out[f"baseline_error_at_{f}"] = float(np.mean(base[f])) if base[f] else None
    return out


def evaluate_predictors(store: Store, runs: dict, replayed: dict) -> list[dict]:
    """The three predictor objects, every field present (null where it does not apply);
    `replayed` holds the replays of PREDICTOR_RULES over the same runs."""
    run_ids = sorted(runs)
    series = loss_series(store, run_ids)
    onsets = {run: plateau_onset(*series[run]) for run in series}
    evaluated = sorted(series)
    out = [
        *[_score_calls(name, _calls(replayed[name], run_ids), onsets, evaluated) for name in PREDICTOR_RULES],
        curve_fit_scores(series),
    ]
    return [{k: _clean(o.get(k)) for k in PREDICTOR_FIELDS} for o in out]


def _clean(x):
    if isinstance(x, float) and not np.isfinite(x):
        return None
    return x
