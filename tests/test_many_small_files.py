"""A run of many one-line files: its small chunks share Parquet files (not a file per log file,
which garbage collection would later unlink one by one), and ingesting the unchanged tree again
reads nothing: a stat per file, no file opened to tell its format."""

from __future__ import annotations

import json
import os

import pytest
from conftest import ingest_paths

from ingest.discover import discover
from ingest.registry import make_ingestors
from workbench.store import Store

FILES = 300


def tiny_files(folder):
    folder.mkdir(parents=True)
    for i in range(FILES):
        (folder / f"part{i:05d}.jsonl").write_text(json.dumps({"step": i, "loss": 1.0 / (i + 1)}) + "\n")
        os.utime(folder / f"part{i:05d}.jsonl", (1.7e9, 1.7e9))  # long settled


@pytest.mark.slow  # two ingests of 300 files: about 5 s on 2 cores
def test_a_run_of_many_tiny_files_shares_parts_and_an_unchanged_ingest_reads_nothing(tmp_path):
    tiny_files(tmp_path / "runs/r")
    store = Store(tmp_path / "store")
    first = ingest_paths(store, tmp_path / "runs")
    assert (first.files_read, first.problems) == (FILES, [])
    parts = sorted((store.root / "scalars").rglob("*.parquet"))
    assert len(parts) == 1, parts  # every chunk's points in one shared file
    assert store.query("SELECT count(*), count(DISTINCT step) FROM scalars").rows() == [(FILES, FILES)]
    generation = store.current_generation()
    again = ingest_paths(store, tmp_path / "runs")
    assert (again.files_read, again.files_unchanged, again.problems) == (0, FILES, [])
    assert sorted((store.root / "scalars").rglob("*.parquet")) == parts
    assert store.query("SELECT count(*) FROM scalars").rows() == [(FILES,)]
    assert store.current_generation().name >= generation.name


def test_discovery_keeps_a_known_logs_format_without_reading_it(tmp_path):
    tiny_files(tmp_path / "runs/r")
    f = tmp_path / "runs/r/part00000.jsonl"
    ingestors = make_ingestors()
    [found] = [x for x in discover(tmp_path / "runs", ingestors).files if x.path == f]
    assert found.format == "jsonl"
    # the same size and mtime as when it was read: its format is taken as known, not sniffed
    size = f.stat().st_size
    f.write_bytes(b"\x00" * size)
    os.utime(f, (1.7e9, 1.7e9))
    known = {str(f): (size, f.stat().st_mtime_ns, "jsonl")}
    assert (
        next(x for x in discover(tmp_path / "runs", ingestors, known).files if x.path == f).format == "jsonl"
    )
    # changed: sniffed again (and now no log)
    os.utime(f, (1.8e9, 1.8e9))
    assert next(x for x in discover(tmp_path / "runs", ingestors, known).files if x.path == f).format is None
