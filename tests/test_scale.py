"""Many runs: every executor stages the same rows; compaction keeps every point and the store's
integrity; the vectorised JSONL reader gives the line reader's points."""

from __future__ import annotations

import csv
import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from real_counts import REAL, assert_matches, expected, real_tree_store

from ingest.jsonl import RecordsToPoints, block_points
from ingest.pipeline import default_executor, ingest
from tests.writers import tbx_scalars
from workbench.executor import LocalExecutor
from workbench.store import Store, compaction, layout

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


@pytest.mark.parametrize(
    "executor", [LocalExecutor(2), LocalExecutor(1, threads=2)], ids=["processes", "threads"]
)
def test_every_executor_stages_the_same_rows(tmp_path, executor):
    runs = _runs(tmp_path / "runs")
    one, two = Store(tmp_path / "s1"), Store(tmp_path / "s2")
    r1 = ingest([runs], one, executor=LocalExecutor(1))
    r2 = ingest([runs], two, executor=executor)
    assert r1.points == r2.points > 0 and len(r1.runs) == 4
    assert [p for _, p in r1.problems] == [p for _, p in r2.problems]
    assert any(p.kind == "bad_json" and p.offset == 51 for _, p in r1.problems)  # the line path still reports
    a, b = _tables(one), _tables(two)
    for name in a:
        assert a[name].equals(b[name]), name


def test_threads_keep_order_and_hold_few_items_at_once():
    running, most = [0], [0]
    lock = threading.Lock()

    def slow_square(i: int) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.002 * (i % 3))  # later items finish first now and then
        with lock:
            running[0] -= 1
        return i * i

    got = []
    for i, x in enumerate(LocalExecutor(1, threads=3).map(slow_square, range(40))):
        got.append(x)
        assert i < 40
    assert got == [i * i for i in range(40)]
    assert 2 <= most[0] <= 3  # ran side by side, never more than a thread each


def test_many_small_runs_are_read_on_threads_and_big_ones_one_at_a_time(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    tasks = [object()] * 100
    small = default_executor(tasks, 100 * 50_000, light=False)  # type: ignore[arg-type]
    assert (small.workers, small.threads) == (1, 2)
    big = default_executor(tasks[:10], 10 * 20 << 20, light=False)  # type: ignore[arg-type]
    assert (big.workers, big.threads) == (1, 1)
    few = default_executor(tasks[:3], 3 * 50_000, light=False)  # type: ignore[arg-type]
    assert (few.workers, few.threads) == (1, 1)
    many = default_executor(tasks, 100 << 20, light=False)  # type: ignore[arg-type]
    assert many.workers == 2


def _scalar_parts(store: Store) -> list[tuple[int, str | None]]:
    """(rows, shared file or None) of the live generation's scalar parts, by chunk."""
    parts = layout.read_meta("parts", store.live_generation()).filter(pl.col("kind") == "scalars")
    return [(r["rows"], r["file"]) for r in parts.sort("chunk_id").iter_rows(named=True)]


def test_a_commit_merges_only_small_parts(tmp_path, monkeypatch):
    """Past COMPACT_AT small parts of their own, a commit merges them; a large part (a block
    of an event file) is left in its own file, since a merge would only rewrite it."""
    monkeypatch.setattr(compaction, "COMPACT_AT", 4)
    monkeypatch.setattr(compaction, "SMALL_PART", 200)
    runs = tmp_path / "runs"
    for i in range(4):
        (runs / f"run{i}").mkdir(parents=True)
        lines = [json.dumps({"step": s, "loss": 2.0 / s, "lr": 1e-4}) for s in range(1, 151)]
        (runs / f"run{i}" / "metrics.jsonl").write_text("\n".join(lines) + "\n")  # 300 points: large
    store = Store(tmp_path / "s")
    ingest([runs], store)
    query = "SELECT run_id, tag, step, value FROM scalars ORDER BY ALL"
    before = store.query(query)
    assert _scalar_parts(store) == [(300, None)] * 4  # four large parts: no merge
    for i in range(4):  # four small parts (a grown log's new lines each)
        with open(runs / f"run{i}" / "metrics.jsonl", "a") as f:
            f.write("".join(json.dumps({"step": s, "loss": 0.5}) + "\n" for s in range(151, 156)))
    ingest([runs], store)
    parts = _scalar_parts(store)  # the large parts stay in their files, the small ones are one
    assert parts[:4] == [(300, None)] * 4
    assert [rows for rows, _ in parts[4:]] == [5] * 4 and len({file for _, file in parts[4:]}) == 1
    assert parts[4][1].startswith("scalars/_compacted/")
    after = store.query(query)
    assert after.height == before.height + 20
    new = after.join(before, on=["run_id", "tag", "step"], how="anti")
    assert sorted(set(new["step"].to_list())) == [151, 152, 153, 154, 155]
    assert store.check().ok


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
    lines[10:10] = ["", "   "]  # blank lines: no records
    got, last, key, n = block_points(lines)
    assert n == len(records)
    conv = RecordsToPoints({})
    for line in filter(str.strip, lines):
        conv.add(json.loads(line))
    want = conv.points()
    assert got.tags == want.tags and last == conv.last_step and [key] == conv.step_keys
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
        '{"step": 5, "loss": 1.0, "loss": 2.0}',  # a key twice
        '{"step": 9223372036854775813, "loss": 1.0}',  # a step past int64
        '{"step": 5, "at": "2024-01-01T00:00:00"}',  # a timestamp
    ],
)
def test_vectorised_jsonl_leaves_odd_blocks_to_the_line_reader(line):
    lines = [json.dumps({"step": s, "loss": 1.0}) for s in range(100)] + [line]
    assert block_points(lines) is None


