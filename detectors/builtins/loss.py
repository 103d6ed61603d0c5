"""Loss spikes, divergence and drops."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from detectors.builtins.base import (
    RESTART_HOLD,
    Detector,
    after_warmup,
    quiet_after_restarts,
    series_or_fail,
)
from detectors.series import group_starts
from workbench.jit import njit


@njit(cache=True, nogil=True)
def _sigma_flags(starts, values, window, k, sign, exclude):
    """Per group: flag v when sign·(v − mean) > k·std of the last `window` finite values before
    it (sample std); with `exclude`, flagged values never enter that window."""
    n = values.shape[0]
    flags = np.zeros(n, np.bool_)
    buf = np.empty(window, np.float64)
    for gi in range(starts.shape[0] - 1):
        filled = 0
        pos = 0
        for i in range(starts[gi], starts[gi + 1]):
            v = values[i]
            if not np.isfinite(v):
                continue
            if filled == window:
                m = buf.mean()
                s = np.sqrt(((buf - m) ** 2).sum() / (window - 1))
                if s > 0 and sign * (v - m) > k * s:
                    flags[i] = True
                    if exclude:
                        continue
            buf[pos] = v
            pos = (pos + 1) % window
            if filled < window:
                filled += 1
    return flags


def _sigma_frame(data, metric, window, k, sign, exclude, rule_id):
    s = series_or_fail(data, metric, rule_id)
    flags = _sigma_flags(
        group_starts(s["rid"], s["key"]),
        s["value"].to_numpy().astype(np.float64),
        int(window),
        float(k),
        float(sign),
        exclude,
    )
    frame = after_warmup(s.select("rid", "key", "step", cond=pl.Series(flags), _l0="value"), data)
    frame = quiet_after_restarts(frame, data, RESTART_HOLD)
    return frame, [metric], data.run_ids(s["rid"].unique().to_list())


@dataclass(frozen=True)
class SigmaSpike(Detector):
    """Flags `metric` above mean + k·sigma of its previous `window` finite values (one-sided),
    once that window has filled and the lr warm-up has ended.

    Parameters: metric (name); window (values); k (sigmas); exclude_flagged (keep flagged points
    out of the baseline, as metaseq and Lightning do; off in OLMo and llm-foundry). Anchors:
    OLMo-core StabilityMonitor (128, 6σ); the guides' SPIKE (100, 3σ). Defaults 50, 5σ: a
    100-step window still holds the early fall of the loss, whose σ hides a spike, and 3σ trips
    on healthy noise. Targets loss_spike, loss_spike_unrecovered and the sudden rises of
    attention_collapse, dead_ffn, divergence_nan, memory_blowup. Known false positives: the
    guides' 3σ over 100 steps fires on healthy runs and misses most spikes that recover.
    """

    metric: str = "loss"
    window: int = 50
    k: float = 5.0
    exclude_flagged: bool = False
    for_steps: int = 2  # a corrupt batch's one-point spike the loss recovers from at once is none
    cooldown: int = 20
    id = "loss_spike"
    severity = "warning"
    in_ensemble = False  # loss_robust_spike (scale-free) takes its place there
    grid = {"k": [3.0, 4.0, 5.0, 6.0, 8.0], "window": [20, 50, 100]}

    def conditions(self, data):
        return _sigma_frame(data, self.metric, self.window, self.k, +1, self.exclude_flagged, self.id)


@dataclass(frozen=True)
class SigmaDrop(SigmaSpike):
    """Flags `metric` below mean − k·sigma of its previous `window` finite values for `for_steps`
    steps, after warm-up: a sudden, lasting drop (a data leak, a reset, a logging bug).

    The guides' DROP (2σ over 100 steps, one step) fires on a loss that is still falling and on
    plain noise (a one-sided 2σ test trips about once in 44 steps): on most healthy runs. Held
    at 4σ for 5 steps it stays quiet there. Target: data leaks and resets, a kind the
    evaluation runs do not hold, so its recall is unmeasured.
    """

    k: float = 4.0
    for_steps: int = 5
    id = "loss_drop"
    severity = "info"
    in_ensemble = True
    grid = {"k": [3.0, 4.0, 6.0], "for_steps": [1, 5, 10]}

    def conditions(self, data):
        return _sigma_frame(data, self.metric, self.window, self.k, -1, self.exclude_flagged, self.id)


@dataclass(frozen=True)
class OlmoSpike(SigmaSpike):
    """OLMo-core StabilityMonitor: metric > mean + 6σ of the last 128 values (after warm-up).

    Targets the large spikes: divergence_nan, loss_spike_unrecovered, and some of the collapses
    and recovered spikes; the 128-value window makes it quiet in the first 128 steps.
    """

    window: int = 128
    k: float = 6.0
    for_steps: int = 1  # OLMo-core flags every spike step
    id = "olmo_spike"
    origin = "olmo-core"
    in_ensemble = True
    grid = {"k": [4.0, 5.0, 6.0, 8.0]}


@njit(cache=True, nogil=True)
def _ema_best(starts, values, weight):
    """Per group: the EMA of the finite values (smoothing weight w) and its minimum so far."""
    n = values.shape[0]
    e = np.full(n, np.nan)
    best = np.full(n, np.nan)
    for gi in range(starts.shape[0] - 1):
        cur = np.nan
        low = np.inf
        for i in range(starts[gi], starts[gi + 1]):
            v = values[i]
            if np.isfinite(v):
                cur = v if np.isnan(cur) else weight * cur + (1.0 - weight) * v
                low = min(low, cur)
            e[i] = cur
            best[i] = low
    return e, best


@dataclass(frozen=True)
class LossDivergence(Detector):
    """The loss rose above its best and did not come back: the EMA of the loss (smoothing weight
    `weight`) stays more than `rise` above its lowest value so far for `for_steps` steps.

    A spike that recovers within `for_steps` steps stays quiet; one that does not, a collapse or
    a slow divergence, alarms `for_steps` steps after the EMA crossed (late by design: the
    alarm says "this will not come back on its own"). Anchors: runmedic's divergence check,
    Lightning EarlyStopping `divergence_threshold`. Targets loss_spike_unrecovered,
    attention_collapse, dead_ffn, memory_blowup, divergence_nan; recovered spikes stay quiet.
    Known false positives: a smaller rise held for fewer steps also fires on spikes that
    recover, and a rise of a few percent trips on healthy noise.
    """

    metric: str = "loss"
    weight: float = 0.9
    rise: float = 0.2
    for_steps: int = 50
    id = "loss_divergence"
    severity = "critical"
    grid = {"rise": [0.05, 0.1, 0.2, 0.3], "for_steps": [10, 20, 30, 50]}

    def conditions(self, data):
        s = series_or_fail(data, self.metric, self.id)
        e, best = _ema_best(
            group_starts(s["rid"], s["key"]), s["value"].to_numpy().astype(np.float64), float(self.weight)
        )
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # inf: a rise past any bound
            ratio = e / best - 1.0
        frame = s.select("rid", "key", "step", cond=pl.Series(ratio > self.rise), _l0=pl.Series(ratio))
        frame = after_warmup(frame, data)
        return frame, ["EMA rise over its best"], data.run_ids(s["rid"].unique().to_list())


@dataclass(frozen=True)
class LlmFoundrySpike(Detector):
    """llm-foundry KillLossSpike: loss ≥ ratio × mean of the last `window` values on more than
    `patience` consecutive steps. Defaults window 100, ratio 2, patience 4 (fires on the 5th).

    Targets losses that double and stay: loss_spike_unrecovered, attention_collapse,
    memory_blowup, divergence_nan, some dead_ffn; a spike that recovers within 5 steps is
    missed by design.
    """

    metric: str = "loss"
    window: int = 100
    ratio: float = 2.0
    for_steps: int = 5
    id = "llmfoundry_loss_spike"
    origin = "llm-foundry"
    severity = "critical"
    grid = {"ratio": [1.3, 1.5, 2.0, 3.0]}

    def when(self):
        return f"{self.metric} >= {self.ratio} * mean({self.metric}, {self.window})"


@dataclass(frozen=True)
class MegatronSpike(Detector):
    """Megatron is_unexpectedly_large: |x| ≥ factor × max of the first `baseline` finite values,
    for finite x (Megatron checks NaN/Inf separately). Defaults factor 10, baseline 100.

    Targets exploding gradients: dead_ffn, divergence_nan, loss_spike_unrecovered, some
    fp16_overflow. Misses slow drifts and anything within 10x of the first steps, by design.
    Counting an fp16 skip's Inf as large would fire on every healthy DeepSpeed fp16 run (hence
    finite x only).
    """

    metric: str = "grad_norm"
    baseline: int = 100
    factor: float = 10.0
    id = "megatron_unexpectedly_large"
    origin = "megatron"
    severity = "critical"
    grid = {"factor": [3.0, 5.0, 10.0, 20.0]}

    def when(self):
        x = f"abs({self.metric})"
        return f"{x} >= {self.factor} * max_first({self.metric}, {self.baseline}) and {x} < 1e308"


@njit(cache=True, nogil=True)
def _robust_z(starts, values, window, floor):
    """Per group: (v − median) / (1.4826·MAD) of the last `window` finite values before v, the
    scale held at least `floor`·|median| (a flat baseline makes no infinite z); NaN until the
    window has filled and on non-finite v."""
    n = values.shape[0]
    z = np.full(n, np.nan)
    buf = np.empty(window, np.float64)
    for gi in range(starts.shape[0] - 1):
        filled = 0
        pos = 0
        for i in range(starts[gi], starts[gi + 1]):
            v = values[i]
            if not np.isfinite(v):
                continue
            if filled == window:
                m = np.median(buf)
                scale = max(1.4826 * np.median(np.abs(buf - m)), floor * abs(m))
                if scale > 0:
                    z[i] = (v - m) / scale
            buf[pos] = v
            pos = (pos + 1) % window
            if filled < window:
                filled += 1
    return z


def robust_frame(data, metric, window, floor, z, restart_hold, rule_id, sign=1.0):
    """(frame, texts, runs) of `sign`·robust z > z, after lr warm-up and quiet after restarts."""
    s = series_or_fail(data, metric, rule_id)
    rz = _robust_z(
        group_starts(s["rid"], s["key"]), s["value"].to_numpy().astype(np.float64), int(window), float(floor)
    )
    frame = s.select("rid", "key", "step", cond=pl.Series(sign * rz > z), _l0=pl.Series(rz))
    frame = quiet_after_restarts(after_warmup(frame, data), data, restart_hold)
    return frame, [f"robust z of {metric}"], data.run_ids(s["rid"].unique().to_list())


@dataclass(frozen=True)
class RobustLossSpike(Detector):
    """The loss far above its own recent level, in the run's own units: (loss − median) /
    (1.4826·MAD) of its previous `window` logged values > `z`, the scale at least `floor` x the
    median (a flat loss is no licence for a tiny rise). Scale-free: no threshold in loss units,
    so a run's dataset, vocabulary, batch size and logging interval do not move it. Quiet during
    the lr warm-up and for `restart_hold` points after a warm restart (the lr jumping back to
    its peak lifts the loss by design).

    Anchors: runmedic's robust z (MAD x 1.4826, z 8), the MAD guard of axolotl-style callbacks.
    Threshold calibrated on healthy runs of the tuning families (`workbench backtest --tune`,
    budget 1 false alarm per 1k healthy steps). Targets loss_spike, loss_spike_unrecovered,
    divergence_nan and the sudden rises of the collapses. Known false positives: a recovered
    one-step spike (a corrupt batch) is a real spike and fires; noisy small batches trip a
    smaller z.
    """

    metric: str = "loss"
    window: int = 20
    z: float = 6.0
    floor: float = 0.01
    restart_hold: int = RESTART_HOLD
    for_steps: int = 2
    cooldown: int = 20
    id = "loss_robust_spike"
    grid = {"z": [4.0, 6.0, 8.0, 12.0], "for_steps": [1, 2, 3], "window": [10, 20]}

    def conditions(self, data):
        return robust_frame(data, self.metric, self.window, self.floor, self.z, self.restart_hold, self.id)
