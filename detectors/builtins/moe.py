"""Mixture of experts: router imbalance, the balance loss's share."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from detectors.builtins.base import Detector, first_series
from detectors.language import Name
from detectors.series import ReplayError, SeriesData


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

    Targets router_collapse, some steps after the onset. Known false positives: top-1 routing
    runs near a ratio of 2, so a low ratio fires on healthy MoE runs.
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

    Targets balance_loss_dominates, within a few steps. A negative coefficient (a
    router_collapse cause) makes the balance loss dominate as well. In healthy MoE runs the
    share is a few percent.
    """

    share: float = 0.3
    for_steps: int = 5
    id = "balance_loss_share"
    grid = {"share": [0.1, 0.2, 0.3, 0.5]}

    def conditions(self, data):
        bal = first_series(data, ("*balance_loss", "*load balancing loss"), self.id)
        total = first_series(data, ("*total_loss", "loss"), self.id)
        j = bal.join(total.select("rid", "step", total="value").unique(["rid", "step"]), on=["rid", "step"])
        share = pl.col("value") / pl.col("total")
        frame = j.sort("rid", "key", "step").select(
            "rid", "key", "step", cond=(share > self.share).fill_null(False), _l0=share
        )
        return frame, ["balance loss / total loss"], data.run_ids(j["rid"].unique().to_list())