def test_real_jsonl_logs_of_other_writers_equal_their_independent_counts(tmp_path_factory):
    """Two public JSONL logs (tests/data/real/public_jsonl: a resumed plain PyTorch pretraining
    loop, Dreamer's metrics with `/` in its keys) go the vectorised way, and the store holds what
    a plain json.loads count of them holds: every line, the last write of a re-logged step current."""
    for name in ("slm_training", "dreamer_fetch_reach"):
        lines = (REAL / "public_jsonl" / name / "metrics.jsonl").read_text().splitlines()
        assert block_points(lines) is not None, name
    store = real_tree_store(
        tmp_path_factory, {"slm": "public_jsonl/slm_training", "dreamer": "public_jsonl/dreamer_fetch_reach"}
    )
    assert_matches(store, "slm", expected("public_jsonl/slm_training/metrics.jsonl"), view="scalars")
    assert_matches(
        store, "dreamer", expected("public_jsonl/dreamer_fetch_reach/metrics.jsonl"), view="scalars"
    )
    assert store.query("SELECT count(*) AS n FROM scalars_all WHERE run_id = 'slm'")["n"][0] == 4 * 398


def _losses(path: Path, values: list[float]) -> None:
    path.write_text("".join(json.dumps({"step": s, "loss": v}) + "\n" for s, v in enumerate(values, 1)))


def _run_facts(store: Store, run: str) -> tuple:
    con = store.connect()
    try:
        status = con.sql(f"SELECT status FROM runs WHERE run_id = '{run}'").fetchall()
        labels = con.sql(f"SELECT kind FROM labels WHERE run_id = '{run}'").fetchall()
        nans = con.sql(f"SELECT count(*) FROM scalars WHERE run_id = '{run}' AND isnan(value)").fetchall()
        rows = con.sql(f"SELECT count(*) FROM _parts WHERE run_id = '{run}'").fetchall()
        return status[0][0], labels, nans[0][0], rows[0][0]
    finally:
        con.close()


