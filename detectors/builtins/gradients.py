"""Gradients: spikes against their EMA, vanishing norms, layer-to-layer flow, clipping."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from detectors.builtins.base import Detector, after_warmup, finite_or_null, series_or_fail
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
    close to their EMA, so a k near 1 fires on healthy runs; an EMA over every value, Inf
    included, fires on every healthy DeepSpeed fp16 run (hence the skip).
    """

    metric: str = "grad_norm"
    beta: float = 0.95
    k: float = 3.0
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
        return after_warmup(frame, data), ["grad norm / EMA"], data.run_ids(s["rid"].unique().to_list())


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
    """Share of the last `window` steps whose grad_norm ≥ `max_norm` reaches `share`: clipping
    is doing the training (defaults 1.0, 100 steps, 20 %).

    Targets gradients that explode and stay large: balance_loss_dominates, dead_ffn,
    divergence_nan, loss_spike_unrecovered. Known false positives: a share of a few percent
    fires on healthy runs, and a run clipped at a small max_norm on purpose trips it: set
    max_norm to the run's clip value.
    """

    max_norm: float = 1.0
    window: int = 100
    share: float = 0.2
    id = "clip_saturation"
    grid = {"share": [0.2, 0.3, 0.5, 0.8]}

    def conditions(self, data):
        s = series_or_fail(data, "grad_norm", self.id)
        frac = (
            (pl.col("value") >= self.max_norm).cast(pl.Float64).rolling_mean(self.window).over("rid", "key")
        )
        frame = s.select("rid", "key", "step", cond=(frac >= self.share).fill_null(False), _l0=frac)
        return frame, ["clipped share"], data.run_ids(s["rid"].unique().to_list())
