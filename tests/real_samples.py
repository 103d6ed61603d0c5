"""Real log samples (tests/data/real_logs) ingested as a reader's tests need them, and small
query helpers for the format tests."""

from __future__ import annotations

import csv
import json
import os
import shutil
import time
from pathlib import Path

from conftest import DATA, ingest_paths

from workbench.store import Store

REAL = DATA / "real_logs"
SAMPLES = Path(__file__).resolve().parent.parent / "sample_runs"
HELLO = (REAL / "deepspeed/hellodeepspeed_bert_zero1_fp16_console.log").read_text()


def settle(*paths):
    """Age files by an hour: the readers treat them as finished (a last line without newline counts)."""
    old = time.time() - 3600
    for p in paths:
        os.utime(p, (old, old))


def real_store(tmp_path_factory, files: list[str] = (), trees: dict[str, str] = ()) -> Store:
    """A store of real samples: each file of the `files` groups (folders of real_logs) as its own
    run, named by the file's stem before `__`; each `trees` entry (run folder -> path relative
    to real_logs) copied in its own layout. Every file settled."""
    root = tmp_path_factory.mktemp("real") / "runs"
    for group in files:
        for f in sorted((REAL / group).iterdir()):
            if f.suffix in (".tsv", ".md"):
                continue
            run = root / f.name.split("__")[0].removesuffix(".log").removesuffix(".txt")
            run.mkdir(parents=True, exist_ok=True)
            shutil.copy(f, run / f.name)
    for name, src in dict(trees).items():
        shutil.copytree(REAL / src, root / name)
    for dirpath, _, names in os.walk(root):
        settle(*(os.path.join(dirpath, n) for n in names))
    store = Store(root.parent / "store")
    ingest_paths(store, root)
    return store


def sample_store(tmp_path_factory, runs: list[str]) -> Store:
    """A store of copies of some of sample_runs/ (real training runs with real writers)."""
    root = tmp_path_factory.mktemp("samples") / "runs"
    for run in runs:
        shutil.copytree(SAMPLES / run, root / run)
    store = Store(root.parent / "store")
    ingest_paths(store, root)
    return store


def contents(store, run):
    rows = store.query(f"SELECT contents FROM files WHERE run_id = '{run}'")["contents"]
    return json.loads(rows[0])


def write_monitor_csv(folder, name, rows, header=True, mode="w"):
    """As deepspeed/monitor/csv_monitor.py writes it: header `step,<last name part>`, then rows."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (name.replace("/", "_").replace(" ", "_") + ".csv")
    with open(path, mode, newline="") as f:
        w = csv.writer(f)
        if header:
            w.writerow(["step", name.split("/")[-1]])
        w.writerows(rows)
    return path
