"""Built-in detectors: one small class each, explicit keyword parameters, defaults from the
public trainers and monitors each docstring names. Each docstring says which failure kinds the
detector targets and its known false positives, with the backtest's figures at the shipped
defaults (`workbench backtest --summary`): "corpus" is the evaluation corpus of
`python sample_runs/generate.py --corpus` (31 failed runs over 12 kinds and 19 healthy runs of
the plain PyTorch loop, MoE included, the HF Trainer and DeepSpeed fp16; both halves), "samples"
is sample_runs/ (10 failed, 10 healthy). A/B counts runs the detector could be evaluated on.

Detectors that know training:
- fp16 dynamic loss scaling: a NaN/Inf gradient norm on a step the loss scaler skipped is
  normal; grad-norm baselines skip non-finite values; an alarm needs a storm of consecutive
  skips or the loss scale at its floor.
- warm-up: sigma rules stay quiet until their window has filled and, when the run logs a
  learning rate, until its warm-up has ended (the first logged lr not above the largest before).
- spikes: `loss_spike` flags any spike; `loss_divergence` only one the loss does not recover
  from (its EMA still well above its best `for_steps` steps later).

Most compile to the rule language (so they replay through the same engine and are causal by
construction); those that need state (best-so-far, baselines that skip flagged or non-finite
points, lr warm-up, events, tags found by pattern) compute their condition in code. Every
detector has `id`, `params`, `rule()`, `with_params(**kw)` and a `grid` that `workbench backtest
--tune` picks among; code detectors also `conditions(data)` returning (frame rid, key, step,
cond, _l0.., leaf texts, evaluable runs).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import ClassVar

import numpy as np
import polars as pl

from detectors.language import Name
from detectors.rules import Rule
from detectors.series import ReplayError, SeriesData
from workbench.jit import njit


@dataclass(frozen=True)
class Detector:
    """Base: subclasses are dataclasses whose fields are the parameters."""

    for_steps: int = 1
    cooldown: int = 0
    warmup: int = 0

    id = "detector"
    severity = "warning"
    description = ""
    grid: ClassVar[dict] = {}  # parameter -> values `workbench backtest --tune` picks among

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


# ---- shared pieces of the detectors computed in code ------------------------------------------
_FRAME = {"rid": pl.Int32, "key": pl.Int32, "step": pl.Int64, "cond": pl.Boolean, "_l0": pl.Float64}


def _series_or_fail(data: SeriesData, metric: str, rule_id: str) -> pl.DataFrame:
    s = data.series(Name(metric, False, 0))
    if s.is_empty():
        raise ReplayError(f"{rule_id}: {metric} found in no selected run; available {data.available()}")
    return s


def _first_series(data: SeriesData, names: tuple[str, ...], rule_id: str) -> pl.DataFrame:
    """Per run, the series of the first of `names` it logs: a canonical metric or tag, or a tag
    glob (`*`, one evaluation per matching tag)."""
    parts, seen = [], set()
    for n in names:
        s = data.series(Name(n, "*" in n, 0))
        s = s.filter(~pl.col("rid").is_in(list(seen)))
        if not s.is_empty():
            parts.append(s)
            seen |= set(s["rid"].unique().to_list())
    if not parts:
        raise ReplayError(
            f"{rule_id}: none of {', '.join(names)} found in a selected run; available {data.available()}"
        )
    return pl.concat(parts).sort("rid", "key", "step")


def _group_starts(s: pl.DataFrame) -> np.ndarray:
    """Row offsets where each (rid, key) group starts in a frame sorted by rid, key, step, plus the end."""
    change = (s["rid"].diff().fill_null(1) != 0) | (s["key"].diff().fill_null(1) != 0)
    return np.r_[np.flatnonzero(change.to_numpy()), len(s)].astype(np.int64)


def lr_warmup_end(data: SeriesData) -> pl.DataFrame:
    """(rid, warm_end): per run that logs a learning rate, the first step whose lr is not above
    the largest logged before it (the warm-up is over); null while the lr keeps rising. A run
    that logs its lr once (a constant) has no warm-up to wait for."""
    lr = data.series(Name("lr", False, 0))
    if lr.is_empty():
        return pl.DataFrame(schema={"rid": pl.Int32, "warm_end": pl.Int64})
    done = pl.col("value") <= pl.col("value").shift(1).cum_max().over("rid", "key")
    ends = lr.group_by("rid").agg(
        end=pl.col("step").filter(done).min(), n=pl.len(), first=pl.col("step").min()
    )
    return ends.select("rid", warm_end=pl.when(pl.col("n") == 1).then("first").otherwise("end"))


def _after_warmup(frame: pl.DataFrame, data: SeriesData) -> pl.DataFrame:
    """`cond` kept only at steps after the run's lr warm-up (runs without a logged lr: all)."""
    ends = lr_warmup_end(data)
    j = frame.join(ends, on="rid", how="left")
    logs_lr = pl.col("rid").is_in(ends["rid"].implode())
    gate = ~logs_lr | (pl.col("warm_end").is_not_null() & (pl.col("step") >= pl.col("warm_end")))
    return j.with_columns(cond=pl.col("cond") & gate).drop("warm_end")


