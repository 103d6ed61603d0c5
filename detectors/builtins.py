"""Built-in detectors: one small class each, explicit keyword parameters, defaults from the
public trainers and monitors each docstring names. Most compile to the rule language (so they replay through the same
engine and are causal by construction); the few that need state (best-so-far, a baseline that
skips flagged points, per-run layer lookup, events) compute their condition in code.

Every detector has `id`, `params`, `rule()` and `with_params(**kw)`; code detectors also
`conditions(data)` returning (frame run_id, key, step, cond, _l0.., leaf texts, evaluable runs).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np
import polars as pl
from numba import njit

from detectors.engine import ReplayError, SeriesData
from detectors.language import Name
from detectors.rules import Rule


@dataclass(frozen=True)
class Detector:
    """Base: subclasses are dataclasses whose fields are the parameters."""

    for_steps: int = 1
    cooldown: int = 0
    warmup: int = 0

    id = "detector"
    severity = "warning"
    description = ""

    @property
    def params(self) -> dict:
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("for_steps", "cooldown", "warmup")
        }

    def with_params(self, **kw) -> Detector:
        return replace(self, **kw)

    def when(self) -> str | None:
        return None

    def rule(self) -> Rule:
        return Rule(
            id=self.id,
            when=self.when(),
            for_steps=self.for_steps,
            cooldown=self.cooldown,
            warmup=self.warmup,
            on=getattr(self, "on", None),
            description=self.description or (self.__doc__ or "").split("\n")[0],
            severity=self.severity,
            params=self.params,
            detector=self,
        )


# ---- expression detectors ----------------------------------------------------------------------
@dataclass(frozen=True)
class SigmaSpike(Detector):
    """Flags `metric` above mean + k·sigma of its previous `window` logged values (one-sided).

    Parameters: metric (name); window (values, 100); k (sigmas, 3); exclude_flagged (keep
    flagged points out of the baseline, as metaseq and Lightning do; default off as in OLMo and
    llm-foundry). Known false positives: the first steps after warm-up, where sigma is small;
    lr warm-up ends; data-order effects. Anchors: OLMo-core StabilityMonitor (128, 6σ); guides (100, 3σ).
    """

    metric: str = "loss"
    window: int = 100
    k: float = 3.0
    exclude_flagged: bool = False
    cooldown: int = 20
    id = "loss_spike"
    severity = "warning"

    def when(self):
        if self.exclude_flagged:
            return None
        return f"{self.metric} > mean({self.metric}, {self.window}) + {self.k} * std({self.metric}, {self.window})"

    def conditions(self, data):
        return _baseline_excluding_flags(data, self.metric, self.window, self.k, +1)


@dataclass(frozen=True)
class SigmaDrop(SigmaSpike):
    """Flags `metric` below mean − k·sigma of its previous `window` values (a sudden drop: a
    data leak, a reset, a logging bug). Parameters as SigmaSpike; default k=2 (the guides' DROP)."""

    k: float = 2.0
    id = "loss_drop"
    severity = "info"

    def when(self):
        if self.exclude_flagged:
            return None
        return f"{self.metric} < mean({self.metric}, {self.window}) - {self.k} * std({self.metric}, {self.window})"

    def conditions(self, data):
        return _baseline_excluding_flags(data, self.metric, self.window, self.k, -1)


@dataclass(frozen=True)
class OlmoSpike(SigmaSpike):
    """OLMo-core StabilityMonitor: metric > mean + 6σ of the last 128 values."""

    window: int = 128
    k: float = 6.0
    id = "olmo_spike"


@dataclass(frozen=True)
class LlmFoundrySpike(Detector):
    """llm-foundry KillLossSpike: loss ≥ ratio × mean of the last `window` values on more than
    `patience` consecutive steps. Defaults window 100, ratio 2, patience 4 (fires on the 5th)."""

    metric: str = "loss"
    window: int = 100
    ratio: float = 2.0
    for_steps: int = 5
    id = "llmfoundry_loss_spike"
    severity = "critical"

    def when(self):
        return f"{self.metric} >= {self.ratio} * mean({self.metric}, {self.window})"


@dataclass(frozen=True)
class MegatronSpike(Detector):
    """Megatron is_unexpectedly_large: |x| ≥ factor × max of the first `baseline` finite values.
    Defaults factor 10, baseline 100. Misses slow drifts; by design only catches blow-ups."""

    metric: str = "grad_norm"
    baseline: int = 100
    factor: float = 10.0
    id = "megatron_unexpectedly_large"
    severity = "critical"

    def when(self):
        return f"abs({self.metric}) >= {self.factor} * max_first({self.metric}, {self.baseline})"


@dataclass(frozen=True)
class EmaGradSpike(Detector):
    """OLMo-style EMA-relative spike: g_t > k × EMA_{t−1}(g), EMA weight beta (0.95).
    k=5 by default. OLMo feeds the clipped norm into its EMA; this EMA sees every value."""

    metric: str = "grad_norm"
    beta: float = 0.95
    k: float = 5.0
    warmup: int = 20
    cooldown: int = 20
    id = "ema_grad_spike"

    def when(self):
        return f"{self.metric} > {self.k} * ema({self.metric}, {self.beta})"


@dataclass(frozen=True)
class NonFinite(Detector):
    """NaN or ±Inf in `metric` (Lightning check_finite, Megatron, OLMo NaNChecker)."""

    metric: str = "loss"
    severity = "critical"

    @property
    def id(self):
        return f"non_finite_{self.metric}"

    def when(self):
        return f"not (abs({self.metric}) < 1e308)"


@dataclass(frozen=True)
class PatternP1(Detector):
    """The guides' P1: grad_norm < 1e-5 and attention entropy < 0.3 for 5 steps (attention
    collapse with vanishing gradients). Converged easy tasks also have peaked attention."""

    grad_threshold: float = 1e-5
    entropy_threshold: float = 0.3
    for_steps: int = 5
    id = "P1_attention_collapse"
    severity = "critical"

    def when(self):
        return f"grad_norm < {self.grad_threshold} and attn_entropy < {self.entropy_threshold}"


@dataclass(frozen=True)
class PatternP2(Detector):
    """The guides' P2: FFN input std < 0.005 and LayerNorm input std < 0.05 for 5 steps (dead
    or saturated FFN: every token reaches the FFN as the same vector). Per layer (glob)."""

    ffn_threshold: float = 0.005
    ln_threshold: float = 0.05
    for_steps: int = 5
    id = "P2_dead_ffn"
    severity = "critical"

    def when(self):
        return f"`ffn_input_std/*` < {self.ffn_threshold} and ln_input_std < {self.ln_threshold}"


@dataclass(frozen=True)
class PatternP3(Detector):
    """The guides' P3: train loss falling while the eval metric moves < 0.001, for 10 evals
    (evaluated at eval steps). Early in training, evals that barely move are normal."""

    eval_metric: str = "eval_loss"
    min_move: float = 0.001
    train_window: int = 50
    for_steps: int = 10
    id = "P3_eval_stalled"

    @property
    def on(self):
        return self.eval_metric

    def when(self):
        return f"slope(loss, {self.train_window}) < 0 and abs(delta({self.eval_metric}, 1)) < {self.min_move}"


@dataclass(frozen=True)
class PatternP4(Detector):
    """The guides' P4: memory more than 3 GB above its minimum of the last `window` values while
    grad_norm < 1e-3 (a leak while training stalls). Metric `memory_gb` (RSS or allocated)."""

    jump_gb: float = 3.0
    window: int = 50
    grad_threshold: float = 1e-3
    id = "P4_memory_jump"
    severity = "critical"

    def when(self):
        return f"memory_gb - min(memory_gb, {self.window}) > {self.jump_gb} and grad_norm < {self.grad_threshold}"


@dataclass(frozen=True)
class Overfitting(Detector):
    """Eval loss rising for `evals` consecutive evaluations while train loss still falls
    (losslint / UMLAUT / AUTOTRAINER style). Evaluated at eval steps."""

    train_window: int = 50
    for_steps: int = 3  # consecutive evaluations
    id = "overfitting"
    on = "eval_loss"

    def when(self):
        return f"delta(eval_loss, 1) > 0 and slope(loss, {self.train_window}) < 0"


@dataclass(frozen=True)
class OverfitGap(Detector):
    """(eval − train) / train > ratio at an eval step, train = mean of its last `train_window`
    values (SageMaker Overfit; r=0.1). Small datasets and regularised runs have a standing gap."""

    ratio: float = 0.1
    train_window: int = 20
    id = "overfit_gap"
    on = "eval_loss"
    severity = "info"

    def when(self):
        m = f"mean(loss, {self.train_window})"
        return f"(eval_loss - {m}) / {m} > {self.ratio}"


@dataclass(frozen=True)
class MemoryPressure(Detector):
    """Reserved memory above `percent` % of capacity (OLMo-core gpu_memory_monitor: 95)."""

    percent: float = 90.0
    id = "memory_pressure"

    def when(self):
        return f"memory_reserved_pct > {self.percent}"


@dataclass(frozen=True)
class MoeImbalance(Detector):
    """MoE router imbalance: max / mean expert load > `ratio` (5)."""

    ratio: float = 5.0
    id = "moe_imbalance"

    def when(self):
        return f"moe_max_load / moe_mean_load > {self.ratio}"


@dataclass(frozen=True)
class BalanceLossShare(Detector):
    """MoE balance loss above `share` (30 %) of the total loss."""

    share: float = 0.3
    id = "balance_loss_share"

    def when(self):
        return f"balance_loss / loss > {self.share}"


# ---- code detectors ----------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _flags_excluding(starts, values, window, k, sign):
    """Per group: flag v when sign·(v − mean) > k·std of the last `window` unflagged values."""
    n = values.shape[0]
    flags = np.zeros(n, np.bool_)
    buf = np.empty(window, np.float64)
    for gi in range(starts.shape[0] - 1):
        filled = 0
        pos = 0
        for i in range(starts[gi], starts[gi + 1]):
            v = values[i]
            if filled == window:
                m = buf.mean()
                s = np.sqrt(((buf - m) ** 2).sum() / (window - 1))
                if np.isfinite(v) and s > 0 and sign * (v - m) > k * s:
                    flags[i] = True
                    continue  # a flagged point never enters the baseline
            if np.isfinite(v):
                buf[pos] = v
                pos = (pos + 1) % window
                if filled < window:
                    filled += 1
    return flags


def _series_or_fail(data: SeriesData, metric: str, rule_id: str) -> pl.DataFrame:
    s = data.series(Name(metric, False, 0))
    if s.is_empty():
        raise ReplayError(f"{rule_id}: {metric} found in no selected run; available {data.available()}")
    return s


def _group_starts(s: pl.DataFrame) -> np.ndarray:
    """Row offsets where each (rid, key) group starts in a frame sorted by rid, key, step, plus the end."""
    change = (s["rid"].diff().fill_null(1) != 0) | (s["key"].diff().fill_null(1) != 0)
    return np.r_[np.flatnonzero(change.to_numpy()), len(s)].astype(np.int64)


def _baseline_excluding_flags(data, metric, window, k, sign):
    s = _series_or_fail(data, metric, "sigma spike")
    flags = _flags_excluding(
        _group_starts(s), s["value"].to_numpy().astype(np.float64), int(window), float(k), float(sign)
    )
    frame = s.select("rid", "key", "step", cond=pl.Series(flags), _l0="value")
    return frame, [metric], data.run_ids(s["rid"].unique().to_list())


@dataclass(frozen=True)
class GradientFlow(Detector):
    """Gradient-flow decay per run: first/last layer grad-norm ratio < `vanish` with the first
    layer's norm < `vanish_abs` (vanishing), or ratio > `explode` (AUTOTRAINER 1e-3 / 1e-4 / 70;
    the guides also use 1000). Layers are the lowest and highest numbered `layer_prefix*` tags."""

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
    is doing the training (defaults 1.0, 100 steps, 50 %)."""

    max_norm: float = 1.0
    window: int = 100
    share: float = 0.5
    id = "clip_saturation"

    def conditions(self, data):
        s = _series_or_fail(data, "grad_norm", self.id)
        frac = (
            (pl.col("value") >= self.max_norm).cast(pl.Float64).rolling_mean(self.window).over("rid", "key")
        )
        frame = s.select("rid", "key", "step", cond=(frac >= self.share).fill_null(False), _l0=frac)
        return frame, ["clipped share"], data.run_ids(s["rid"].unique().to_list())


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
    Defaults: eval_loss, rel, θ=1e-4, patience 10 (PyTorch). On a noisy per-step train loss
    raise the patience or it fires between lucky batches."""

    metric: str = "eval_loss"
    threshold: float = 1e-4
    relative: bool = True
    patience: int = 10
    id = "plateau"
    severity = "info"

    def conditions(self, data):
        s = _series_or_fail(data, self.metric, self.id)
        bad = _plateau_counter(
            _group_starts(s),
            s["value"].to_numpy().astype(np.float64),
            float(self.threshold),
            bool(self.relative),
        )
        frame = s.select("rid", "key", "step", cond=pl.Series(bad > self.patience), _l0="value")
        return frame, [self.metric], data.run_ids(s["rid"].unique().to_list())


@dataclass(frozen=True)
class LossScaleCollapse(Detector):
    """fp16 loss-scale collapse from DeepSpeed's own evidence: `overflows` or more OVERFLOW
    notices within `window` steps, or the minimum-loss-scale exit. Hysteresis notices count
    (each skips a step). Defaults 5 in 50 steps."""

    overflows: int = 5
    window: int = 50
    id = "loss_scale_collapse"
    severity = "critical"

    def conditions(self, data):
        ev = (
            data.events.filter(pl.col("kind").is_in(["overflow", "min_loss_scale"]))
            .drop_nulls("step")
            .join(data.run_codes, on="run_id")
            .sort("rid", "step")
            .with_columns(one=pl.lit(1.0))
        )
        empty = pl.DataFrame(
            schema={"rid": pl.Int32, "key": pl.Int32, "step": pl.Int64, "cond": pl.Boolean, "_l0": pl.Float64}
        )
        if ev.is_empty():
            return empty, ["overflows in window"], sorted(data.runs)
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


# ---- the registry (one line per detector) --------------------------------------------------------
BUILTINS: list[Detector] = [
    NonFinite(),
    NonFinite(metric="grad_norm"),
    SigmaSpike(),
    SigmaDrop(),
    OlmoSpike(),
    LlmFoundrySpike(),
    MegatronSpike(),
    EmaGradSpike(),
    GradientFlow(),
    ClipSaturation(),
    LossScaleCollapse(),
    PatternP1(),
    PatternP2(),
    PatternP3(),
    PatternP4(),
    Plateau(),
    Overfitting(),
    OverfitGap(),
    MemoryPressure(),
    MoeImbalance(),
    BalanceLossShare(),
]


def builtin_rules() -> list[Rule]:
    return [d.rule() for d in BUILTINS]