def test_views_see_only_current_chunks_of_a_compacted_file(tmp_path):
    """NaN rows in a compacted file are found (no value statistics to prune them by), and once
    their run is rewritten, nothing of its old rows reaches status, labels or scalars."""
    runs = tmp_path / "runs"
    for i in range(3):
        (runs / f"run{i}").mkdir(parents=True)
        _losses(runs / f"run{i}" / "metrics.jsonl", [2.0 / s for s in range(1, 40)])
    _losses(runs / "run1" / "metrics.jsonl", [2.0 / s for s in range(1, 35)] + [float("nan")] * 5)
    store = Store(tmp_path / "s")
    ingest([runs], store)
    assert store.compact() == 3
    assert _run_facts(store, "run1") == ("diverged", [("divergence_nan",)], 5, 39)
    _losses(runs / "run1" / "metrics.jsonl", [1.0 / s for s in range(1, 20)])  # rewritten, healthy
    report = ingest([runs], store)
    assert report.files_read == 1
    assert _run_facts(store, "run1") == ("unknown", [], 0, 19)
    assert _run_facts(store, "run0") == ("unknown", [], 0, 39)
    assert store.compact() == 2  # the compacted file (less run1's old rows) and run1's new part
    assert _run_facts(store, "run1") == ("unknown", [], 0, 19)
    assert store.check().ok


def test_new_chunks_never_reuse_ids_a_kept_generation_lists(tmp_path):
    from workbench.store import integrity

    run = tmp_path / "runs" / "run0"
    run.mkdir(parents=True)
    _losses(run / "a.jsonl", [1.0, 0.5])
    _losses(run / "b.jsonl", [3.0, 2.0])  # read last: the highest chunk id
    store = Store(tmp_path / "s")
    ingest([run.parent], store)
    with store.writer() as w:  # as `check --repair` drops a damaged file: the highest id is free
        w.drop_file(str(run / "b.jsonl"))
        w.commit()
    _losses(run / "c.jsonl", [7.0, 6.0])
    ingest([run.parent], store)
    gens = sorted((store.root / "meta").glob("g*"))
    ids = [set(integrity.read_tables(g)["chunks"]["chunk_id"].to_list()) for g in gens]
    assert len(ids) >= 2 and ids[-1] - ids[-2]  # the newest generation holds a new chunk ...
    assert not (ids[-1] - ids[-2]) & set().union(*ids[:-1])  # ... with an id no kept one used
    for g in gens:  # and every part each kept generation lists is as it was written
        assert (
            integrity.verify_parts(store.root, integrity.expected_parts(store.root, integrity.read_tables(g)))
            == []
        )


def test_many_small_runs_share_files_and_read_as_with_a_file_each(tmp_path, monkeypatch):
    import ingest.pipeline as pipeline

    runs = tmp_path / "runs"
    for i in range(pipeline.SHARED_MIN_RUNS + 2):
        (runs / f"r{i:02d}").mkdir(parents=True)
        tail = [float("nan")] * 3 if i == 5 else []
        _losses(runs / f"r{i:02d}" / "metrics.jsonl", [2.0 / s + i for s in range(1, 30)] + tail)
    shared = Store(tmp_path / "shared")
    ingest([runs], shared)
    with monkeypatch.context() as m:  # the same runs, a file each
        m.setattr(pipeline, "SHARED_MIN_RUNS", 10**6)
        own = Store(tmp_path / "own")
        ingest([runs], own)
    assert [p.name for p in (shared.root / "scalars").iterdir()] == ["_compacted"]
    assert len(list((own.root / "scalars").iterdir())) == pipeline.SHARED_MIN_RUNS + 2
    a, b = _tables(shared), _tables(own)
    for name in ("scalars_all", "problems", "files"):
        assert a[name].equals(b[name]), name
    assert _run_facts(shared, "r05") == ("diverged", [("divergence_nan",)], 3, 32)
    assert shared.check().ok
    # r05 rewritten: its old rows stay in the shared file, and reach no view
    _losses(runs / "r05" / "metrics.jsonl", [1.0, 0.5])
    ingest([runs], shared)
    assert _run_facts(shared, "r05") == ("unknown", [], 0, 2)
    assert shared.compact() == 2 and _run_facts(shared, "r05") == ("unknown", [], 0, 2)
    assert shared.check().ok
    _readers_list_the_parts_writers_do(shared)
    _readers_list_the_parts_writers_do(own)


