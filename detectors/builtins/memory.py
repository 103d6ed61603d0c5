"""Memory: pressure against a budget, growth over a window."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from detectors.builtins.base import Detector, first_series
from detectors.series import ReplayError


@dataclass(frozen=True)
class MemoryPressure(Detector):
    """Memory above `percent` % of its budget: GPU reserved memory (OLMo-core gpu_memory_monitor
    warns at 95), or RSS against a memory limit, whichever the run logs (`metrics`, first found);
    a run that logs no percentage but reserved (or process) memory and the total (torch.cuda
    memory stats, nvidia-smi's memory.used/memory.total) gets it derived.

    Targets memory_leak, shortly before the OOM kill. Few healthy runs log a budget, so its
    false positives are barely measured.
    """

    percent: float = 90.0
    metrics: tuple[str, ...] = ("memory_reserved_pct", "*reserved mem (%)", "*rss_pct_of_budget")
    id = "memory_pressure"
    grid = {"percent": [70.0, 80.0, 90.0, 95.0]}

    def conditions(self, data):
        try:
            s = first_series(data, self.metrics, self.id)
        except ReplayError:  # no percentage logged: reserved (or used) memory against the total
            used = first_series(data, ("memory_reserved_gb", "memory_gb"), self.id)
            total = first_series(data, ("memory_total_gb",), self.id).select("rid", "step", total="value")
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

    Targets memory_leak (soon after the onset, long before the OOM) and memory_blowup. Known
    false positives: MoE runs' memory drifts up slowly, so a small `growth` fires on them.
    """

    growth: float = 0.3
    window: int = 50
    for_steps: int = 5
    id = "memory_growth"
    severity = "warning"
    grid = {"growth": [0.1, 0.2, 0.5, 1.0]}

    def when(self):
        return f"memory_gb > {1 + self.growth} * min(memory_gb, {self.window})"


@dataclass(frozen=True)
class MemoryJump(Detector):
    """Host or device memory jumped above `factor` x its median over the previous `window`
    logged values, for `for_steps` values: a leak or a cache that holds on to activations, in
    the run's own units (no GB threshold: a model's size sets the level, not the ratio).

    Targets memory_blowup and memory_leak at the jump. A resumed run starts low and climbs
    back to its level: the median of the window before it stays at the old level, so it stays
    quiet. Known false positives: a run whose evaluation holds a second batch of activations
    (memory steps up once and stays).
    """

    metric: str = "memory_gb"
    factor: float = 1.3
    window: int = 5
    for_steps: int = 3
    id = "memory_jump"
    severity = "critical"
    grid = {"factor": [1.1, 1.2, 1.3, 1.5, 2.0]}

    def when(self):
        return f"{self.metric} > {self.factor} * median({self.metric}, {self.window})"
