"""DeepSpeed's `ds_config.json`: the run's configuration (batch sizes, fp16, ZeRO, monitors).

Read before the run's other files (`is_config`), so that the monitor CSVs can turn their sample
counts into optimizer steps with `train_batch_size`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ingest.base import Batch, Ingestor, Problem, ReadContext
from ingest.lines import JsonError, read_json_file, to_float

CONFIG_KEYS = (b'"train_batch_size"', b'"train_micro_batch_size_per_gpu"', b'"zero_optimization"', b'"fp16"')


def batch_size_of(config: dict) -> int | None:
    """The run's train_batch_size from its ds_config, if known."""
    ds = config.get("ds_config") or {}
    tbs = to_float(ds.get("train_batch_size"))
    return int(tbs) if tbs else None


class DeepSpeedConfigIngestor(Ingestor):
    name = "ds_config"
    needs_head = True
    is_config = True

    def sniff(self, path: Path, head: bytes) -> bool:
        if not path.name.endswith(".json"):
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
