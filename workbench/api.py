"""The workbench as a library: what `import workbench as wb` offers beside `wb.Store`.

Each function is the library call behind one CLI command, with keyword arguments in place of
options (docs/python-api.md). The layers are imported when a function is first called, so
`import workbench` stays cheap.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from workbench.errors import StoreError

if TYPE_CHECKING:
    from detectors.backtest import BacktestResult
    from detectors.replay import ReplayResult
    from detectors.rules import Rule
    from ingest.report import IngestReport
    from workbench.executor import Executor
    from workbench.store import Store


def _store(store: Store | str | os.PathLike[str] | None) -> Store:
    from workbench.store import Store

    return store if isinstance(store, Store) else Store(store)


def open(path: str | os.PathLike[str] | None = None) -> Store:  # noqa: A001 - as sqlite3.connect, a library's opener
    """The existing store at `path` (default: $WORKBENCH_STORE or .workbench/); StoreError when
    there is none yet (`Store(path)` also names one not yet written, for `ingest`)."""
    store = _store(path)
    if not store.exists():
        raise StoreError(
            f"no store at {store.root}. Create one with: workbench ingest PATH --store {store.root}"
        )
    return store


def ingest(
    paths: Sequence[str | os.PathLike[str]],
    store: Store | str | os.PathLike[str] | None = None,
    *,
    progress: bool = False,
    check_crc: bool = True,
    hash_checkpoints: bool = False,
    wait_s: float = 60.0,
    executor: Executor | None = None,
) -> IngestReport:
    """Read every log under `paths` into the store, incrementally (`workbench ingest`): returns
    what it did (`runs`, `files_read`, `files_unchanged`, `points`, `problems` as (path,
    problem) pairs, `notes`, `seconds`). `progress` draws the progress bar on stderr."""
    from rich.console import Console

    from ingest.pipeline import ingest as run_ingest

    return run_ingest(
        [Path(p) for p in paths],
        _store(store),
        check_crc=check_crc,
        hash_checkpoints=hash_checkpoints,
        wait_s=wait_s,
        console=Console(stderr=True, quiet=not progress),
        executor=executor,
    )


def load_rules(path: str | os.PathLike[str]) -> list[Rule]:
    """The rules of a TOML rule file (parsed, never evaluated as code); RuleFileError says what
    is wrong and where."""
    from detectors.rules import load_rule_file

    return load_rule_file(Path(path))


def default_rules() -> list[Rule]:
    """The built-in detectors and the guides' rules (detectors/guides.toml)."""
    from detectors.replay import default_rules as defaults

    return defaults()


def replay(
    store: Store | str | os.PathLike[str] | None = None,
    rules: list[Rule] | None = None,
    *,
    runs: str | None = None,
    executor: Executor | None = None,
) -> ReplayResult:
    """Replay rules (default: `default_rules()`) over the stored runs whose id matches the glob
    `runs`, as they would have fired live, and store the alerts (`workbench replay`). The
    result's `alerts` frame holds them, `summary()` counts them per rule."""
    from detectors.replay import replay as run_replay

    return run_replay(_store(store), rules, runs, executor)


def backtest(
    store: Store | str | os.PathLike[str] | None = None,
    rules: list[Rule] | None = None,
    *,
    runs: str | None = None,
    horizon: int = 100,
    lead: int = 500,
    warmup: int = 0,
    bootstrap: int = 1000,
    tune: bool = False,
    budget: float = 1.0,
    folds: int | None = None,
    holdout: str | None = None,
    executor: Executor | None = None,
) -> BacktestResult:
    """Score rules (default: `default_rules()`) against the labelled runs (`workbench
    backtest`, the same options): `rules` (one dict per rule and sweep point), `summary`,
    `kinds`, `ensemble`, `predictors`, `tuning`; `rules_frame()`, `to_json()`, `write(dir)`."""
    from detectors.backtest import Settings
    from detectors.backtest import backtest as run_backtest

    settings = Settings(horizon=horizon, lead=lead, warmup=warmup, bootstrap=bootstrap)
    return run_backtest(
        _store(store),
        rules,
        runs,
        settings,
        tune=tune,
        budget=budget,
        folds=folds,
        holdout_glob=holdout,
        executor=executor,
    )
