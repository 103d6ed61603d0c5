"""Convergence predictors, scored against what each run really did, beside naive baselines.

Ground truth (the plateau label): a run's plateau onset is the first step s after which the EMA
of its curve improves by less than EPS (0.5 %) relative over the next W (100) steps. The curve
is the eval loss where the run logs at least MIN_EVAL_POINTS finite eval points (EMA weight
0.5 over its points), else the train loss (weight 0.9); a curve that turns NaN/Inf has none.
Each predictor row says which (`criterion`, `plateaus_from_eval`).
- `slope_rule` (the guides): |slope(loss, 20)| < 1e-4 for 10 steps and slope(grad_norm, 20) >
  -5e-4 calls "plateau within 200 steps". A call at t came true when the onset is at or before
  t + 200; timing error = (t + 200) - onset; precision = true calls / calls; recall = runs with
  an onset that got a true call; false_calls_per_1k = calls per 1k logged loss steps of the runs
  that never plateau.
- `reduce_lr_on_plateau` (baseline): the built-in Plateau detector (patience 50).
- `curve_fit`: fits a + b·t^-c and a + b·e^(-c·t) (least squares, the better of the two) to the
  loss so far. At 10/25/50 % of each run it forecasts the final loss (mean of the last 5 % of the
  run; errors are relative, |forecast − final| / |final|, and the median over runs, so that a
  run that diverged to a loss of 1e5 does not drown the others) and the plateau step (the
  ground-truth definition applied to the fitted curve; error in steps against the onset). At CHECKPOINTS points of each run it
  calls "plateau within 200 steps" when the forecast plateau step is at most 200 steps ahead,
  scored like the slope rule.
- naive baselines: `always` calls "plateau within 200 steps" at each of the CHECKPOINTS points
  of every run (its precision is what calling blindly earns); the final loss forecast as the
  last value (mean of the last 5 % of the history, `baseline_error_at_*`) and as the EMA of the
  history (weight 0.9, `ema_error_at_*`). `verdict` says in words whether a predictor beats
  them: precision above `always`'s, final-loss error below both naive forecasts' at each cut.
- dynamic evaluation schedule, per predictor: evaluate every EVAL_EVERY steps, STRETCH times as
  far apart while the predictor says the loss has plateaued (its condition holds, or its last
  checkpoint called it). Against evaluating every EVAL_EVERY steps: the evals saved, and the
  knees missed: plateau onsets and labelled failure onsets with no evaluation within EVAL_EVERY
  steps after them (the fixed schedule always has one).
"""

from __future__ import annotations

import duckdb
import numpy as np
import polars as pl

from detectors.builtins.plateaus import Plateau
from detectors.rules import Rule
from workbench.store import reads

EMA_WEIGHT, EPS, W, HORIZON = 0.9, 0.005, 100, 200
EVAL_EMA_WEIGHT, MIN_EVAL_POINTS = 0.5, 8  # eval curves are sparse: a lighter EMA over their points
CRITERION = (
    f"plateau onset: first step after which the EMA of the eval loss (>= {MIN_EVAL_POINTS} eval points; "
    f"weight {EVAL_EMA_WEIGHT}) or else the train loss (weight {EMA_WEIGHT}) improves < {EPS:.1%} over the next {W} steps"
)
FRACTIONS = (10, 25, 50)
CHECKPOINTS = 20  # curve-fit plateau calls per run
EVAL_EVERY, STRETCH = 20, 4
PREDICTOR_FIELDS = [
    "predictor",
    "calls",
    "calls_true",
    "precision",
    "timing_error_median",
    *[f"final_loss_error_at_{f}" for f in FRACTIONS],
    *[f"baseline_error_at_{f}" for f in FRACTIONS],
    "runs",
    "plateaus",
    "recall",
    *[f"plateau_step_error_at_{f}" for f in FRACTIONS],
    "false_calls_per_1k",
    *[f"ema_error_at_{f}" for f in FRACTIONS],
    "plateaus_from_eval",
    "verdict",
    "criterion",
]
SCHEDULE_FIELDS = [
    "predictor",
    "eval_every",
    "stretch",
    "runs",
    "fixed_evals",
    "dynamic_evals",
    "evals_saved",
    "knees",
    "knees_missed",
]
# the "plateau within HORIZON" callers, replayed in the backtest's own pass over the runs
PREDICTOR_RULES = {
    "slope_rule": Rule(
        "slope_rule", "abs(slope(loss, 20)) < 1e-4 and slope(grad_norm, 20) > -5e-4", for_steps=10
    ),
    "reduce_lr_on_plateau": Plateau(metric="loss", patience=50).rule(),
}


