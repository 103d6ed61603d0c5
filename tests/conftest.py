"""Shared helpers: a fresh store per test, ingest through the library (tests read through the
store's own API: `store.query(sql)`, `store.scalars(...)`, `store.events(...)`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from ingest.pipeline import ingest
from workbench.cli import main
from workbench.store import Store

DATA = Path(__file__).parent / "data"
SAMPLE_RUNS = Path(__file__).resolve().parent.parent / "sample_runs"


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


def ingest_paths(store: Store, *paths: Path, **kw):
    return ingest([Path(p) for p in paths], store, **kw)


def cli(*args, store: Store | None = None, columns: int = 10000) -> Result:
    """A CLI command in this process, for tests of what it prints and its exit code (tests that
    need the process itself, its stdout or exit status, run `python -m workbench`): stdout and
    stderr apart, lines `columns` wide. An exception the CLI did not turn into a message fails."""
    argv = [*map(str, args), *(["--store", str(store.root)] if store is not None else [])]
    r = CliRunner().invoke(main, argv, env={"COLUMNS": str(columns)})
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exc_info
    return r


def copy_store(store: Store, folder: Path) -> Store:
    """A private copy of `store` in `folder`, to write to. The logs it read are not copied: a
    store records their absolute paths, so the copy reads them again where they are."""
    shutil.copytree(store.root, folder / "store")
    return Store(folder / "store")


@pytest.fixture(scope="session")
def sample_runs_ingest(tmp_path_factory):
    """sample_runs/ ingested once for the whole session: (store, the ingest's report). Tests only
    read it; one that writes (replay, label, ingest, damage) works on `copy_store` of it."""
    store = Store(tmp_path_factory.mktemp("sample_runs") / "store")
    return store, ingest_paths(store, SAMPLE_RUNS)


@pytest.fixture(scope="session")
def sample_runs_store(sample_runs_ingest) -> Store:
    return sample_runs_ingest[0]


@pytest.fixture(scope="session")
def sample_runs_replay(sample_runs_store, tmp_path_factory):
    """A copy of the sample_runs store with the built-ins' alerts (`workbench replay`), and the
    replay's result. Read only."""
    from detectors.replay import replay

    store = copy_store(sample_runs_store, tmp_path_factory.mktemp("replayed"))
    return store, replay(store, None, None)


@pytest.fixture(scope="session")
def replayed_sample_runs(sample_runs_replay) -> Store:
    return sample_runs_replay[0]
