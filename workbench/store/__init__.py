"""The store, the ground floor: format-blind Parquet parts, metadata generations and views.

Nothing here imports `ingest` or `detectors`; everything above reads and writes through it.
"""

from workbench.store.layout import DEFAULT_STORE, store_path
from workbench.store.store import Store, StoreError
from workbench.store.writer import CLI_LABEL_ORIGIN, StoreWriter

__all__ = ["CLI_LABEL_ORIGIN", "DEFAULT_STORE", "Store", "StoreError", "StoreWriter", "store_path"]