def loss_series(
    con: duckdb.DuckDBPyConnection, run_ids: list[str], metric: str = "loss"
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per run, the steps and values of a metric (the tag named like it, else the one with the
    most points), from a connection to the store."""
    df = reads.metric_points(metric).frame(con)
    df = df.filter(pl.col("run_id").is_in(run_ids))
    best = (
        df.group_by("run_id", "tag")
        .agg(n=pl.len())
        .sort("run_id", pl.col("tag") != metric, -pl.col("n").cast(pl.Int64))
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


def plateau_onset(steps: np.ndarray, values: np.ndarray, weight: float = EMA_WEIGHT) -> int | None:
    """The ground truth's onset on one curve (see the module docstring), None when it never
    flattens within the run or turns non-finite."""
    if len(values) < 3 or not np.isfinite(values).all():
        return None
    e = ema(values, weight)
    for i in range(len(e)):
        j = np.searchsorted(steps, steps[i] + W)
        if j >= len(e):
            return None
        if (e[i] - e[j]) / abs(e[i]) < EPS:
            return int(steps[i])
    return None


def _intervals(replayed, run_ids: list[str]) -> dict[str, list[tuple[int, int]]]:
    """Per run, the (call step, last step the condition held) of a rule's replay."""
    out: dict[str, list[tuple[int, int]]] = {}
    for run, fired, end in replayed.alerts.select("run_id", "step_fired", "step_end").iter_rows():
        if run in run_ids:
            out.setdefault(run, []).append((fired, end))
    return out


def plateau_labels(
    train: dict[str, tuple[np.ndarray, np.ndarray]], evals: dict[str, tuple[np.ndarray, np.ndarray]]
) -> tuple[dict[str, int | None], set[str]]:
    """Per run with a train loss, its plateau onset (None: none) and the runs labelled from
    their eval curve (see the module docstring)."""
    onsets, from_eval = {}, set()
    for run, (steps, values) in train.items():
        ev = evals.get(run)
        if ev is not None and int(np.isfinite(ev[1]).sum()) >= MIN_EVAL_POINTS:
            onsets[run] = plateau_onset(*ev, EVAL_EMA_WEIGHT)
            from_eval.add(run)
        else:
            onsets[run] = plateau_onset(steps, values)
    return onsets, from_eval


def _score_calls(
    name: str,
    calls: dict[str, list[int]],
    onsets: dict[str, int | None],
    evaluated: list[str],
    lengths: dict[str, int] | None = None,
) -> dict:
    total = true = 0
    timing = []
    called = set()
    for run in evaluated:
        for t in calls.get(run, []):
            total += 1
            p = onsets.get(run)
            if p is not None and p <= t + HORIZON:
                true += 1
                called.add(run)
                timing.append(t + HORIZON - p)
    plateaus = sum(onsets.get(r) is not None for r in evaluated)
    flat_free = [r for r in evaluated if onsets.get(r) is None]
    steps = sum((lengths or {}).get(r, 0) for r in flat_free)
    false_calls = sum(len(calls.get(r, [])) for r in flat_free)
    return {
        "false_calls_per_1k": 1000 * false_calls / steps if steps else None,
        "predictor": name,
        "calls": total,
        "calls_true": true,
        "precision": true / total if total else None,
        "timing_error_median": float(np.median(timing)) if timing else None,
        "runs": len(evaluated),
        "plateaus": plateaus,
        "recall": len(called) / plateaus if plateaus else None,
    }


# c values of the grid fit: power-law exponents and exponential rates over time scaled to (0, 1]
_POW_C = np.geomspace(1e-3, 5.0, 48)
_EXP_C = np.geomspace(1e-2, 1e3, 48)


def _basis(family: str, x: np.ndarray, cs: np.ndarray) -> np.ndarray:
    return x[None, :] ** -cs[:, None] if family == "pow" else np.exp(-cs[:, None] * x[None, :])


def _best_c(family: str, x: np.ndarray, y: np.ndarray, cs: np.ndarray) -> tuple[float, float, float, float]:
    """(sse, a, b, c) of the best c in `cs`; a and b in closed form (least squares, a, b >= 0)."""
    phi = _basis(family, x, cs)
    pm, ym = phi.mean(1), y.mean()
    var = ((phi - pm[:, None]) ** 2).sum(1)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        b = ((phi - pm[:, None]) * (y - ym)).sum(1) / var
    b = np.where(np.isfinite(b) & (b > 0), b, 0.0)
    a = ym - b * pm
    neg = a < 0  # the floor at 0: refit b alone
    if neg.any():
        b = np.where(neg, (phi * y).sum(1) / np.maximum((phi * phi).sum(1), 1e-300), b)
        a = np.where(neg, 0.0, a)
    sse = ((a[:, None] + b[:, None] * phi - y) ** 2).sum(1)
    i = int(np.nanargmin(sse))
    return float(sse[i]), float(a[i]), float(b[i]), float(cs[i])


def fit_curve(t: np.ndarray, y: np.ndarray, t_end: float):
    """The better least-squares fit of a + b·x^-c and a + b·e^(-c·x) (a, b >= 0: a loss falls
    towards a floor), x = time scaled to (0, 1] by t_end, as a function of steps; None when
    there is too little to fit. c is searched on a grid, then refined twice around the best."""
    if len(y) < 5 or not np.isfinite(y).all():
        return None
    t0, span = float(t[0]), max(1.0, float(t_end) - float(t[0]) + 1.0)

    def scale(steps):
        return (np.asarray(steps, dtype=float) - t0 + 1.0) / span

    x = scale(t)
    best = None
    for family, cs in (("pow", _POW_C), ("exp", _EXP_C)):
        step = cs[1] / cs[0]
        fit = _best_c(family, x, y, cs)
        for _ in range(2):
            step = step ** (1 / 8)
            fit = min(fit, _best_c(family, x, y, fit[3] * step ** np.arange(-8, 9)))
        if best is None or fit[0] < best[0]:
            best = (*fit, family)
    assert best is not None  # both families were fitted
    _, a, b, c, family = best

    def curve(steps):
        xs = scale(steps)
        return a + b * (xs**-c if family == "pow" else np.exp(-c * xs))

    return curve


def _fit_forecast(t: np.ndarray, y: np.ndarray, t_final: float) -> float | None:
    curve = fit_curve(t, y, t_final)
    pred = float(curve(t_final)) if curve is not None else None
    return pred if pred is not None and np.isfinite(pred) else None


def forecast_plateau(curve, t_now: float, step: float) -> int | None:
    """The first step from t_now at which the fitted curve improves by less than EPS over the
    next W steps (the ground truth's definition), searched up to t_now + 10·HORIZON."""
    s = np.arange(t_now, t_now + 10 * HORIZON, max(1.0, step))
    f, g = curve(s), curve(s + W)
    with np.errstate(invalid="ignore", divide="ignore"):
        flat = (f - g) / np.abs(f) < EPS
    hit = np.flatnonzero(flat)
    return int(s[hit[0]]) if len(hit) else None


def curve_fit_scores(series: dict[str, tuple[np.ndarray, np.ndarray]], onsets: dict) -> tuple[dict, dict]:
    """The curve-fit predictor's object and its plateau calls per run (call step, next checkpoint)."""
    errs: dict[int, list[float]] = {f: [] for f in FRACTIONS}
    base: dict[int, list[float]] = {f: [] for f in FRACTIONS}
    ema_base: dict[int, list[float]] = {f: [] for f in FRACTIONS}
    plateau_errs: dict[int, list[float]] = {f: [] for f in FRACTIONS}
    calls: dict[str, list[tuple[int, int]]] = {}
    used = []
    for run, (steps, vals) in series.items():
        if len(vals) < 40 or not np.isfinite(vals).all():
            continue
        used.append(run)
        gap = float(np.median(np.diff(steps)))
        tail = max(1, len(vals) // 20)
        actual = float(np.mean(vals[-tail:]))
        for f in FRACTIONS:
            n = max(10, len(vals) * f // 100)
            h_t, h_y = steps[:n].astype(float), vals[:n]
            pred = _fit_forecast(h_t, h_y, float(steps[-1]))
            last = float(np.mean(h_y[-max(1, n // 20) :]))
            scale = max(abs(actual), 1e-12)
            errs[f].append(abs((pred if pred is not None else last) - actual) / scale)
            base[f].append(abs(last - actual) / scale)
            ema_base[f].append(abs(float(ema(h_y)[-1]) - actual) / scale)
            curve = fit_curve(h_t, h_y, h_t[-1])
            p, truth = (forecast_plateau(curve, h_t[-1], gap) if curve else None), onsets.get(run)
            if p is not None and truth is not None:
                plateau_errs[f].append(abs(p - truth))
        cuts = sorted({max(10, len(vals) * i // CHECKPOINTS) for i in range(2, CHECKPOINTS)})
        for i, n in enumerate(cuts):
            curve = fit_curve(steps[:n].astype(float), vals[:n], float(steps[n - 1]))
            p = forecast_plateau(curve, float(steps[n - 1]), gap) if curve else None
            if p is not None and p <= steps[n - 1] + HORIZON:
                until = int(steps[cuts[i + 1] - 1]) if i + 1 < len(cuts) else int(steps[-1])
                calls.setdefault(run, []).append((int(steps[n - 1]), until))
    lengths = {r: len(series[r][0]) for r in used}
    out = _score_calls("curve_fit", {r: [c for c, _ in v] for r, v in calls.items()}, onsets, used, lengths)
    for f in FRACTIONS:
        out[f"final_loss_error_at_{f}"] = float(np.median(errs[f])) if errs[f] else None
        out[f"baseline_error_at_{f}"] = float(np.median(base[f])) if base[f] else None
        out[f"ema_error_at_{f}"] = float(np.median(ema_base[f])) if ema_base[f] else None
        out[f"plateau_step_error_at_{f}"] = float(np.median(plateau_errs[f])) if plateau_errs[f] else None
    return out, calls


def schedule_scores(
    name: str,
    modes: dict[str, list[tuple[int, int]]],
    spans: dict[str, tuple[int, int]],
    knees: dict[str, list[int]],
) -> dict:
    """The dynamic evaluation schedule driven by one predictor's plateau intervals (see the
    module docstring), summed over runs."""
    fixed = dynamic = n_knees = missed = 0
    for run, (first, last) in spans.items():
        intervals = modes.get(run, [])
        evals, t = [], first
        while t <= last:
            evals.append(t)
            stretched = any(a <= t <= b for a, b in intervals)
            t += EVAL_EVERY * (STRETCH if stretched else 1)
        fixed += len(range(first, last + 1, EVAL_EVERY))
        dynamic += len(evals)
        ev = np.array(evals)
        for k in knees.get(run, []):
            if first <= k <= last:
                n_knees += 1
                missed += not np.any((ev >= k) & (ev <= k + EVAL_EVERY))
    return {
        "predictor": name,
        "eval_every": EVAL_EVERY,
        "stretch": STRETCH,
        "runs": len(spans),
        "fixed_evals": fixed,
        "dynamic_evals": dynamic,
        "evals_saved": 1 - dynamic / fixed if fixed else None,
        "knees": n_knees,
        "knees_missed": missed,
    }


def always_calls(series: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, list[int]]:
    """The naive caller: "plateau within HORIZON" at each of CHECKPOINTS points of every run."""
    out = {}
    for run, (steps, _) in series.items():
        if len(steps):
            cuts = sorted({max(1, len(steps) * i // CHECKPOINTS) for i in range(2, CHECKPOINTS)})
            out[run] = [int(steps[min(n, len(steps)) - 1]) for n in cuts]
    return out


def verdict(row: dict, naive_precision: float | None) -> str:
    """Whether a predictor beats the naive baselines, in words."""
    said = []
    if row["predictor"] != "always":
        if row["precision"] is None:
            said.append("makes no plateau call")
        elif naive_precision is not None and row["precision"] <= naive_precision:
            said.append(
                f"plateau calls no more precise than calling at every checkpoint "
                f"({row['precision']:.1%} vs {naive_precision:.1%})"
            )
        elif naive_precision is not None:
            said.append(
                f"plateau calls beat calling at every checkpoint ({row['precision']:.1%} vs {naive_precision:.1%})"
            )
    worse = [
        f"{f} %"
        for f in FRACTIONS
        if row.get(f"final_loss_error_at_{f}") is not None
        and row[f"final_loss_error_at_{f}"] >= min(row[f"baseline_error_at_{f}"], row[f"ema_error_at_{f}"])
    ]
    if worse:
        said.append("final-loss forecast no better than the naive last value or EMA at " + ", ".join(worse))
    elif row.get(f"final_loss_error_at_{FRACTIONS[0]}") is not None:
        said.append("final-loss forecast beats the last value and the EMA at every cut")
    return "; ".join(said) if said else "naive baseline"


def evaluate_predictors(
    con: duckdb.DuckDBPyConnection, runs: dict, replayed: dict
) -> tuple[list[dict], list[dict]]:
    """The predictor objects (the naive `always` among them; every field present, null where it
    does not apply) and the dynamic evaluation schedule each drives; `replayed` holds the
    replays of PREDICTOR_RULES over the same runs."""
    run_ids = sorted(runs)
    series = loss_series(con, run_ids)
    onsets, from_eval = plateau_labels(series, loss_series(con, run_ids, "eval_loss"))
    evaluated = sorted(series)
    lengths = {r: len(series[r][0]) for r in evaluated}
    modes = {name: _intervals(replayed[name], run_ids) for name in PREDICTOR_RULES}
    fit, modes["curve_fit"] = curve_fit_scores(series, onsets)
    naive = _score_calls("always", always_calls(series), onsets, evaluated, lengths)
    out = [
        *[
            _score_calls(
                name, {r: [a for a, _ in v] for r, v in modes[name].items()}, onsets, evaluated, lengths
            )
            for name in PREDICTOR_RULES
        ],
        fit,
        naive,
    ]
    for o in out:
        o["verdict"] = verdict(o, naive["precision"])
        o["criterion"] = CRITERION
        o["plateaus_from_eval"] = sum(onsets.get(r) is not None for r in from_eval)
    spans = {r: (int(s[0]), int(s[-1])) for r, (s, _) in series.items() if len(s)}
    knees = {
        r: [
            k
            for k in (onsets.get(r), runs[r].onset if runs[r].outcome == "failed" else None)
            if k is not None
        ]
        for r in spans
    }
    schedule = [schedule_scores(name, modes[name], spans, knees) for name in modes]
    return [{k: _clean(o.get(k)) for k in PREDICTOR_FIELDS} for o in out], [
        {k: _clean(o.get(k)) for k in SCHEDULE_FIELDS} for o in schedule
    ]


def _clean(x):
    if isinstance(x, float) and not np.isfinite(x):
        return None
    return x