def test_small_runs_stream_into_shared_files_a_row_group_at_a_time(tmp_path, monkeypatch):
    """Small chunks' points go to the shared file a row group at a time as runs are read; a
    file ends with the chunk that passes SHARED_ROWS, so no chunk spans two files, and every row
    group but a file's last is full. The views read as with a file per run."""
    import pyarrow.parquet as pq

    import ingest.pipeline as pipeline
    from workbench.store import parts as parts_mod
    from workbench.store import writer as writer_mod

    monkeypatch.setattr(parts_mod, "SHARED_ROW_GROUP", 16)
    monkeypatch.setattr(writer_mod, "SHARED_ROWS", 200)
    runs = tmp_path / "runs"
    for i in range(pipeline.SHARED_MIN_RUNS + 2):
        (runs / f"r{i:02d}").mkdir(parents=True)
        _losses(runs / f"r{i:02d}" / "metrics.jsonl", [2.0 / s + i for s in range(1, 8 + i % 30)])
    shared = Store(tmp_path / "shared")
    ingest([runs], shared)
    with monkeypatch.context() as m:
        m.setattr(pipeline, "SHARED_MIN_RUNS", 10**6)
        own = Store(tmp_path / "own")
        ingest([runs], own)
    a, b = _tables(shared), _tables(own)
    for name in ("scalars_all", "problems", "files"):
        assert a[name].equals(b[name]), name
    parts = layout.read_meta("parts", shared.live_generation()).filter(pl.col("kind") == "scalars")
    assert parts["chunk_id"].is_unique().all() and parts["file"].null_count() == 0
    by_file = (
        parts.group_by("file").agg(pl.col("rows").sum(), pl.col("rows").max().alias("largest")).sort("file")
    )
    assert by_file.height >= 5 and parts["rows"].sum() == b["scalars_all"].height
    files = sorted(
        by_file.iter_rows(named=True), key=lambda f: int(f["file"].rsplit("_", 1)[1].split(".")[0])
    )
    for k, f in enumerate(files):
        meta = pq.ParquetFile(shared.root / f["file"]).metadata
        groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        assert meta.num_rows == f["rows"] and all(g == 16 for g in groups[:-1]) and 0 < groups[-1] <= 16
        if k < len(files) - 1:  # full: ended by the chunk that passed 200 rows
            assert 200 <= f["rows"] < 200 + f["largest"]
    assert shared.check().ok
    # one file for all: its row groups are written while the runs are read, before the commit
    monkeypatch.setattr(writer_mod, "SHARED_ROWS", 10**6)
    seen: list[str] = []
    write, commit = parts_mod.SharedFile.write, writer_mod.StoreWriter.commit
    monkeypatch.setattr(parts_mod.SharedFile, "write", lambda f, t: (seen.append("rows"), write(f, t))[1])
    monkeypatch.setattr(
        writer_mod.StoreWriter, "commit", lambda w, *a, **k: (seen.append("commit"), commit(w, *a, **k))[1]
    )
    one = Store(tmp_path / "one")
    ingest([runs], one)
    assert seen.index("commit") >= 10 and set(seen[: seen.index("commit")]) == {"rows"}
    assert len(list((one.root / "scalars" / "_compacted").iterdir())) == 1
    assert _tables(one)["scalars_all"].equals(b["scalars_all"])


def _readers_list_the_parts_writers_do(store: Store) -> None:
    """A reader lists a generation's parts with DuckDB (no polars), a writer with polars: the
    same rows, compacted files and parts of their own alike."""
    import duckdb

    from workbench.store import integrity, views

    gen = store.live_generation()
    want = integrity.expected_parts(store.root, integrity.read_tables(gen)).to_dicts()
    with duckdb.connect() as con:
        got = views.listed_parts(con, store.root, gen, views.table_columns(con, gen))
    assert want and got == want


REPO = Path(__file__).resolve().parents[1]


