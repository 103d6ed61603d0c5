"""What every built-in shares: the `Detector` base class, and the helpers of the detectors
computed in code (a metric's series or a clear error, the lr warm-up gate, non-finite values
kept out of baselines)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import ClassVar

import polars as pl

from detectors.language import Name
from detectors.rules import Rule
from detectors.series import ReplayError, SeriesData


@dataclass(frozen=True)
class Detector:
    """Base: subclasses are dataclasses whose fields are the parameters."""

    for_steps: int = 1
    cooldown: int = 0
    warmup: int = 0

    id = "detector"
    severity = "warning"
    description = ""
    origin = "workbench"  # who published it (Rule.origin): olmo-core, llm-foundry, megatron, zclip, ...
    in_ensemble = True  # False: scored at its published default, but no member of the any-of ensemble
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

    def conditions(self, data: SeriesData) -> tuple[pl.DataFrame, list[str], list[str]]:
        """What a detector computed in code (`when` is None) flags; the others are compiled."""
        raise NotImplementedError(f"{self.id} has a `when`: its conditions are compiled from it")

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
            origin=self.origin,
        )


RESTART_HOLD = 10  # logged points a spike rule stays quiet after a warm restart (lr_restarts)

FRAME = {"rid": pl.Int32, "key": pl.Int32, "step": pl.Int64, "cond": pl.Boolean, "_l0": pl.Float64}


def series_or_fail(data: SeriesData, metric: str, rule_id: str) -> pl.DataFrame:
    s = data.series(Name(metric, False, 0))
    if s.is_empty():
        raise ReplayError(f"{rule_id}: {metric} found in no selected run; available {data.available()}")
    return s


def first_series(data: SeriesData, names: tuple[str, ...], rule_id: str) -> pl.DataFrame:
    """Per run, the series of the first of `names` it logs: a canonical metric or tag, or a tag
    glob (`*`, one evaluation per matching tag)."""
    parts, seen = [], set[int]()
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


def after_warmup(frame: pl.DataFrame, data: SeriesData) -> pl.DataFrame:
    """`cond` kept only at steps after the run's lr warm-up (runs without a logged lr: all)."""
    ends = lr_warmup_end(data)
    j = frame.join(ends, on="rid", how="left")
    logs_lr = pl.col("rid").is_in(ends["rid"].implode())
    gate = ~logs_lr | (pl.col("warm_end").is_not_null() & (pl.col("step") >= pl.col("warm_end")))
    return j.with_columns(cond=pl.col("cond") & gate).drop("warm_end")


def finite_or_null(col: str = "value") -> pl.Expr:
    """NaN and Inf as null: window statistics then skip them (an fp16 skip must not poison a baseline)."""
    v = pl.col(col)
    return pl.when(v.is_finite()).then(v)


def lr_restarts(data: SeriesData, rise: float = 1.5) -> pl.DataFrame:
    """(rid, restart): the steps where a run's logged lr jumped above `rise` x its previous
    logged value after its warm-up, back to no more than the peak it reached before: warm
    restarts (SGDR), whose loss and gradient rises are the schedule's, not a failure. An lr
    that jumps past its earlier peak (a scheduler glitch, x100) is no restart."""
    lr = data.series(Name("lr", False, 0))
    if lr.is_empty():
        return pl.DataFrame(schema={"rid": pl.Int32, "restart": pl.Int64})
    ends = lr_warmup_end(data)
    v = pl.col("value")
    up = v > rise * v.shift(1).over("rid", "key")
    within_peak = v <= 1.01 * v.shift(1).cum_max().over("rid", "key")
    j = lr.join(ends, on="rid", how="left").filter(up & within_peak & (pl.col("step") > pl.col("warm_end")))
    return j.select("rid", restart="step").unique().sort("rid", "restart")


def quiet_after_restarts(frame: pl.DataFrame, data: SeriesData, hold: int) -> pl.DataFrame:
    """`cond` held false on the first `hold` logged points of each unit after a warm restart
    (lr_restarts): the window baselines then restart from the new regime."""
    starts = lr_restarts(data)
    if starts.is_empty() or hold <= 0:
        return frame
    j = (
        frame.with_row_index("_i")
        .sort("step")
        .join_asof(
            starts.sort("restart"),
            left_on="step",
            right_on="restart",
            by="rid",
            strategy="backward",
            check_sortedness=False,
        )
        .sort("_i")
    )
    since = pl.col("step").cum_count().over("rid", "key", "restart")
    quiet = pl.col("restart").is_not_null() & (since <= hold)
    return j.with_columns(cond=pl.col("cond") & ~quiet).drop("_i", "restart")
