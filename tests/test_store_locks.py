"""Who holds a store: the writer lock and the watch lock name their holder (pid, host, since
when); a reader's lease keeps the generation it reads through compaction and later commits,
and a lease its reader let go of (closed, or killed) keeps nothing."""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ingest_paths

from workbench.store import Store, StoreError, layout


def write_log(run: Path, steps: range) -> None:
    run.mkdir(parents=True, exist_ok=True)
    with open(run / "metrics.jsonl", "a") as f:
        for s in steps:
            f.write(json.dumps({"step": s, "loss": 1.0 / (s + 1)}) + "\n")


def points(con) -> int:
    return con.execute("SELECT count(*) FROM scalars").fetchone()[0]


def compacted_then_two_commits(store: Store, runs: Path) -> None:
    """compact (the runs' parts merged into one file), then two ingests of appended steps (the
    second writer collects what the two newest generations no longer list)."""
    assert store.compact() >= 2
    for k in range(2):
        write_log(runs / "a", range(100 + 10 * k, 110 + 10 * k))
        ingest_paths(store, runs, light=True)


def test_a_reader_kept_across_compaction_and_two_commits_still_reads(tmp_path):
    runs, store = tmp_path / "runs", Store(tmp_path / "store")
    write_log(runs / "a", range(100))
    write_log(runs / "b", range(50))
    ingest_paths(store, runs)
    con = store.connect()
    assert points(con) == 150
    read = sorted((store.root / "scalars").glob("*/*.parquet"))
    compacted_then_two_commits(store, runs)
    assert points(con) == 150  # its generation, whole: no "No files found that match the pattern"
    assert points(store.connect()) == 170
    assert all(p.exists() for p in read)
    con.close()
    del con
    gc.collect()
    write_log(runs / "a", range(120, 130))
    ingest_paths(store, runs, light=True)  # the lease is gone: this writer collects what only it kept
    assert not any(p.exists() for p in read)  # merged into another file by the compaction
    assert not list(layout.leases_dir(store.root).glob("*.lease"))


def test_a_killed_readers_lease_keeps_nothing(tmp_path):
    runs, store = tmp_path / "runs", Store(tmp_path / "store")
    write_log(runs / "a", range(100))
    ingest_paths(store, runs)
    write_log(runs / "a", range(100, 110))
    ingest_paths(store, runs, light=True)  # catalog.duckdb stays on the first generation
    reader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, workbench as wb; c = wb.Store(sys.argv[1]).connect(); "
            "print(c.execute('SELECT count(*) FROM scalars').fetchone()[0], flush=True); sys.stdin.read()",
            str(store.root),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert reader.stdout.readline().strip() == "110"
    leased = layout.current_generation(store.root)
    assert len(list(layout.leases_dir(store.root).glob(f"{leased.name}.*.lease"))) == 1
    reader.send_signal(signal.SIGKILL)
    reader.wait()
    for k in range(3):
        write_log(runs / "a", range(110 + k, 111 + k))
        ingest_paths(store, runs, light=True)
    assert not leased.exists()  # three commits on: the dead reader's generation went
    assert not list(layout.leases_dir(store.root).glob(f"{leased.name}.*"))


def test_a_second_writer_names_the_first(tmp_path):
    store = Store(tmp_path / "store")
    t0 = time.time()
    with store.writer(), pytest.raises(StoreError) as e, store.writer(wait_s=0.3):
        pass
    msg = str(e.value)
    assert f"another ingest (pid {os.getpid()} on {socket.gethostname()}" in msg
    assert "since " + time.strftime("%Y-%m-%d %H:%M", time.localtime(t0)) in msg
    assert "--wait SECONDS" in msg


def test_a_lock_file_from_before_holders_still_names_the_pid(tmp_path):
    from workbench.store.locks import read_holder

    (tmp_path / "lock").write_text("4242")
    assert read_holder(tmp_path / "lock").describe() == "pid 4242"