def _finite_or_null(col: str = "value") -> pl.Expr:
    """NaN and Inf as null: window statistics then skip them (an fp16 skip must not poison a baseline)."""
    v = pl.col(col)
    return pl.when(v.is_finite()).then(v)


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
    s = _series_or_fail(data, metric, rule_id)
    flags = _sigma_flags(
        _group_starts(s),
        s["value"].to_numpy().astype(np.float64),
        int(window),
        float(k),
        float(sign),
        exclude,
    )
    frame = _after_warmup(s.select("rid", "key", "step", cond=pl.Series(flags), _l0="value"), data)
    return frame, [metric], data.run_ids(s["rid"].unique().to_list())


# ---- non-finite values and fp16 loss scaling -------------------------------------------------
@dataclass(frozen=True)
class NonFinite(Detector):
    """NaN or ±Inf in `metric` (Lightning check_finite, Megatron, OLMo NaNChecker).

    Targets divergence_nan and fp16_overflow, which a NaN loss ends: corpus 2/2 and 3/3, at the
    onset. Healthy runs: 0/19 corpus, 0/10 samples. The HF Trainer's NaN filter hides a NaN loss
    (divergence_nan_filtered): non_finite_grad_norm catches that one.
    """

    metric: str = "loss"
    severity = "critical"

    @property
    def id(self):
        return f"non_finite_{self.metric}"

    def when(self):
        return f"not (abs({self.metric}) < 1e308)"


@dataclass(frozen=True)
class NonFiniteGradNorm(Detector):
    """A NaN/Inf gradient norm that is not a normal fp16 loss-scaling skip.

    With dynamic loss scaling (the run logs a loss scale or OVERFLOW notices) a non-finite norm
    is a step the scaler skipped, which healthy fp16 runs do a few times (DeepSpeed's hysteresis
    skips twice at one scale). There it alarms only for `consecutive` non-finite norms in a row
    (a storm) or once the loss scale is at `min_scale` (DeepSpeed's common floor 1; fairseq
    1e-4) or DeepSpeed exits at its minimum; elsewhere any non-finite norm alarms.
    Targets divergence_nan 2/2, fp16_overflow 3/3 (corpus), divergence_nan_filtered 1/1
    (samples). Healthy runs: 0/19 corpus, 0/9 samples; a plain non-finite check fired on every
    healthy DeepSpeed fp16 run (4/19 corpus, 3/9 samples), and 2 in a row still on 2/19.
    """

    metric: str = "grad_norm"
    consecutive: int = 3
    min_scale: float = 1.0
    id = "non_finite_grad_norm"
    severity = "critical"
    grid = {"consecutive": [2, 3, 5, 8]}

    def conditions(self, data):
        s = _series_or_fail(data, self.metric, self.id)
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
        fp16 = pl.col("scale").is_not_null() | (pl.col("step") >= pl.col("overflow")).fill_null(False)
        floor = (pl.col("scale") <= self.min_scale).fill_null(False) | (
            pl.col("step") >= pl.col("floor")
        ).fill_null(False)
        cond = bad & (~fp16 | (pl.col("streak") >= self.consecutive) | floor)
        frame = g.select("rid", "key", "step", cond=cond, _l0="value")
        return frame, [self.metric], data.run_ids(s["rid"].unique().to_list())


