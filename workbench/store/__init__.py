"""The store, the ground floor: format-blind Parquet parts, metadata generations and views.

Nothing here imports `ingest` or `detectors`; everything above reads and writes through it.
The writer's names resolve on first use, so a reader of the store loads neither polars nor
pyarrow.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from workbench.store.layout import DEFAULT_STORE, store_path
from workbench.store.store import Store, StoreError

if TYPE_CHECKING:
    from workbench.store.writer import CLI_LABEL_ORIGIN, StoreWriter

__all__ = ["CLI_LABEL_ORIGIN", "DEFAULT_STORE", "Store", "StoreError", "StoreWriter", "store_path"]
_WRITER = ("CLI_LABEL_ORIGIN", "StoreWriter")


def __getattr__(name: str) -> Any:
    if name not in _WRITER:
        raise AttributeError(f"module 'workbench.store' has no attribute {name!r}")
    value = getattr(importlib.import_module("workbench.store.writer"), name)
    globals()[name] = value  # resolved once
    return value
