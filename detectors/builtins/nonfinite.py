"""Non-finite values and fp16 loss scaling."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from detectors.builtins.base import FRAME, Detector, series_or_fail
from detectors.language import Name


@dataclass(frozen=True)
class NonFinite(Detector):
    """NaN or ±Inf in `metric` (Lightning check_finite, Megatron, OLMo NaNChecker).

    Targets divergence_nan and fp16_overflow, which a NaN loss ends, at the onset. The HF
    Trainer's NaN filter hides a NaN loss (divergence_nan_filtered): non_finite_grad_norm
    catches that one.
    """

    metric: str = "loss"
    severity = "critical"

    @property
    def id(self):  # type: ignore[override]  # read-only like every detector's id; this one names its metric
        return f"non_finite_{self.metric}"

    def when(self):
        return f"not (abs({self.metric}) < 1e308)"


@dataclass(frozen=True)
class NonFiniteGradNorm(Detector):
    """A NaN/Inf gradient norm that is not a normal fp16 loss-scaling skip.

    A non-finite norm is taken for a step the loss scaler skipped, which healthy fp16 runs do a
    few times (DeepSpeed's hysteresis skips twice at one scale; a GradScaler started at 2^24
    skips its first steps), when the run shows dynamic loss scaling (a logged loss scale or
    OVERFLOW notices), or when the loss logged with it is finite and not exactly 0.0 and the
    norm is Inf or comes before the run's first finite norm (a scaler skip leaves the loss
    alone and overflows to Inf; a divergence makes the loss NaN, or 0.0 or a finite average
    behind the HF Trainer's NaN filter, and the norm NaN). Such a norm alarms only for `consecutive` non-finite norms in a row (a storm) or
    once the loss scale is at `min_scale` (DeepSpeed's common floor 1; fairseq 1e-4) or
    DeepSpeed exits at its minimum (a storm counts once a finite norm has been seen: a scaler
    started high skips its first steps in a row); any other non-finite norm alarms at once.
    Targets divergence_nan, fp16_overflow and divergence_nan_filtered. Known false positives: a
    plain non-finite check fires on every healthy DeepSpeed fp16 run, and 2 in a row still on
    some.
    """

    metric: str = "grad_norm"
    consecutive: int = 3
    min_scale: float = 1.0
    id = "non_finite_grad_norm"
    severity = "critical"
    grid = {"consecutive": [2, 3, 5, 8]}

    def conditions(self, data):
        s = series_or_fail(data, self.metric, self.id)
        bad = ~pl.col("value").is_finite()
        g = s.with_columns(gap=(~bad).cum_sum().over("rid", "key"))
        g = g.with_columns(streak=bad.cast(pl.Int64).cum_sum().over("rid", "key", "gap"))
        scale = data.series(Name("loss_scale", False, 0)).select("rid", "step", scale="value").sort("step")
        g = (
            g.sort("step")
            .join_asof(scale, on="step", by="rid", strategy="backward", check_sortedness=False)
            .sort("rid", "key", "step")
        )
        ev = data.events.join(data.run_codes, on="run_id").drop_nulls("step")
        first = ev.group_by("rid").agg(
            overflow=pl.col("step").filter(pl.col("kind") == "overflow").min(),
            floor=pl.col("step").filter(pl.col("kind") == "min_loss_scale").min(),
        )
        g = g.join(first, on="rid", how="left")
        loss = data.series(Name("loss", False, 0)).select("rid", "step", loss="value").sort("step")
        if not loss.is_empty():
            g = (
                g.sort("step")
                .join_asof(loss, on="step", by="rid", strategy="backward", check_sortedness=False)
                .sort("rid", "key", "step")
            )
        else:
            g = g.with_columns(loss=pl.lit(None, pl.Float64))
        loss_ok = (pl.col("loss").is_finite() & (pl.col("loss") != 0)).fill_null(False)
        first_ok = pl.col("step").filter(~bad).min().over("rid", "key")
        startup = (pl.col("step") < first_ok).fill_null(True)
        fp16 = (
            pl.col("scale").is_not_null()
            | (pl.col("step") >= pl.col("overflow")).fill_null(False)
            | (loss_ok & (startup | pl.col("value").is_infinite()))
        )
        floor = (pl.col("scale") <= self.min_scale).fill_null(False) | (
            pl.col("step") >= pl.col("floor")
        ).fill_null(False)
        # a scaler starting high skips its first steps in a row until it settles: a storm counts
        # only once a finite norm has been seen
        settled = pl.col("step") > first_ok
        cond = bad & (~fp16 | floor | ((pl.col("streak") >= self.consecutive) & settled.fill_null(False)))
        frame = g.select("rid", "key", "step", cond=cond, _l0="value")
        return frame, [self.metric], data.run_ids(s["rid"].unique().to_list())


@dataclass(frozen=True)
class HfNanFiltered(Detector):
    """The HF Trainer's hidden NaN: a logged loss of exactly 0.0 beside a NaN/Inf gradient norm.

    With `logging_nan_inf_filter=True` (the Trainer's default) a non-finite loss is left out of
    the logged average, so a diverged run logs `loss 0.0` (or the average of the finite steps)
    while `grad_norm` is NaN. Targets divergence_nan_filtered at its onset; a healthy run never
    logs both.
    """

    id = "hf_nan_filtered"
    severity = "critical"

    def when(self):
        return "loss == 0 and not (abs(grad_norm) < 1e308)"


@dataclass(frozen=True)
class LossScaleCollapse(Detector):
    """fp16 loss-scale collapse from DeepSpeed's own evidence: `overflows` or more OVERFLOW
    notices within `window` steps, or the minimum-loss-scale exit. Hysteresis notices count
    (each skips a step). Defaults 5 in 50 steps.

    Targets fp16_overflow. Known false positives: healthy fp16 runs overflow now and then as
    the scaler probes a larger scale, so a lower count (3 in 50) fires on some of them.
    """

    overflows: int = 5
    window: int = 50
    id = "loss_scale_collapse"
    severity = "critical"
    grid = {"overflows": [3, 5, 8, 12]}

    def conditions(self, data):
        ev = (
            data.events.filter(pl.col("kind").is_in(["overflow", "min_loss_scale"]))
            .drop_nulls("step")
            .join(data.run_codes, on="run_id")
            .sort("rid", "step")
            .with_columns(one=pl.lit(1.0))
        )
        if ev.is_empty():
            return pl.DataFrame(schema=FRAME), ["overflows in window"], sorted(data.runs)
        counts = ev.rolling(index_column="step", period=f"{self.window}i", group_by="rid").agg(
            n=pl.col("one").sum(), fatal=(pl.col("kind") == "min_loss_scale").any()
        )
        counts = counts.group_by("rid", "step", maintain_order=True).agg(
            pl.col("n").max(), pl.col("fatal").any()
        )
        hits = counts.select(
            "rid",
            key=pl.lit(-1, pl.Int32),
            step="step",
            cond=(pl.col("n") >= self.overflows) | pl.col("fatal"),
            _l0="n",
        )
        # the condition holds at notice steps only: a false step after each keeps distant notices apart
        gaps = hits.select(
            "rid", "key", step=pl.col("step") + 1, cond=pl.lit(False), _l0=pl.lit(None, pl.Float64)
        )
        frame = pl.concat([hits, gaps.join(hits, on=["rid", "step"], how="anti")]).sort("rid", "step")
        return frame, ["overflows in window"], sorted(data.runs)
