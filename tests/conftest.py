"""Shared helpers: a fresh store per test, ingest through the library, query through DuckDB."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest

from ingest.pipeline import ingest
from workbench.store import Store

DATA = Path(__file__).parent / "data"


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(tmp_path / "store")


@pytest.fixture
def tmp_store(tmp_path) -> Store:
    """A fresh store, for test modules whose `store` fixture is a shared one."""
    return Store(tmp_path / "store")


@pytest.fixture
def data_copy(tmp_path) -> Path:
    """A private copy of tests/data (tests may grow, damage or delete files)."""
    dst = tmp_path / "data"
    shutil.copytree(DATA, dst)
    return dst


def q(store: Store, sql: str) -> pl.DataFrame:
    return store.connect().sql(sql).pl()


def ingest_paths(store: Store, *paths: Path, **kw):
    return ingest([Path(p) for p in paths], store, **kw)