@dataclass(frozen=True)
class LossScaleCollapse(Detector):
    """fp16 loss-scale collapse from DeepSpeed's own evidence: `overflows` or more OVERFLOW
    notices within `window` steps, or the minimum-loss-scale exit. Hysteresis notices count
    (each skips a step). Defaults 5 in 50 steps.

    Targets fp16_overflow: 3/3 corpus, 1/1 samples. Healthy fp16 runs overflow now and then as
    the scaler probes a larger scale: 0/19 healthy at 5 in 50, 1/19 at 3 in 50.
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
            return pl.DataFrame(schema=_FRAME), ["overflows in window"], sorted(data.runs)
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


# ---- loss spikes, divergence, drops --------------------------------------------------------------
@dataclass(frozen=True)
class SigmaSpike(Detector):
    """Flags `metric` above mean + k·sigma of its previous `window` finite values (one-sided),
    once that window has filled and the lr warm-up has ended.

    Parameters: metric (name); window (values); k (sigmas); exclude_flagged (keep flagged points
    out of the baseline, as metaseq and Lightning do; off in OLMo and llm-foundry). Anchors:
    OLMo-core StabilityMonitor (128, 6σ); the guides' SPIKE (100, 3σ). Defaults 50, 5σ: a
    100-step window still holds the early fall of the loss, whose σ hides a spike, and 3σ trips
    on noise (the largest healthy excursion in the corpus and samples is 4.1σ over 50 steps).
    Targets loss_spike 3/3, loss_spike_unrecovered 2/2 and the sudden rises of
    attention_collapse, dead_ffn, divergence_nan, memory_blowup (2/2 each; corpus). Healthy
    runs: 0/19 corpus, 0/10 samples; the guides' 3σ/100 fired on 1/19 and 3/10 and caught 1/3
    recovered spikes.
    """

    metric: str = "loss"
    window: int = 50
    k: float = 5.0
    exclude_flagged: bool = False
    cooldown: int = 20
    id = "loss_spike"
    severity = "warning"
    grid = {"k": [3.0, 4.0, 5.0, 6.0, 8.0], "window": [20, 50, 100]}

    def conditions(self, data):
        return _sigma_frame(data, self.metric, self.window, self.k, +1, self.exclude_flagged, self.id)


@dataclass(frozen=True)
class SigmaDrop(SigmaSpike):
    """Flags `metric` below mean − k·sigma of its previous `window` finite values for `for_steps`
    steps, after warm-up: a sudden, lasting drop (a data leak, a reset, a logging bug).

    The guides' DROP (2σ over 100 steps, one step) fires on a loss that is still falling and on
    plain noise (a one-sided 2σ test trips about once in 44 steps): 14/19 healthy corpus runs,
    7/10 samples. At 4σ held for 5 steps: 0/19 and 0/10. Target: data leaks and resets, a kind
    neither corpus holds, so its recall is unmeasured.
    """

    k: float = 4.0
    for_steps: int = 5
    id = "loss_drop"
    severity = "info"
    grid = {"k": [3.0, 4.0, 6.0], "for_steps": [1, 5, 10]}

    def conditions(self, data):
        return _sigma_frame(data, self.metric, self.window, self.k, -1, self.exclude_flagged, self.id)


@dataclass(frozen=True)
class OlmoSpike(SigmaSpike):
    """OLMo-core StabilityMonitor: metric > mean + 6σ of the last 128 values (after warm-up).

    Targets the large spikes: divergence_nan 2/2, loss_spike_unrecovered 2/2, 1 of 2 or 3 of
    the collapses and recovered spikes (corpus); the 128-value window makes it quiet in the
    first 128 steps. Healthy runs: 0/19 corpus, 0/10 samples.
    """

    window: int = 128
    k: float = 6.0
    id = "olmo_spike"
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
    attention_collapse, dead_ffn, memory_blowup, divergence_nan: 2/2 each (corpus), recovered
    spikes 0/3. Healthy runs: 0/19 corpus, 0/10 samples. At 10 % and 30 steps it also fired on
    2/3 recovered spikes; below a 3 % rise, healthy noise trips it.
    """

    metric: str = "loss"
    weight: float = 0.9
    rise: float = 0.2
    for_steps: int = 50
    id = "loss_divergence"
    severity = "critical"
    grid = {"rise": [0.05, 0.1, 0.2, 0.3], "for_steps": [10, 20, 30, 50]}

    def conditions(self, data):
        s = _series_or_fail(data, self.metric, self.id)
        e, best = _ema_best(_group_starts(s), s["value"].to_numpy().astype(np.float64), float(self.weight))
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # inf: a rise past any bound
            ratio = e / best - 1.0
        frame = s.select("rid", "key", "step", cond=pl.Series(ratio > self.rise), _l0=pl.Series(ratio))
        frame = _after_warmup(frame, data)
        return frame, ["EMA rise over its best"], data.run_ids(s["rid"].unique().to_list())


