"""Many runs: every executor stages the same rows; compaction keeps every point and the store's
integrity; the vectorised JSONL reader gives the line reader's points."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from ingest.jsonl import RecordsToPoints, block_points
from ingest.pipeline import ingest
from tests.writers import tbx_scalars
from workbench.executor import LocalExecutor
from workbench.store import Store

ORDER = "ORDER BY run_id, tag, step, source_file, segment"


def _runs(root: Path) -> Path:
    for i in range(4):
        run = root / f"run{i}"
        run.mkdir(parents=True)
        lines = [
            json.dumps({"step": s, "loss": 2.0 / s, "lr": 1e-4, "timestamp": 1.7e9 + s})
            for s in range(1, 120)
        ]
        if i == 1:
            lines.insert(50, "{not json")  # a block the vectorised reader leaves to the line reader
        (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        with open(run / "training.log", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["epoch", "accuracy", "loss"])
            for e in range(5):
                w.writerow([e, 0.5 + e / 10, 1.0 / (e + 1)])
        tbx_scalars(run / "tb", {"train/loss": [(s, 1.0 / s) for s in range(1, 30)]})
    return root


def _tables(store: Store) -> dict[str, pl.DataFrame]:
    con = store.connect()
    try:
        return {
            "scalars_all": con.sql(f"SELECT * FROM scalars_all {ORDER}").pl(),
            "problems": con.sql('SELECT * FROM problems ORDER BY path, "offset", kind').pl(),
            "files": con.sql("SELECT * EXCLUDE (ingested_at, mtime) FROM files ORDER BY path").pl(),
            "chunks": con.sql("SELECT * FROM _chunks ORDER BY chunk_id").pl(),
        }
    finally:
        con.close()


def test_every_executor_stages_the_same_rows(tmp_path):
    runs = _runs(tmp_path / "runs")
    one, two = Store(tmp_path / "s1"), Store(tmp_path / "s2")
    r1 = ingest([runs], one, executor=LocalExecutor(1))
    r2 = ingest([runs], two, executor=LocalExecutor(2))
    assert r1.points == r2.points > 0 and len(r1.runs) == 4
    assert [p for _, p in r1.problems] == [p for _, p in r2.problems]
    assert any(p.kind == "bad_json" and p.offset == 51 for _, p in r1.problems)  # the line path still reports
    a, b = _tables(one), _tables(two)
    for name in a:
        assert a[name].equals(b[name]), name


def test_compaction_keeps_every_point_and_the_store_whole(tmp_path):
    runs = _runs(tmp_path / "runs")
    store = Store(tmp_path / "s")
    ingest([runs], store)
    before = _tables(store)["scalars_all"]
    assert store.compact() > 1
    assert store.check().ok
    assert _tables(store)["scalars_all"].equals(before)
    # a re-ingest of one grown run touches only that run's parts
    with open(runs / "run2" / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 500, "loss": 0.1}) + "\n")
    report = ingest([runs], store)
    assert report.files_read == 1 and report.runs == {"run0", "run1", "run2", "run3"}
    con = store.connect()
    got = con.sql(
        "SELECT value FROM scalars WHERE run_id = 'run2' AND tag = 'loss' AND step = 500"
    ).fetchall()
    con.close()
    assert got == [(0.1,)]
    assert store.check().ok
    # a rewritten file: its old rows stay in the compacted file but no view shows them
    (runs / "run3" / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 9.0}) + "\n")
    ingest([runs], store)
    assert store.compact() > 1
    after = _tables(store)["scalars_all"]
    jsonl = after.filter((pl.col("run_id") == "run3") & pl.col("source_file").str.ends_with("metrics.jsonl"))
    assert jsonl["value"].to_list() == [9.0]
    assert store.check().ok


@pytest.mark.parametrize(
    "records",
    [
        [
            {
                "step": s,
                "loss": 1 / s,
                "lr": None if s % 3 else 0.1,
                "time": 1.7e12 + s,
                "ok": True,
                "name": "a",
            }
            for s in range(1, 100)
        ],
        [
            {"global_step": s, "train/loss": float(s), "_timestamp": 1.7e9 + s, "epoch": s / 10}
            for s in range(100)
        ],
    ],
)
def test_vectorised_jsonl_gives_the_line_readers_points(records):
    lines = [json.dumps(r) for r in records]
    got, last = block_points(lines)
    conv = RecordsToPoints({})
    for line in lines:
        conv.add(json.loads(line))
    want = conv.points()
    assert got.tags == want.tags and last == conv.last_step
    for col in ("tag_code", "step", "wall_time", "value"):
        assert np.array_equal(getattr(got, col), getattr(want, col), equal_nan=True), col


@pytest.mark.parametrize(
    "line",
    [
        '{"step": 5, "loss": NaN}',
        '{"step": 5, "loss": "0.5"}',
        '{"step": 5, "m": {"a": 1}}',
        '{"loss": 1}',
        "[1]",
    ],
)
def test_vectorised_jsonl_leaves_odd_blocks_to_the_line_reader(line):
    lines = [json.dumps({"step": s, "loss": 1.0}) for s in range(100)] + [line]
    assert block_points(lines) is None
