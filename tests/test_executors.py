"""Executors: the local path never imports Ray (nor fsspec); replay and backtest fanned out
through an executor equal the in-process ones, on a local Ray cluster too."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import copy_store

from detectors.backtest import Settings, backtest
from detectors.replay import replay
from ingest.pipeline import ingest
from workbench.errors import WorkbenchError
from workbench.executor import LocalExecutor, make_executor
from workbench.store import Store

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_runs"


@pytest.fixture(scope="module")
def samples(sample_runs_replay, tmp_path_factory) -> Store:
    return copy_store(sample_runs_replay[0], tmp_path_factory.mktemp("samples"))  # the tests replay into it


def _alerts(store: Store):
    return store.connect().sql("SELECT * FROM alerts ORDER BY ALL").pl()


@pytest.fixture(scope="module")
def in_process(sample_runs_replay, samples):
    """What replay and backtest give without an executor argument, which each executor is
    compared with: (the replay's result, the alerts it stored, the backtest JSON)."""
    want = sample_runs_replay[1]  # `samples` is a copy of the store that replay wrote
    return want, _alerts(samples), backtest(samples, None, None, Settings(bootstrap=20)).to_json()


def test_the_local_path_imports_neither_ray_nor_fsspec(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        from workbench.cli import main
        for args in (["ingest", {str(SAMPLES / "keras_csvlogger_appended")!r}], ["replay"], ["runs"]):
            try:
                main(args + ["--store", {str(tmp_path / "store")!r}], standalone_mode=False)
            except SystemExit as e:
                assert not e.code, e
        print(sorted(m for m in ("ray", "fsspec", "s3fs") if m in sys.modules))
    """)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_an_unknown_executor_and_a_stray_address_are_refused():
    with pytest.raises(WorkbenchError, match="unknown executor"):
        make_executor("dask")
    with pytest.raises(WorkbenchError, match="--address is for --executor ray"):
        make_executor("local", "ray://head:10001")


def test_ray_missing_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets without the package
    with pytest.raises(WorkbenchError, match=r"pip install -e '\.\[ray\]'"):
        make_executor("ray")


@pytest.mark.slow
def test_fanned_out_replay_and_backtest_equal_the_in_process_ones(samples, in_process):
    """Through an executor (cut into run batches x rule chunks), in this process."""
    inline = LocalExecutor(1)
    inline.workers = 3  # cut as for three workers: many tasks, all run here
    want, want_alerts, local = in_process
    got = replay(samples, None, None, executor=inline)
    assert got.alerts.equals(want.alerts) and got.evaluable == want.evaluable and got.skipped == want.skipped
    assert _alerts(samples).equals(want_alerts)
    settings = Settings(bootstrap=20)
    assert backtest(samples, None, None, settings, executor=inline).to_json() == local
    assert json.loads(local)["rules"]


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield make_executor("ray", workers=2)
    ray.shutdown()


@pytest.mark.slow
def test_ray_executor_keeps_item_order(ray_cluster):
    assert ray_cluster.workers == 2
    items = list(range(-500, 500))
    assert list(ray_cluster.map(abs, items)) == [abs(i) for i in items]
    assert list(ray_cluster.map(abs, [])) == []


@pytest.mark.slow
def test_replay_and_backtest_on_ray_equal_the_local_executor(samples, in_process, ray_cluster):
    want, want_alerts, local = in_process
    got = replay(samples, None, None, executor=ray_cluster)
    assert got.alerts.equals(want.alerts) and got.evaluable == want.evaluable
    assert _alerts(samples).equals(want_alerts)
    assert backtest(samples, None, None, Settings(bootstrap=20), executor=ray_cluster).to_json() == local


VIEWS = {  # every view a user reads, in a fixed order (file rows without their ingest times)
    "scalars_all": "SELECT * FROM scalars_all ORDER BY ALL",
    "events": "SELECT * FROM events ORDER BY ALL",
    "runs": "SELECT * EXCLUDE (ingested_at) FROM runs ORDER BY run_id",
    "file_tags": "SELECT * FROM file_tags ORDER BY ALL",
    "agreement": "SELECT * FROM agreement ORDER BY ALL",
    "checkpoints": "SELECT * FROM checkpoints ORDER BY ALL",
    "chunks": "SELECT * FROM _chunks ORDER BY chunk_id",
    "files": "SELECT * EXCLUDE (ingested_at, mtime) FROM files ORDER BY path",
    "problems": 'SELECT * FROM problems ORDER BY path, "offset", kind',
    "evidence": "SELECT * FROM _evidence ORDER BY ALL",
    "lineage": "SELECT * FROM lineage ORDER BY ALL",
    "labels": "SELECT * FROM labels ORDER BY ALL",
}


@pytest.mark.slow
def test_ingest_on_ray_equals_the_local_executor(tmp_path, ray_cluster):
    runs = tmp_path / "runs"
    for name in ("healthy_seed0", "resumed_after_kill", "keras_csvlogger_appended", "trl_sft_console"):
        shutil.copytree(SAMPLES / name, runs / name)
    local, on_ray = Store(tmp_path / "local"), Store(tmp_path / "ray")
    want = ingest([runs], local, executor=LocalExecutor(1))
    got = ingest([runs], on_ray, executor=ray_cluster)
    assert got.points == want.points > 0 and got.runs == want.runs
    assert [(p, x) for p, x in got.problems] == [(p, x) for p, x in want.problems]
    a, b = local.connect(), on_ray.connect()
    for name, sql in VIEWS.items():
        assert b.sql(sql).pl().equals(a.sql(sql).pl()), name