@dataclass(frozen=True)
class LlmFoundrySpike(Detector):
    """llm-foundry KillLossSpike: loss ≥ ratio × mean of the last `window` values on more than
    `patience` consecutive steps. Defaults window 100, ratio 2, patience 4 (fires on the 5th).

    Targets losses that double and stay: loss_spike_unrecovered, attention_collapse,
    memory_blowup, divergence_nan 2/2 each, dead_ffn 1/2 (corpus); a spike that recovers within
    5 steps is missed by design (recovered spikes 0/3). Healthy runs: 0/19 corpus, 0/10 samples.
    """

    metric: str = "loss"
    window: int = 100
    ratio: float = 2.0
    for_steps: int = 5
    id = "llmfoundry_loss_spike"
    severity = "critical"
    grid = {"ratio": [1.3, 1.5, 2.0, 3.0]}

    def when(self):
        return f"{self.metric} >= {self.ratio} * mean({self.metric}, {self.window})"


@dataclass(frozen=True)
class MegatronSpike(Detector):
    """Megatron is_unexpectedly_large: |x| ≥ factor × max of the first `baseline` finite values,
    for finite x (Megatron checks NaN/Inf separately). Defaults factor 10, baseline 100.

    Targets exploding gradients: dead_ffn, divergence_nan, loss_spike_unrecovered 2/2 each,
    fp16_overflow 1/3 (corpus). Misses slow drifts and anything within 10x of the first steps,
    by design. Healthy runs: 0/19 corpus, 0/9 samples; counting an fp16 skip's Inf as large, it
    fired on every healthy DeepSpeed run (3/9 samples).
    """

    metric: str = "grad_norm"
    baseline: int = 100
    factor: float = 10.0
    id = "megatron_unexpectedly_large"
    severity = "critical"
    grid = {"factor": [3.0, 5.0, 10.0, 20.0]}

    def when(self):
        x = f"abs({self.metric})"
        return f"{x} >= {self.factor} * max_first({self.metric}, {self.baseline}) and {x} < 1e308"


