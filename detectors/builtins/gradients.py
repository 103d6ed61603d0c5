"""Gradients: spikes against their EMA, vanishing norms, layer-to-layer flow, clipping."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from detectors.builtins.base import (
    RESTART_HOLD,
    Detector,
    after_warmup,
    finite_or_null,
    quiet_after_restarts,
    series_or_fail,
)
from detectors.builtins.loss import RobustLossSpike
from detectors.language import Name
from detectors.series import ReplayError, group_starts
from workbench.jit import njit


@njit(cache=True, nogil=True)
def _ema_ratio(starts, values, beta, k):
    """Per group: g / EMA_{t-1}(g) over finite values, the EMA fed min(g, k·EMA) as OLMo feeds
    it the clipped norm (a spike never becomes the baseline)."""
    n = values.shape[0]
    out = np.full(n, np.nan)
    for gi in range(starts.shape[0] - 1):
        e = np.nan
        for i in range(starts[gi], starts[gi + 1]):
            v = values[i]
            if not np.isfinite(v):
                continue
            if not np.isnan(e) and e > 0:
                out[i] = v / e
                v = min(v, k * e)
            e = v if np.isnan(e) else beta * e + (1.0 - beta) * v
    return out


@dataclass(frozen=True)
class EmaGradSpike(Detector):
    """OLMo-style EMA-relative spike: g_t > k × EMA_{t−1}(g), EMA weight beta, after `warmup`
    logged steps and the lr warm-up. The EMA skips non-finite norms (fp16 skipped steps) and is
    fed min(g, k·EMA), as OLMo feeds it the clipped norm.

    Targets exploding gradients: balance_loss_dominates, dead_ffn, divergence_nan,
    loss_spike_unrecovered, loss_spike, fp16_overflow. Known false positives: healthy norms stay
    close to their EMA, so a k near 1 fires on healthy runs; at k 3 a corrupt batch's one-step
    spike and noisy batches of 2 fired on 4 of 49 healthy diverse runs, at k 5 none (k chosen
    there: budget 0 healthy runs); an EMA over every value, Inf
    included, fires on every healthy DeepSpeed fp16 run (hence the skip).
    """

    metric: str = "grad_norm"
    beta: float = 0.95
    k: float = 5.0
    warmup: int = 20
    cooldown: int = 20
    id = "ema_grad_spike"
    grid = {"k": [2.0, 3.0, 5.0, 8.0]}

    def conditions(self, data):
        s = series_or_fail(data, self.metric, self.id)
        r = _ema_ratio(
            group_starts(s["rid"], s["key"]), s["value"].to_numpy().astype(np.float64), self.beta, self.k
        )
        frame = s.select("rid", "key", "step", cond=pl.Series(r > self.k), _l0=pl.Series(r))
        frame = quiet_after_restarts(after_warmup(frame, data), data, RESTART_HOLD)
        return frame, ["grad norm / EMA"], data.run_ids(s["rid"].unique().to_list())


@dataclass(frozen=True)
class VanishingGradients(Detector):
    """The gradient norm fell below `fraction` of its mean over the previous `window` finite
    values, for `for_steps` steps (SageMaker VanishingGradient and DeepDiagnosis use an absolute
    1e-7; relative to the run's own level it needs no knowledge of the model's scale).

    Targets attention_collapse and memory_blowup, whose output path is frozen, soon after the
    onset. An lr schedule cut to zero leaves the gradient norm where it is, so annealing healthy
    runs stay quiet.
    """

    metric: str = "grad_norm"
    fraction: float = 0.1
    window: int = 50
    for_steps: int = 5
    id = "vanishing_gradients"
    severity = "critical"
    grid = {"fraction": [0.02, 0.05, 0.1, 0.2], "for_steps": [3, 5, 10]}

    def conditions(self, data):
        s = series_or_fail(data, self.metric, self.id)
        base = (
            finite_or_null()
            .shift(1)
            .rolling_mean(self.window, min_samples=self.window // 2)
            .over("rid", "key")
        )
        frame = s.with_columns(base=base).select(
            "rid",
            "key",
            "step",
            cond=(pl.col("value") < self.fraction * pl.col("base")).fill_null(False),
            _l0=pl.col("value") / pl.col("base"),
        )
        return frame, ["grad norm / its mean"], data.run_ids(s["rid"].unique().to_list())


@dataclass(frozen=True)
class GradientFlow(Detector):
    """Gradient-flow decay per run: first/last layer grad-norm ratio < `vanish` with the first
    layer's norm < `vanish_abs` (vanishing), or ratio > `explode` (AUTOTRAINER 1e-3 / 1e-4 / 70;
    the guides also use 1000). Layers are the lowest and highest numbered `layer_prefix*` tags.

    Fires only once the gradients are nearly gone, long after a collapse (often past the
    backtest's default horizon): a late confirmation. It also sees some divergences and
    unrecovered spikes.
    """

    layer_prefix: str = "grad_norm/layer_"
    vanish: float = 1e-3
    vanish_abs: float = 1e-4
    explode: float = 70.0
    id = "gradient_flow"

    def conditions(self, data):
        t = data.tags_frame.filter(pl.col("tag").str.starts_with(self.layer_prefix))
        t = t.with_columns(
            layer=pl.col("tag").str.slice(len(self.layer_prefix)).str.extract(r"^(\d+)", 1).cast(pl.Int64)
        )
        ends = (
            t.drop_nulls("layer")
            .group_by("rid")
            .agg(
                first=pl.col("tag").sort_by("layer").first(),
                last=pl.col("tag").sort_by("layer").last(),
                n=pl.col("layer").n_unique(),
            )
            .filter(pl.col("n") > 1)
        )
        if ends.is_empty():
            raise ReplayError(
                f"{self.id}: no run logs two or more '{self.layer_prefix}N' tags; available {data.available()}"
            )

        def side(col):  # the chosen layer's series in every run
            parts = [
                data.series(Name(tag, True, 0)).filter(pl.col("rid").is_in(g["rid"].implode()))
                for (tag,), g in ends.group_by(col)
            ]
            return pl.concat(parts).select("rid", "step", "value")

        j = (
            side("first")
            .rename({"value": "f"})
            .join(side("last").rename({"value": "l"}), on=["rid", "step"])
            .sort("rid", "step")
        )
        ratio = pl.col("f") / pl.col("l")
        cond = ((ratio < self.vanish) & (pl.col("f") < self.vanish_abs)) | (ratio > self.explode)
        frame = j.select(
            "rid",
            key=pl.lit(-1, pl.Int32),
            step="step",
            cond=(cond & ~ratio.is_nan()).fill_null(False),
            _l0=ratio,
        )
        return frame, ["first/last layer grad-norm ratio"], data.run_ids(ends["rid"].to_list())


@dataclass(frozen=True)
class ClipSaturation(Detector):
    """Clipping took over: the share of the last `window` logged steps whose grad_norm ≥
    `max_norm` rose by `rise` or more over the share of the `window` steps before them.

    Clip-aware: the change in the clipped share, not its level. A run clipped at a small
    max_norm on purpose clips on most steps from the start (its share stays where it is), and
    one that never reaches max_norm has none; gradients that explode and stay large move the
    share from near 0 to near 1. Targets balance_loss_dominates, dead_ffn, divergence_nan,
    loss_spike_unrecovered. Known false positives: the level form (share ≥ 20 %) fired on most
    heavily clipped healthy runs; the change still trips when the norm drifts across max_norm
    as the lr schedule moves.
    """

    max_norm: float = 1.0
    window: int = 20
    rise: float = 0.8  # the smallest of the grid that no healthy run of the diverse corpus reaches
    id = "clip_saturation"
    grid = {"rise": [0.3, 0.5, 0.6, 0.8], "window": [10, 20, 50]}

    def conditions(self, data):
        s = series_or_fail(data, "grad_norm", self.id)
        share = (pl.col("value") >= self.max_norm).cast(pl.Float64).rolling_mean(self.window)
        change = share.over("rid", "key") - share.shift(self.window).over("rid", "key")
        frame = s.select("rid", "key", "step", cond=(change >= self.rise).fill_null(False), _l0=change)
        return frame, ["change in the clipped share"], data.run_ids(s["rid"].unique().to_list())


@dataclass(frozen=True)
class RobustGradSpike(RobustLossSpike):
    """The gradient norm far above its own recent level: robust z ((g − median) / (1.4826·MAD)
    of its previous `window` finite values) > `z`, for `for_steps` points. Scale-free (the
    model's width and depth, the optimizer and the loss scale set the norm's level, not its
    z), quiet during the lr warm-up and after warm restarts; fp16 skips (NaN/Inf) stay out of
    the baseline. Unlike a share of clipped steps, it does not care where max_norm is.

    Targets exploding gradients: divergence_nan(_filtered), loss_spike(_unrecovered),
    dead_ffn. Known false positives: a corrupt batch's one-step gradient spike.
    """

    metric: str = "grad_norm"
    window: int = 10
    z: float = 12.0
    id = "grad_robust_spike"
    grid = {"z": [6.0, 8.0, 12.0, 20.0], "for_steps": [1, 2, 3]}


@njit(cache=True, nogil=True)
def _zclip(starts, values, alpha, z, warm):
    """ZClip per group: EMA mean and variance of the finite norms (weight alpha), initialised
    from the first `warm` values; z = (g − mean)/std; an outlier enters the EMA clipped to
    mean + z·std, as ZClip feeds it the clipped norm."""
    n = values.shape[0]
    out = np.full(n, np.nan)
    for gi in range(starts.shape[0] - 1):
        seen = 0
        s1 = 0.0
        s2 = 0.0
        mu = 0.0
        var = 0.0
        for i in range(starts[gi], starts[gi + 1]):
            g = values[i]
            if not np.isfinite(g):
                continue
            if seen < warm:
                s1 += g
                s2 += g * g
                seen += 1
                if seen == warm:
                    mu = s1 / warm
                    var = max(s2 / warm - mu * mu, 0.0)
                continue
            sd = np.sqrt(var)
            if sd > 0:
                out[i] = (g - mu) / sd
                if g > mu + z * sd:
                    g = mu + z * sd
            mu = alpha * mu + (1.0 - alpha) * g
            var = alpha * var + (1.0 - alpha) * (g - mu) ** 2
    return out


@dataclass(frozen=True)
class ZClip(Detector):
    """ZClip (arXiv 2504.02507, `zclip/zclip.py`) as an alarm: the gradient norm's z-score
    against its EMA mean and variance (alpha 0.97, 25 warm-up steps) above 2.5. ZClip clips
    there, every few steps on a healthy run: as an alarm it is scored at its published default
    and kept out of the ensemble."""

    metric: str = "grad_norm"
    alpha: float = 0.97
    z: float = 2.5
    warm: int = 25
    id = "zclip"
    origin = "zclip"
    in_ensemble = False
    grid = {"z": [2.5, 4.0, 6.0, 10.0]}

    def conditions(self, data):
        s = series_or_fail(data, self.metric, self.id)
        zs = _zclip(
            group_starts(s["rid"], s["key"]),
            s["value"].to_numpy().astype(np.float64),
            float(self.alpha),
            float(self.z),
            int(self.warm),
        )
        frame = s.select("rid", "key", "step", cond=pl.Series(zs > self.z), _l0=pl.Series(zs))
        return frame, ["grad-norm z against its EMA"], data.run_ids(s["rid"].unique().to_list())
