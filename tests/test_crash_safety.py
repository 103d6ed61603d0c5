"""kill -9 at any moment, two ingests at once, readers during an ingest."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import ingest_paths
from writers import tbx_scalars

from workbench.store import Store, StoreError

RUNS, POINTS = 24, 20_000


@pytest.fixture(scope="module")
def big_tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("big")
    src = tbx_scalars(root / "_src", {"loss": [(s, s * 0.5) for s in range(POINTS)]})
    for i in range(RUNS):
        (root / f"runs/r{i:02d}").mkdir(parents=True)
        shutil.copy(src, root / f"runs/r{i:02d}" / src.name)
    shutil.rmtree(root / "_src")
    return root / "runs"


def _ingest_proc(tree, store):
    env = {**os.environ, "WORKBENCH_STORE": str(store)}
    return subprocess.Popen(
        [sys.executable, "-m", "workbench", "ingest", str(tree)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


@pytest.mark.slow
def test_kill_9_at_random_moments_then_reingest_completes(big_tree, tmp_path):
    store = Store(tmp_path / "store")
    rng = random.Random(7)
    for _ in range(5):
        p = _ingest_proc(big_tree, store.root)
        time.sleep(rng.uniform(0.3, 2.5))
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        if store.exists():  # whatever was committed is readable and consistent
            df = store.query(
                "SELECT run_id, count(*) n, count(DISTINCT step) d FROM scalars_all GROUP BY run_id"
            )
            assert all(n == d == POINTS for n, d in zip(df["n"], df["d"], strict=True))
    ingest_paths(store, big_tree)
    df = store.query("SELECT count(*) n, count(DISTINCT (run_id, step)) d, sum(value) s FROM scalars_all")
    assert df.row(0) == (RUNS * POINTS, RUNS * POINTS, RUNS * sum(s * 0.5 for s in range(POINTS)))
    parts = list((store.root / "scalars").glob("*/*.parquet"))
    assert len(parts) == RUNS  # leftovers of killed ingests were collected


def test_second_ingest_waits_then_fails_with_a_message(tmp_path):
    store = Store(tmp_path / "store")
    tbx_scalars(tmp_path / "runs/a", {"loss": [(0, 1.0)]})
    with (
        store.writer(),
        pytest.raises(StoreError, match=r"another ingest \(pid \d+ on [^,]+, .*since \d{4}-"),
    ):
        ingest_paths(store, tmp_path / "runs", wait_s=0.3)


def test_reader_never_blocks_an_ingest(tmp_path):
    store = Store(tmp_path / "store")
    tbx_scalars(tmp_path / "runs/a", {"loss": [(s, 1.0) for s in range(10)]})
    ingest_paths(store, tmp_path / "runs")
    reader = store.connect()  # an app holding a connection open
    rel = reader.sql("SELECT count(*) FROM scalars").fetchall()
    assert rel == [(10,)]
    tbx_scalars(tmp_path / "runs/b", {"loss": [(s, 1.0) for s in range(5)]})
    ingest_paths(store, tmp_path / "runs", wait_s=0)
    assert store.query("SELECT count(*) n FROM scalars")["n"][0] == 15
    # the duckdb catalog is replaced atomically and can be opened by the duckdb CLI
    import duckdb

    con = duckdb.connect(str(store.root / "catalog.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) FROM scalars").fetchone() == (15,)
