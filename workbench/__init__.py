"""Training-log workbench: ingest training logs, replay and backtest alert rules, explore.

As a library (docs/python-api.md)::

    import workbench as wb
    store = wb.Store(".workbench")
    wb.ingest(["runs/"], store=store)
    store.scalars(store.runs()["run_id"][0], metric="loss")

The names below resolve on first use, so `import workbench` (and so the CLI) loads neither
polars, pyarrow nor numba until something needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workbench.api import backtest, default_rules, ingest, load_rules, open, replay
    from workbench.errors import StoreError, WorkbenchError
    from workbench.store import Store

_HOME = {
    "Store": "workbench.store",
    "open": "workbench.api",
    "ingest": "workbench.api",
    "load_rules": "workbench.api",
    "default_rules": "workbench.api",
    "replay": "workbench.api",
    "backtest": "workbench.api",
    "StoreError": "workbench.errors",
    "WorkbenchError": "workbench.errors",
}
__all__ = [
    "Store",
    "StoreError",
    "WorkbenchError",
    "backtest",
    "default_rules",
    "ingest",
    "load_rules",
    "open",
    "replay",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'workbench' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