def _keras_log(path: Path, epochs: int) -> Path:
    """As keras' CSVLogger writes it (csv.writer, CRLF), an empty cell where an epoch lacks one."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["epoch", "accuracy", "learning_rate", "loss", "val_loss"])
        for e in range(epochs):
            w.writerow([e, 0.5 + e / 1000, 1e-3, 2 / (e + 1), "" if e % 7 else 2.2 / (e + 1)])
    return path


def _batches(ingestor, path: Path, fast: bool, monkeypatch) -> tuple[list, int]:
    """Every batch of the file as comparable values, and how many blocks the vectorised path took."""
    import ingest.lines as lines_mod
    from ingest.base import ReadContext

    took = []
    block = ingestor.parser.feed_block
    with monkeypatch.context() as m:
        m.setattr(lines_mod, "FAST_MIN_LINES", 1)  # small real files take the vectorised path too
        m.setattr(
            ingestor.parser,
            "feed_block",
            (lambda self, lines, batch: took.append(block(self, lines, batch)) or took[-1])
            if fast
            else (lambda self, lines, batch: False),
        )
        out = []
        for b in ingestor.read(path, 0, ReadContext("run")):
            p = b.points
            out.append(
                (
                    b.start, b.end, [p.tags[c] for c in p.tag_code], p.step.tolist(),
                    [repr(v) for v in p.value], [repr(v) for v in p.wall_time],
                    [(x.offset, x.kind, x.message) for x in b.problems],
                    b.records, b.events, b.state, b.note,
                )
            )  # fmt: skip
    return out, sum(took)


def test_vectorised_csv_gives_the_line_readers_points(tmp_path, monkeypatch):
    from ingest.deepspeed_monitor import DeepSpeedMonitorCsvIngestor
    from ingest.keras_csv import KerasCsvLoggerIngestor
    from ingest.lightning import LightningCsvIngestor

    (tmp_path / "bad").mkdir()
    odd = _keras_log(tmp_path / "bad" / "training.log", 100)
    with open(odd, "a", newline="") as f:
        f.write("100,0.6,abc,0.01,\r\n")  # a cell that is no number: that block goes line by line
    cases = {
        DeepSpeedMonitorCsvIngestor(): sorted(REPO.glob("sample_runs/*/monitor_csv/job/*.csv")),
        LightningCsvIngestor(): sorted(REPO.glob("tests/data/real_logs/lightning_csvlogger/*/metrics.csv")),
        KerasCsvLoggerIngestor(): [
            REPO / "sample_runs/keras_csvlogger_appended/training.log",  # a second fit: line by line
            _keras_log(tmp_path / "training.log", 300),
            odd,
        ],
    }
    for ingestor, files in cases.items():
        assert files, ingestor.name
        fast_blocks = 0
        for path in files:
            fast, used = _batches(ingestor, path, True, monkeypatch)
            slow, _ = _batches(ingestor, path, False, monkeypatch)
            assert fast == slow, path
            fast_blocks += used
        assert fast_blocks > 0, ingestor.name


def test_replay_reads_what_the_scalars_view_holds(tmp_path_factory):
    """Runs read from the parts directly and runs ranked by the view (a resume, several sources)
    give the view's current points."""
    from real_samples import sample_store

    from detectors import replay
    from workbench.store.coded import RANKED_RUNS

    store = sample_store(
        tmp_path_factory, ["deepspeed_resumed_after_kill", "healthy_hf_trainer", "keras_csvlogger_appended"]
    )
    con = store.connect()
    runs = [r for (r,) in con.execute("SELECT run_id FROM runs").fetchall()]
    ranked = {r for (r,) in con.execute(RANKED_RUNS, [runs]).fetchall()}
    want = con.sql("SELECT run_id, tag, metric, step, value FROM scalars").pl()
    con.close()
    assert len(runs) == 3 and ranked == {"deepspeed_resumed_after_kill"}  # a resume: the view ranks it
    got = replay.load(store).points
    cols = ["run_id", "tag", "step"]
    assert got.sort(cols).equals(want.sort(cols)) and want.height > 1000
