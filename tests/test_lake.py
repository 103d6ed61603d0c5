"""Logs in object storage: ingest s3://bucket/prefix from a real S3-compatible server (moto's
standalone server on loopback, started here), incrementally by ETag, size and ranged reads."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ingest.source import is_url, local_path, resolve, sync
from tests.conftest import ingest_paths

boto3 = pytest.importorskip("boto3")
s3fs = pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

SAMPLES = Path(__file__).resolve().parent.parent / "sample_runs"
RUNS = ("healthy_seed0", "keras_csvlogger_appended", "trl_sft_console", "healthy_hf_trainer")
CREDS = {"key": "x", "secret": "y"}
POINTS = "SELECT run_id, tag, step, value, wall_time FROM scalars ORDER BY ALL"  # every point, exactly


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3_server():
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-p", str(port), "-H", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail("moto's S3 server did not start")
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def bucket(s3_server, request):
    """A fresh bucket (named after the test) and the storage options that reach it."""
    name = request.node.name.replace("_", "-")[:60].lower()
    client = boto3.client(
        "s3",
        endpoint_url=s3_server,
        aws_access_key_id="x",
        aws_secret_access_key="y",
        region_name="us-east-1",
    )
    client.create_bucket(Bucket=name)
    opts = {**CREDS, "client_kwargs": {"endpoint_url": s3_server}}
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **opts)
    return name, fs, opts


@pytest.fixture
def lake(tmp_path) -> Path:
    """A few real sample runs in one folder."""
    root = tmp_path / "lake"
    for run in RUNS:
        shutil.copytree(SAMPLES / run, root / run)
    return root


def _upload(fs, local: Path, url: str) -> None:
    fs.put(str(local), url, recursive=True)
    fs.invalidate_cache()


def _ingest_url(store, url, opts):
    paths, reports = resolve([url], store.root, opts)
    return ingest_paths(store, *paths), reports[0]


def test_urls_and_local_paths_tell_apart(tmp_path):
    assert is_url("s3://b/p") and is_url("gs://b") and is_url("az://c/p")
    assert not is_url(str(tmp_path)) and not is_url("file:///tmp/x") and not is_url("C:/runs")
    assert local_path("file:///tmp/x%20y") == Path("/tmp/x y")
    paths, reports = resolve([f"file://{tmp_path}"], tmp_path / "store")
    assert paths == [tmp_path] and reports == []


def test_ingest_from_s3_equals_the_local_folder(bucket, lake, tmp_path):
    name, fs, opts = bucket
    _upload(fs, lake, f"{name}/lake")
    from workbench.store import Store

    local, remote = Store(tmp_path / "local"), Store(tmp_path / "remote")
    ingest_paths(local, lake)
    report, synced = _ingest_url(remote, f"s3://{name}/lake", opts)
    assert synced.objects > 0 and synced.fetched == synced.objects and synced.appended == 0
    assert sorted(report.runs) == sorted(RUNS)
    want = local.query(POINTS)
    assert want.height > 5000 and want["run_id"].n_unique() == len(RUNS)
    assert remote.query(POINTS).equals(want)
    runs = "SELECT run_id, status, points, tags FROM runs ORDER BY run_id"
    assert remote.query(runs).equals(local.query(runs))
    # checkpoints stay in the bucket (no logs, and often terabytes)
    assert not list(synced.mirror.rglob("checkpoint-*"))


def test_appended_objects_are_read_by_range_and_unchanged_ones_not_at_all(bucket, lake, tmp_path):
    from workbench.store import Store

    name, fs, opts = bucket
    url = f"s3://{name}/lake"
    _upload(fs, lake, f"{name}/lake")
    store = Store(tmp_path / "store")
    first, _ = _ingest_url(store, url, opts)

    again, synced = _ingest_url(store, url, opts)  # nothing changed: nothing fetched, nothing read
    assert (synced.fetched, synced.appended, synced.bytes) == (0, 0, 0)
    assert synced.unchanged == synced.objects
    assert (again.files_read, again.bytes_read, again.points) == (0, 0, 0)
    assert again.files_unchanged == first.files_read

    # the trainer writes more: a JSONL line and more TensorBoard records, uploaded again whole
    jsonl = lake / "healthy_seed0" / "metrics.jsonl"
    line = b'{"step": 100000, "loss": 0.125, "lr": 0.0001}\n'
    jsonl.write_bytes(jsonl.read_bytes() + line)
    events = next((lake / "healthy_seed0" / "tb").glob("*tfevents*"))
    old_size = events.stat().st_size
    from tensorboardX import SummaryWriter

    extra = tmp_path / "extra"
    with SummaryWriter(str(extra)) as w:
        w.add_scalar("train/loss", 0.5, 100001)
    new_records = next(extra.glob("*tfevents*")).read_bytes()
    events.write_bytes(events.read_bytes() + new_records)
    fs.put_file(str(jsonl), f"{name}/lake/healthy_seed0/metrics.jsonl")
    fs.put_file(str(events), f"{name}/lake/healthy_seed0/tb/{events.name}")

    grown, synced = _ingest_url(store, url, opts)
    assert (synced.appended, synced.fetched) == (2, 0)
    assert synced.bytes == len(line) + len(new_records)  # only the new bytes crossed the network
    assert grown.files_read == 2
    assert grown.bytes_read == len(line) + (events.stat().st_size - old_size)
    assert store.query("SELECT value FROM scalars WHERE step = 100000 AND tag = 'loss'")[
        "value"
    ].to_list() == [0.125]
    assert store.query("SELECT value FROM scalars WHERE step = 100001")["value"].to_list() == [0.5]

    # the same store equals a fresh ingest of the grown local folder
    fresh = Store(tmp_path / "fresh")
    ingest_paths(fresh, lake)
    assert store.query(POINTS).equals(fresh.query(POINTS))


def test_a_rewritten_object_is_fetched_whole_and_a_deleted_one_removed(bucket, lake, tmp_path):
    from workbench.store import Store

    name, fs, opts = bucket
    url = f"s3://{name}/lake"
    _upload(fs, lake, f"{name}/lake")
    store = Store(tmp_path / "store")
    _ingest_url(store, url, opts)
    log = lake / "keras_csvlogger_appended" / "training.log"
    text = log.read_bytes()
    log.write_bytes(text.replace(b"0.", b"1.", 1) + text.splitlines(keepends=True)[-1])  # grown, not appended
    fs.put_file(str(log), f"{name}/lake/keras_csvlogger_appended/training.log")
    fs.rm(f"{name}/lake/trl_sft_console", recursive=True)
    report, synced = _ingest_url(store, url, opts)
    assert synced.fetched == 1 and synced.appended == 0 and synced.removed > 0
    assert (synced.mirror / "keras_csvlogger_appended" / "training.log").read_bytes() == log.read_bytes()
    assert "keras_csvlogger_appended" in report.reread
    from ingest.source import as_urls

    as_urls(report, [synced])  # what the CLI prints: the object, not its copy
    assert [p for p, x in report.problems if x.kind == "rewritten"] == [
        f"{url}/keras_csvlogger_appended/training.log"
    ]
    # a vanished object's run keeps its stored points, as a deleted local file's
    assert store.query("SELECT count(*) AS n FROM scalars WHERE run_id = 'trl_sft_console'")["n"][0] > 0


def test_a_same_size_rewrite_and_a_single_object_url(bucket, lake, tmp_path):
    from workbench.store import Store

    name, fs, opts = bucket
    _upload(fs, lake / "keras_csvlogger_appended", f"{name}/lake/keras_csvlogger_appended")
    store = Store(tmp_path / "store")
    _ingest_url(store, f"s3://{name}/lake", opts)
    log = lake / "keras_csvlogger_appended" / "training.log"
    text = log.read_bytes()
    i = text.index(b"0.", text.index(b"\n"))
    log.write_bytes(text[:i] + b"1." + text[i + 2 :])  # same size, new bytes, maybe the same second
    fs.put_file(str(log), f"{name}/lake/keras_csvlogger_appended/training.log")
    report, synced = _ingest_url(store, f"s3://{name}/lake", opts)
    assert (synced.fetched, report.files_read) == (1, 1)
    fresh = Store(tmp_path / "fresh")
    ingest_paths(fresh, lake / "keras_csvlogger_appended")
    assert store.query(POINTS).equals(fresh.query(POINTS))

    one = Store(tmp_path / "one")  # a URL naming one object ingests that file, as a local path does
    report, synced = _ingest_url(one, f"s3://{name}/lake/keras_csvlogger_appended/training.log", opts)
    assert synced.objects == 1 and synced.path.name == "training.log" and report.files_read == 1
    assert one.query(POINTS).equals(fresh.query(POINTS))


def test_cli_ingests_a_bucket(bucket, lake, tmp_path, s3_server):
    name, fs, _ = bucket
    _upload(fs, lake / "keras_csvlogger_appended", f"{name}/runs/keras_csvlogger_appended")
    env = {
        **os.environ,
        "FSSPEC_S3_KEY": "x",
        "FSSPEC_S3_SECRET": "y",
        "FSSPEC_S3_ENDPOINT_URL": s3_server,
    }
    store = tmp_path / "store"
    cmd = [sys.executable, "-m", "workbench", "ingest", f"s3://{name}/runs", "--store", str(store)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"s3://{name}/runs: 1 objects" in out.stderr
    assert "ingested 1 runs" in out.stderr
    missing = subprocess.run(
        [*cmd[:4], f"s3://{name}/nothing-here", "--store", str(store)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert missing.returncode != 0 and "no such bucket or prefix" in missing.stderr


def test_sync_refuses_a_missing_bucket(s3_server, tmp_path):
    from workbench.errors import NotFoundError

    opts = {**CREDS, "client_kwargs": {"endpoint_url": s3_server}}
    with pytest.raises(NotFoundError):
        sync("s3://no-such-bucket/x", tmp_path / "store", opts)
