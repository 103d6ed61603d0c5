"""Plateaus and overfitting."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from detectors.builtins.base import Detector, series_or_fail
from detectors.series import group_starts
from workbench.jit import njit


@njit(cache=True, nogil=True)
def _plateau_counter(starts, values, threshold, relative):
    """ReduceLROnPlateau (mode min): checks since the last improvement beyond the threshold."""
    out = np.zeros(values.shape[0], np.int64)
    for gi in range(starts.shape[0] - 1):
        best = np.inf
        bad = 0
        for i in range(starts[gi], starts[gi + 1]):
            v = values[i]
            better = v < best * (1.0 - threshold) if relative else v < best - threshold
            if np.isfinite(v) and (better or best == np.inf):
                best = v
                bad = 0
            else:
                bad += 1
            out[i] = bad
    return out


@dataclass(frozen=True)
class Plateau(Detector):
    """ReduceLROnPlateau semantics (mode min): fires when the number of checks without an
    improvement beyond `threshold` (rel: x < best·(1−θ); abs: x < best − θ) exceeds `patience`.
    Defaults: eval_loss, rel, θ=1e-4, patience 5 checks (PyTorch uses 10 epochs; evals come
    less often than epochs end). On a noisy per-step train loss raise the patience or it fires
    between lucky batches.

    Targets overfitting (the eval loss stops improving). A converged healthy run plateaus too,
    a signal to act on (lower the lr, stop), not a failure by itself; the healthy evaluation
    runs are short and still improving at their end, so that is barely measured.
    """

    metric: str = "eval_loss"
    threshold: float = 1e-4
    relative: bool = True
    patience: int = 5
    id = "plateau"
    severity = "info"
    grid = {"patience": [3, 5, 10, 20]}

    def conditions(self, data):
        s = series_or_fail(data, self.metric, self.id)
        bad = _plateau_counter(
            group_starts(s["rid"], s["key"]),
            s["value"].to_numpy().astype(np.float64),
            float(self.threshold),
            bool(self.relative),
        )
        frame = s.select("rid", "key", "step", cond=pl.Series(bad > self.patience), _l0="value")
        return frame, [self.metric], data.run_ids(s["rid"].unique().to_list())


@dataclass(frozen=True)
class LrCollapse(Detector):
    """The learning rate fell below `fraction` of its peak so far for `for_steps` logged steps:
    a scheduler that decays far too fast stalls the run on a plateau high above where it would
    have gone.

    Targets plateau caused by the schedule. It also fires after an lr burst, which sets the
    peak. Schedules that anneal towards zero cross the line near their end: at 2 % a healthy
    warm-up + cosine run logged every step fired in its last 40 steps; at 0.5 % and 10 steps a
    cosine or linear decay to 0 stays quiet, at 10 % many healthy runs fire.
    """

    fraction: float = 0.005
    for_steps: int = 10
    id = "lr_collapse"
    severity = "warning"
    grid = {"fraction": [0.005, 0.01, 0.02, 0.05], "for_steps": [5, 10, 20]}

    def conditions(self, data):
        s = series_or_fail(data, "lr", self.id)
        peak = pl.col("value").cum_max().over("rid", "key")
        frame = s.select(
            "rid",
            "key",
            "step",
            cond=(pl.col("value") < self.fraction * peak).fill_null(False),
            _l0=pl.col("value") / peak,
        )
        return frame, ["lr / its peak"], data.run_ids(s["rid"].unique().to_list())


@dataclass(frozen=True)
class Overfitting(Detector):
    """Eval loss rising for `evals` consecutive evaluations while train loss still falls
    (losslint / UMLAUT / AUTOTRAINER style). Evaluated at eval steps. Targets overfitting; it
    misses runs that evaluate often, whose eval loss wobbles."""

    train_window: int = 50
    for_steps: int = 3  # consecutive evaluations
    id = "overfitting"
    on = "eval_loss"
    grid = {"for_steps": [2, 3, 5]}

    def when(self):
        return f"delta(eval_loss, 1) > 0 and slope(loss, {self.train_window}) < 0"


@dataclass(frozen=True)
class OverfitGap(Detector):
    """(eval − train) / train > ratio at an eval step, train = mean of its last `train_window`
    values (SageMaker's Overfit rule, whose default ratio is 0.1; here 0.2, the smallest of the
    grid that no healthy run of the diverse corpus crosses: at 0.1 a standing gap of a few
    percent fired on 11 % of them).

    Targets overfitting. It also fires at the first evaluation after anything that breaks the
    model (the eval sees the broken model while the train mean still remembers the good one):
    attention_collapse, dead_ffn, divergence_nan, loss_spike, memory_blowup, router_collapse:
    the widest single built-in, wherever eval loss is logged. Known false positives: small
    datasets and regularised runs have a standing gap, which a ratio of a few percent fires on.
    """

    ratio: float = 0.2
    train_window: int = 20
    id = "overfit_gap"
    on = "eval_loss"
    severity = "info"
    grid = {"ratio": [0.05, 0.1, 0.2, 0.3]}

    def when(self):
        m = f"mean(loss, {self.train_window})"
        return f"(eval_loss - {m}) / {m} > {self.ratio}"