# ---- gradients ------------------------------------------------------------------------------------
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

    Targets exploding gradients: balance_loss_dominates 3/3, dead_ffn, divergence_nan,
    loss_spike_unrecovered 2/2 each, loss_spike 2/3, fp16_overflow 1/3 (corpus). Healthy runs:
    0/19 corpus, 0/9 samples (healthy norms stay within 1.5x their EMA: at k=1.3, 4/19). An EMA
    over every value, Inf included, fired on every healthy DeepSpeed run (3/9 samples).
    """

    metric: str = "grad_norm"
    beta: float = 0.95
    k: float = 3.0
    warmup: int = 20
    cooldown: int = 20
    id = "ema_grad_spike"
    grid = {"k": [2.0, 3.0, 5.0, 8.0]}

    def conditions(self, data):
        s = _series_or_fail(data, self.metric, self.id)
        r = _ema_ratio(_group_starts(s), s["value"].to_numpy().astype(np.float64), self.beta, self.k)
        frame = s.select("rid", "key", "step", cond=pl.Series(r > self.k), _l0=pl.Series(r))
        return _after_warmup(frame, data), ["grad norm / EMA"], data.run_ids(s["rid"].unique().to_list())


@dataclass(frozen=True)
class VanishingGradients(Detector):
    """The gradient norm fell below `fraction` of its mean over the previous `window` finite
    values, for `for_steps` steps (SageMaker VanishingGradient and DeepDiagnosis use an absolute
    1e-7; relative to the run's own level it needs no knowledge of the model's scale).

    Targets attention_collapse and memory_blowup, whose output path is frozen: 2/2 each, about
    10 steps after the onset (corpus). Healthy runs: 0/19 corpus, 0/9 samples; an lr schedule
    cut to zero leaves the gradient norm where it is.
    """

    metric: str = "grad_norm"
    fraction: float = 0.1
    window: int = 50
    for_steps: int = 5
    id = "vanishing_gradients"
    severity = "critical"
    grid = {"fraction": [0.02, 0.05, 0.1, 0.2], "for_steps": [3, 5, 10]}

    def conditions(self, data):
        s = _series_or_fail(data, self.metric, self.id)
        base = (
            _finite_or_null()
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

    Fires only once the gradients are nearly gone, 60-150 steps after a collapse (samples:
    attention_collapse and memory_jump at +146 and +148, past the 100-step horizon): a late
    confirmation. Corpus: divergence_nan and loss_spike_unrecovered 1/2 each. Healthy: 0/11.
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

    Targets gradients that explode and stay large: balance_loss_dominates 3/3, dead_ffn,
    divergence_nan, loss_spike_unrecovered 2/2 each (corpus). Healthy runs: 0/19 corpus, 0/9
    samples; at 2 % it fired on 4/19. A run clipped at a small max_norm on purpose trips it:
    set max_norm to the run's clip value.
    """

    max_norm: float = 1.0
    window: int = 100
    share: float = 0.2
    id = "clip_saturation"
    grid = {"share": [0.2, 0.3, 0.5, 0.8]}

    def conditions(self, data):
        s = _series_or_fail(data, "grad_norm", self.id)
        frac = (
            (pl.col("value") >= self.max_norm).cast(pl.Float64).rolling_mean(self.window).over("rid", "key")
        )
        frame = s.select("rid", "key", "step", cond=(frac >= self.share).fill_null(False), _l0=frac)
        return frame, ["clipped share"], data.run_ids(s["rid"].unique().to_list())


# ---- the guides' patterns -----------------------------------------------------------------------
@dataclass(frozen=True)
class PatternP1(Detector):
    """The guides' P1: grad_norm < 1e-5 and attention entropy < 0.3 for 5 steps (attention
    collapse with vanishing gradients). Targets attention_collapse: 2/2 corpus, 1/1 samples,
    but late (about 50 steps after the onset: the gradients take that long to fall below 1e-5;
    vanishing_gradients sees it within 10). Healthy: 0/15 corpus, 0/7 samples. Converged easy
    tasks also have peaked attention."""

    grad_threshold: float = 1e-5
    entropy_threshold: float = 0.3
    for_steps: int = 5
    id = "P1_attention_collapse"
    severity = "critical"
    grid = {"grad_threshold": [1e-7, 1e-5, 1e-3, 1e-2]}

    def when(self):
        return f"grad_norm < {self.grad_threshold} and attn_entropy < {self.entropy_threshold}"


