"""DeepSpeed's `ds_config.json`: the run's configuration (batch sizes, fp16, ZeRO, monitors).

Read before the run's other files (`is_config`), so that the monitor series (CSV and
TensorBoard, `Train/Samples/*`) can turn their sample counts into optimizer steps.
`train_batch_size` = micro batch x gradient accumulation x world size; a config may give any two
(DeepSpeed derives the third), and the engine prints the resolved values (`train_batch_size
.... 16`, `world_size .... 1`) in its console at start (info level), which the console reader
keeps as `deepspeed_engine`. With none of these, the ratio the cross-source agreement check
finds between a monitor series and the same metric from another source is used (`learned`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ingest.base import Batch, Ingestor, Problem, ReadContext
from ingest.lines import JsonError, log_name, read_json_file, to_float

CONFIG_KEYS = (b'"train_batch_size"', b'"train_micro_batch_size_per_gpu"', b'"zero_optimization"', b'"fp16"')
# Samples per optimizer step no job reaches (2^40), and that would overflow the int64 step axis.
MAX_BATCH = 2**40


def batch_size_of(config: dict) -> tuple[int | None, str]:
    """The run's train_batch_size (samples per optimizer step), and where it came from; None
    with the reason when the run does not state a usable one (absent, or out of 1..2^40)."""
    ds = config.get("ds_config") or {}
    engine = config.get("deepspeed_engine") or {}
    for source, value in (
        ("ds_config", ds.get("train_batch_size")),
        ("the console", engine.get("train_batch_size")),
    ):
        if (tbs := to_float(value)) and tbs >= 1:
            return _checked(tbs, f"train_batch_size {value} from {source}")
    micro = to_float(ds.get("train_micro_batch_size_per_gpu") or engine.get("train_micro_batch_size_per_gpu"))
    if not micro:
        learned = (config.get("learned") or {}).get("train_batch_size")
        if learned:
            return _checked(learned, f"train_batch_size {learned} learned from {config['learned']['from']}")
        return None, "no train_batch_size or train_micro_batch_size_per_gpu in the run's ds_config or console"
    gas = to_float(ds.get("gradient_accumulation_steps") or engine.get("gradient_accumulation_steps")) or 1
    world = to_float(engine.get("world_size"))
    why = f"{micro:g} x {gas:g} gradient accumulation x world size " + (
        f"{world:g} from the console" if world else "1 (assumed: no console printed world_size)"
    )
    return _checked(micro * gas * (world or 1), f"train_batch_size {why}")


def _checked(tbs: float, how: str) -> tuple[int | None, str]:
    if not 1 <= tbs <= MAX_BATCH:  # NaN and Inf fail too
        return None, f"{how} is out of range (1..2^40) and not used"
    return int(tbs), how


class DeepSpeedConfigIngestor(Ingestor):
    name = "ds_config"
    needs_head = True
    is_config = True

    def sniff(self, path: Path, head: bytes) -> bool:
        if not log_name(path).endswith(".json"):
            return False
        return head.lstrip()[:1] == b"{" and (
            "ds_config" in path.name or sum(k in head for k in CONFIG_KEYS) >= 2
        )

    def read(self, path: Path, start: int, ctx: ReadContext) -> Iterator[Batch]:
        batch = Batch(start=0, end=path.stat().st_size, records=1)
        try:
            batch.config = {"ds_config": read_json_file(path)}
        except JsonError as e:
            batch.problems.append(
                Problem(e.lineno, "bad_json", f"line {e.lineno} column {e.colno}: {e.msg}; file skipped")
            )
        yield batch