@dataclass(frozen=True)
class PatternP2(Detector):
    """The guides' P2: FFN input std < 0.005 and LayerNorm input std < 0.05 for 5 steps (dead
    or saturated FFN: every token reaches the FFN as the same vector). Per layer (glob).
    Targets dead_ffn: 2/2 corpus, 1/1 samples, about 40 steps after the onset (the stds decay
    slowly). Healthy: 0/15 corpus, 0/7 samples."""

    ffn_threshold: float = 0.005
    ln_threshold: float = 0.05
    for_steps: int = 5
    id = "P2_dead_ffn"
    severity = "critical"
    grid = {"ffn_threshold": [0.005, 0.05, 0.2]}

    def when(self):
        return f"`ffn_input_std/*` < {self.ffn_threshold} and ln_input_std < {self.ln_threshold}"


@dataclass(frozen=True)
class PatternP3(Detector):
    """The guides' P3: train loss falling while the eval metric moves < 0.001, for 10 evals
    (evaluated at eval steps). Targets overfitting with a flat eval metric, a kind neither corpus
    holds (their overfitting runs' eval loss rises: 0/4); early in training, evals that barely
    move are normal. Healthy: 0/15 corpus, 0/7 samples."""

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
    grad_norm < 1e-3 (a leak while training stalls). Metric `memory_gb` (the process memory; accelerator memory is `memory_allocated_gb`).
    Targets memory_blowup: 2/2 corpus, 1/1 samples, about 25 steps after the jump (the gradients
    must fall first). A leak without vanishing gradients (memory_leak) is not its case: 0/2.
    Healthy: 0/15 corpus, 0/7 samples."""

    jump_gb: float = 3.0
    window: int = 50
    grad_threshold: float = 1e-3
    id = "P4_memory_jump"
    severity = "critical"

    def when(self):
        return f"memory_gb - min(memory_gb, {self.window}) > {self.jump_gb} and grad_norm < {self.grad_threshold}"


# ---- plateaus and overfitting --------------------------------------------------------------------
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

    Targets overfitting (the eval loss stops improving): 4/4 corpus. Healthy: 0/15 corpus, 0/7
    samples, but these healthy runs are short and still improving at their end: a converged
    healthy run plateaus too, a signal to act on (lower the lr, stop), not a failure by itself.
    """

    metric: str = "eval_loss"
    threshold: float = 1e-4
    relative: bool = True
    patience: int = 5
    id = "plateau"
    severity = "info"
    grid = {"patience": [3, 5, 10, 20]}

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
class LrCollapse(Detector):
    """The learning rate fell below `fraction` of its peak so far for `for_steps` logged steps:
    a scheduler that decays far too fast stalls the run on a plateau high above where it would
    have gone.

    Targets plateau caused by the schedule: 3/3 corpus, 1/1 samples. It also fires after an lr
    burst, which sets the peak (loss_spike 2/3). Schedules that anneal towards zero cross the
    line near their end: healthy runs 0/19 corpus and 0/10 samples at 2 % and 10 steps (a linear
    decay to 0 stays quiet), but 4/19 at 10 %.
    """

    fraction: float = 0.02
    for_steps: int = 10
    id = "lr_collapse"
    severity = "warning"
    grid = {"fraction": [0.005, 0.01, 0.02, 0.05], "for_steps": [5, 10, 20]}

    def conditions(self, data):
        s = _series_or_fail(data, "lr", self.id)
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
    (losslint / UMLAUT / AUTOTRAINER style). Evaluated at eval steps. Targets overfitting: 2/4
    corpus (the HF runs evaluate every 10 steps and their eval wobbles), 1/1 samples. Healthy:
    0/15 corpus, 0/7 samples."""

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
    values (SageMaker Overfit; r=0.1).

    Targets overfitting: 4/4 corpus, 1/1 samples. It also fires at the first evaluation after
    anything that breaks the model (the eval sees the broken model while the train mean still
    remembers the good one): attention_collapse, dead_ffn, divergence_nan, loss_spike,
    memory_blowup 2/2 each, router_collapse 2/3: the widest single built-in, wherever eval
    loss is logged. Healthy: 0/15 corpus, 0/7 samples; at 2 %, 1/15. Small datasets and
    regularised runs have a standing gap.
    """

    ratio: float = 0.1
    train_window: int = 20
    id = "overfit_gap"
    on = "eval_loss"
    severity = "info"
    grid = {"ratio": [0.05, 0.1, 0.2, 0.3]}

    def when(self):
        m = f"mean(loss, {self.train_window})"
        return f"(eval_loss - {m}) / {m} > {self.ratio}"


# ---- memory ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MemoryPressure(Detector):
    """Memory above `percent` % of its budget: GPU reserved memory (OLMo-core gpu_memory_monitor
    warns at 95), or RSS against a memory limit, whichever the run logs (`metrics`, first found);
    a run that logs no percentage but reserved (or process) memory and the total (torch.cuda
    memory stats, nvidia-smi's memory.used/memory.total) gets it derived.

    Targets memory_leak, shortly before the OOM kill: 2/2 corpus (about 50 steps after the
    onset). Healthy: 0/1 (only one healthy corpus run logs a budget).
    """

    percent: float = 90.0
    metrics: tuple[str, ...] = ("memory_reserved_pct", "*reserved mem (%)", "*rss_pct_of_budget")
    id = "memory_pressure"
    grid = {"percent": [70.0, 80.0, 90.0, 95.0]}

    def conditions(self, data):
        try:
            s = _first_series(data, self.metrics, self.id)
        except ReplayError:  # no percentage logged: reserved (or used) memory against the total
            used = _first_series(data, ("memory_reserved_gb", "memory_gb"), self.id)
            total = _first_series(data, ("memory_total_gb",), self.id).select("rid", "step", total="value")
            s = used.join_asof(total.sort("rid", "step"), on="step", by="rid", check_sortedness=False)
            s = (
                s.drop_nulls("total")
                .with_columns(value=100 * pl.col("value") / pl.col("total"))
                .drop("total")
            )
        frame = s.select(
            "rid", "key", "step", cond=(pl.col("value") > self.percent).fill_null(False), _l0="value"
        )
        return frame, ["memory % of budget"], data.run_ids(s["rid"].unique().to_list())


@dataclass(frozen=True)
class MemoryGrowth(Detector):
    """Memory more than `growth` above its minimum of the previous `window` logged values for
    `for_steps` steps (runmedic memory_growth, SageMaker GPUMemoryIncrease): a leak or a sudden
    allocation. Quiet while the window fills, when allocators and optimizer states settle.

    Targets memory_leak 2/2 (about 10 steps after the onset, long before the OOM) and
    memory_blowup 2/2 (corpus). Healthy: 0/15 corpus, 0/7 samples; at 10 %, 1/15 (MoE runs'
    memory drifts up by about that).
    """

    growth: float = 0.3
    window: int = 50
    for_steps: int = 5
    id = "memory_growth"
    severity = "warning"
    grid = {"growth": [0.1, 0.2, 0.5, 1.0]}

    def when(self):
        return f"memory_gb > {1 + self.growth} * min(memory_gb, {self.window})"


# ---- mixture of experts --------------------------------------------------------------------------
def _moe_pairs(data: SeriesData, numerator: str, denominator: str) -> pl.DataFrame:
    """(rid, key, step, value = num / den) for every pair of tags `<prefix>numerator` and
    `<prefix>denominator` a run logs (one evaluation per prefix, e.g. per MoE layer)."""
    t = data.tags_frame.filter(pl.col("tag").str.ends_with(numerator)).with_columns(
        prefix=pl.col("tag").str.slice(0, pl.col("tag").str.len_chars() - len(numerator))
    )
    d = data.tags_frame.filter(pl.col("tag").str.ends_with(denominator)).with_columns(
        prefix=pl.col("tag").str.slice(0, pl.col("tag").str.len_chars() - len(denominator))
    )
    pairs = t.join(d, on=["rid", "prefix"], suffix="_d").select("rid", "tid", "tid_d", "tag")
    parts = []
    for rid, tid, tid_d, tag in pairs.iter_rows():
        num = data.series(Name(tag, True, 0)).filter(pl.col("rid") == rid)
        den = data.series(Name(data.tag_name[tid_d], True, 0)).filter(pl.col("rid") == rid)
        j = num.join(den.select("step", d="value"), on="step").select(
            "rid", key=pl.lit(tid, pl.Int32), step="step", value=pl.col("value") / pl.col("d")
        )
        parts.append(j)
    if not parts:
        return pl.DataFrame(schema={"rid": pl.Int32, "key": pl.Int32, "step": pl.Int64, "value": pl.Float64})
    return pl.concat(parts).sort("rid", "key", "step")


@dataclass(frozen=True)
class MoeImbalance(Detector):
    """MoE router imbalance: max / mean expert load > `ratio` (5) in any layer, for `for_steps`
    steps; the layer's `...max_load` and `...mean_load` tags (OLMo-core moe_handler style).

    Targets router_collapse: 3/3 corpus, 15-45 steps after the onset. Healthy MoE runs (top-1
    and top-2, 8 and 16 experts): 0/4; at 2, 3/4 (top-1 routing runs near 2).
    """

    ratio: float = 5.0
    for_steps: int = 5
    id = "moe_imbalance"
    grid = {"ratio": [2.5, 3.0, 4.0, 5.0]}

    def conditions(self, data):
        s = _moe_pairs(data, "max_load", "mean_load")
        if s.is_empty():
            raise ReplayError(
                f"{self.id}: no run logs <layer>max_load and <layer>mean_load tags; available {data.available()}"
            )
        frame = s.select(
            "rid", "key", "step", cond=(pl.col("value") > self.ratio).fill_null(False), _l0="value"
        )
        return frame, ["max / mean expert load"], data.run_ids(s["rid"].unique().to_list())


@dataclass(frozen=True)
class BalanceLossShare(Detector):
    """MoE balance loss above `share` (30 %) of the total loss for `for_steps` steps: the router's
    auxiliary loss drives the training instead of the language model. Tags `...balance_loss` (or
    `...load balancing loss`) and `...total_loss` (else the canonical loss).

    Targets balance_loss_dominates: 3/3 corpus, within 5 steps. A negative coefficient (a
    router_collapse cause) makes the balance loss dominate as well: 2/3. Healthy MoE runs: 0/4
    (their share is 1-4 %).
    """

    share: float = 0.3
    for_steps: int = 5
    id = "balance_loss_share"
    grid = {"share": [0.1, 0.2, 0.3, 0.5]}

    def conditions(self, data):
        bal = _first_series(data, ("*balance_loss", "*load balancing loss"), self.id)
        total = _first_series(data, ("*total_loss", "loss"), self.id)
        j = bal.join(total.select("rid", "step", total="value").unique(["rid", "step"]), on=["rid", "step"])
        share = pl.col("value") / pl.col("total")
        frame = j.sort("rid", "key", "step").select(
            "rid", "key", "step", cond=(share > self.share).fill_null(False), _l0=share
        )
        return frame, ["balance loss / total loss"], data.run_ids(j["rid"].unique().to_list())


# ---- the registry (one line per detector) --------------------------------------------------------
BUILTINS: list[Detector] = [
    NonFinite(),
    NonFiniteGradNorm(),
    LossScaleCollapse(),
    SigmaSpike(),
    SigmaDrop(),
    OlmoSpike(),
    LossDivergence(),
    LlmFoundrySpike(),
    MegatronSpike(),
    EmaGradSpike(),
    VanishingGradients(),
    GradientFlow(),
    ClipSaturation(),
    PatternP1(),
    PatternP2(),
    PatternP3(),
    PatternP4(),
    Plateau(),
    LrCollapse(),
    Overfitting(),
    OverfitGap(),
    MemoryPressure(),
    MemoryGrowth(),
    MoeImbalance(),
    BalanceLossShare(),
]


def builtin_rules() -> list[Rule]:
    return [d.rule() for d in BUILTINS]
