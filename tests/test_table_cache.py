"""Tables a reader keeps beside a generation (`workbench.store.table_cache`): later readers get
the same answers from them, and anything that changes what they were computed from is read
afresh."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import duckdb
import pytest
from conftest import SAMPLE_RUNS, cli, copy_store, ingest_paths

from workbench.store import Store, table_cache, views
from workbench.store.table_cache import FOLDER, TYPES_KEY

# a run resumed into another (recovered), a diverged one, one that completed, DeepSpeed's logs
RUNS = ["attention_collapse", "attention_collapse_recovery", "diverge_nan", "healthy_hf_trainer"]
RUNS += ["fp16_overflow_storm"]


@pytest.fixture(scope="module")
def ingested(tmp_path_factory) -> Store:
    store = Store(tmp_path_factory.mktemp("kept") / "store")
    ingest_paths(store, *(SAMPLE_RUNS / r for r in RUNS))
    return store


@pytest.fixture
def store(ingested, tmp_path):
    s = copy_store(ingested, tmp_path)
    shutil.rmtree(s.live_generation() / FOLDER, ignore_errors=True)
    return s


def answers(store) -> dict:
    """Every view's column types, row count and a digest of its rows (in no order), from one-shot
    connections and from one that lives on."""

    def answer(con, name):
        rows = f"SELECT count(*), sum(hash(t)::HUGEINT) FROM {name} t"
        return con.execute(f"DESCRIBE {name}").fetchall(), con.execute(rows).fetchall()

    out = {}
    for name in sorted(views.VIEW_NAMES):
        con = store.connect(f"SELECT * FROM {name}")
        out[name] = answer(con, name)
        con.close()
    con = store.connect()
    out |= {"live " + name: answer(con, name) for name in sorted(views.VIEW_NAMES)}
    con.close()
    return out


def kept(store) -> dict[str, tuple[str, int]]:
    """Each kept table's file and its modification time (a table computed again is written again)."""
    files = (store.live_generation() / FOLDER).glob("*.parquet")
    return {p.name.rsplit("-", 1)[0]: (p.name, p.stat().st_mtime_ns) for p in files}


def test_kept_tables_answer_as_computed_ones_in_every_view(store):
    cold = answers(store)
    tables = kept(store)
    assert set(tables) == set(views.TABLED_ONE_SHOT)
    warm = answers(store)
    assert warm == cold and kept(store) == tables  # read from the files, none computed again
    assert len(plans(store)) == len(views.VIEW_NAMES)  # each query's plan, kept by the second
    assert answers(store) == cold  # from the kept plans
    assert cold["scalars"][1][0][0] > 10_000 and cold["runs"][1][0][0] == len(RUNS)


def plans(store) -> list[Path]:
    return sorted((store.live_generation() / FOLDER).glob("plan-*.json"))


def test_an_ingest_keeps_the_tables_every_connection_makes(ingested):
    assert set(kept(ingested)) == set(views.TABLED)  # written with catalog.duckdb, read by no one yet


def test_a_table_that_reads_the_clock_is_never_kept(tmp_path):
    con = duckdb.connect()
    gen = tmp_path / "g00000001"
    gen.mkdir()
    stmts = [
        "CREATE OR REPLACE VIEW a AS SELECT 1 AS x",
        "CREATE OR REPLACE VIEW b AS SELECT x, now() AS t FROM a",
        "CREATE OR REPLACE VIEW c AS SELECT * FROM b",
    ]
    made = table_cache.plan(con, stmts, "SELECT * FROM c", frozenset({"a", "b", "c"}), gen)
    assert set(made.saves) == {"a"}  # b reads the clock, and c reads b


def test_a_live_run_reads_running_from_the_clock_at_each_read_not_from_what_was_kept(tmp_path):
    run = tmp_path / "runs" / "live"
    run.mkdir(parents=True)
    now = time.time()
    records = [{"step": s, "loss": 2.0 - s / 100, "time": now - 120 + s} for s in range(1, 60)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    store = Store(tmp_path / "store")
    ingest_paths(store, run)
    for _ in range(2):  # computed, then read from the kept tables
        row = json.loads(cli("runs", "--format", "json", store=store).stdout)[0]
        assert (row["run_id"], row["status"]) == ("live", "running?")
        assert row["evidence"] == "no end-of-run evidence yet; last record 1 min ago"
    kept_rows = duckdb.sql(
        f"SELECT status, open_ended FROM '{store.live_generation() / FOLDER}/_run_rows-*.parquet'"
    )
    assert kept_rows.fetchall() == [("unknown", True)]  # the kept table holds what the logs say, no clock


@pytest.mark.parametrize("reads_before", [1, 2])  # 2: a plan that reads it is kept too
def test_a_kept_file_that_cannot_be_read_is_computed_again_and_replaced(store, reads_before):
    for _ in range(reads_before):
        before = cli("runs", "--format", "csv", store=store).stdout
    assert any((store.live_generation() / FOLDER).glob("plan-*.json")) == (reads_before == 2)
    damaged = store.live_generation() / FOLDER / kept(store)["_run_rows"][0]
    damaged.write_bytes(b"PAR1 not a parquet file PAR1")
    assert cli("runs", "--format", "csv", store=store).stdout == before
    assert damaged.read_bytes().startswith(b"PAR1") and damaged.stat().st_size > 100


def test_a_kept_file_whose_rows_cannot_be_read_as_saved_is_computed_again(store):
    before = cli("runs", "--format", "csv", store=store).stdout
    wrong = store.live_generation() / FOLDER / kept(store)["_run_rows"][0]
    types = '[["no_such_column", "BIGINT"]]'  # readable, but not the table it says it is
    duckdb.execute(
        f"COPY (SELECT 1 AS x) TO '{wrong}' (FORMAT parquet, KV_METADATA {{{TYPES_KEY}: '{types}'}})"
    )
    assert cli("runs", "--format", "csv", store=store).stdout == before
    assert (
        "no_such_column"
        not in duckdb.sql(f"SELECT * FROM parquet_kv_metadata('{wrong}')").fetchall()[0][2].decode()
    )


def test_a_store_the_reader_cannot_write_to_is_read_as_before(store):
    before = cli("tags", "healthy_hf_trainer", "--format", "csv", store=store).stdout
    shutil.rmtree(store.live_generation() / FOLDER)
    (store.live_generation() / FOLDER).write_text("a file where the folder would be")
    r = cli("tags", "healthy_hf_trainer", "--format", "csv", store=store)
    assert r.exit_code == 0 and r.stdout == before


def test_new_aliases_are_read_afresh_not_from_what_was_kept(store, tmp_path, monkeypatch):
    def metric_of(tag: str) -> str:
        rows = cli("tags", "healthy_hf_trainer", "--format", "csv", store=store).stdout.splitlines()
        return next(r.split(",")[1] for r in rows if r.startswith(tag + ","))

    monkeypatch.chdir(tmp_path)
    for toml, metric in [
        (None, ""),
        (store.root / "workbench.toml", "eval_time"),
        (tmp_path / "workbench.toml", "eval_time"),  # the working folder's
    ]:
        if toml is not None:
            toml.write_text('[aliases]\neval_time = ["eval_runtime"]\n')
        before = set(plans(store))
        for _ in range(3):  # computed, then a plan kept, then read from it
            assert metric_of("eval_runtime") == metric
        assert set(plans(store)) - before  # a plan of its own under these settings
        if toml is not None:
            toml.unlink()
            assert metric_of("eval_runtime") == ""


def test_a_settings_file_that_cannot_be_read_keeps_no_plan(store):
    (store.root / "workbench.toml").mkdir()  # no file to read: what it would say is unknown
    answers = {cli("runs", "--format", "csv", store=store).stdout for _ in range(3)}
    assert len(answers) == 1 and "attention_collapse," in answers.pop() and not plans(store)


def test_a_reader_whose_working_folder_was_removed_reads_the_store_settings_alone(store, tmp_path):
    """The working folder's workbench.toml went with it: a read answers (it said the store was
    damaged), and aliases from the store's own settings still apply."""
    (store.root / "workbench.toml").write_text('[aliases]\neval_time = ["eval_runtime"]\n')
    gone = tmp_path / "gone"
    gone.mkdir()
    code = (
        "import os, sys; os.chdir(sys.argv[1]); os.rmdir(sys.argv[1]);"
        "from workbench.store import Store;"
        "q = \"SELECT DISTINCT metric FROM scalars WHERE tag = 'eval_runtime'\";"
        "print(Store(sys.argv[2]).query(q).rows())"
    )
    for _ in range(2):  # computed, then from what was kept
        p = subprocess.run(
            [sys.executable, "-c", code, str(gone), str(store.root)], capture_output=True, text=True
        )
        assert p.returncode == 0, p.stderr
        assert p.stdout.strip() == "[('eval_time',)]"
        gone.mkdir()


@pytest.mark.parametrize("damage", ["removed", "rewritten"])
def test_a_part_damaged_after_a_plan_was_kept_is_refused(store, damage):
    for _ in range(2):
        cli("runs", store=store)
    assert list((store.live_generation() / FOLDER).glob("parts-*.json")) and plans(store)
    part = next((store.root / "scalars").rglob("*.parquet"))
    if damage == "removed":
        part.unlink()
    else:  # the same size, other bytes
        data = bytearray(part.read_bytes())
        data[len(data) // 2] ^= 0xFF
        part.write_bytes(bytes(data))
    r = cli("runs", store=store)
    said = "is missing" if damage == "removed" else "sha256 differs"
    assert r.exit_code == 1 and said in r.stderr and "workbench check" in r.stderr


def test_a_plan_of_another_version_of_the_code_is_not_read(store, monkeypatch):
    for _ in range(2):
        cli("runs", store=store)
    assert len(plans(store)) == 1
    monkeypatch.setattr(table_cache, "_code", ["another version"])
    cli("runs", store=store)
    cli("runs", store=store)
    assert len(plans(store)) == 2


def test_a_generation_table_changed_since_it_was_written_is_read_again_and_refused(store):
    assert cli("sql", "SELECT count(*) FROM scalars", store=store).exit_code == 0  # tables kept
    table = store.live_generation() / "files.parquet"
    data = bytearray(table.read_bytes())
    data[50] ^= 0xFF
    table.write_bytes(bytes(data))
    r = cli("sql", "SELECT count(*) FROM scalars", store=store)
    assert r.exit_code == 1 and "files.parquet" in r.stderr and "workbench check" in r.stderr


def test_readers_that_keep_the_same_tables_at_once_leave_whole_files(store):
    def runs() -> list:
        con = store.connect("SELECT * FROM runs")
        try:
            return sorted(con.sql("SELECT * EXCLUDE (evidence, status) FROM runs").fetchall())
        finally:
            con.close()

    want = runs()
    shutil.rmtree(store.live_generation() / FOLDER)
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda _: runs(), range(8)))
    assert all(g == want for g in got)
    folder = store.live_generation() / FOLDER
    assert not list(folder.glob(".*"))  # no file left half written
    assert {"_run_facts", "_run_totals", "labels", "_auto_labels", "_nonfinite_tails"} <= set(kept(store))
    assert runs() == want and all(
        duckdb.sql(f"SELECT count(*) FROM '{f}'").fetchall() for f in folder.iterdir()
    )


def test_a_commit_makes_its_views_unbound_with_the_same_answers(tmp_path, monkeypatch):
    """Where DuckDB can (2.0), a commit's derive hooks and catalog.duckdb create their views
    unbound (bound where a query names them, once): the derived tables and the catalog's answers
    equal those of views bound at their creation."""
    runs = tmp_path / "runs"
    for name in ("attention_collapse", "attention_collapse_recovery", "deepspeed_resumed_after_kill"):
        shutil.copytree(SAMPLE_RUNS / name, runs / name)
    answers, can = {}, views.DEFERS_BINDING
    for defer in (False, True):
        monkeypatch.setattr(views, "DEFERS_BINDING", defer and can)
        store = Store(tmp_path / f"store_{defer}")
        ingest_paths(store, runs)
        con = duckdb.connect(str(store.root / "catalog.duckdb"), read_only=True)
        if can:  # (`is_bound` came with unbound views); those a kept table's query read are bound
            query = "SELECT count(*) FROM duckdb_views() WHERE NOT internal AND NOT is_bound"
            unbound = con.sql(query).fetchall()[0][0]
            assert unbound > len(views.VIEW_NAMES) // 2 if defer else unbound == 0
        answers[defer] = [
            con.sql(q).fetchall()
            for q in (
                "SELECT * FROM lineage ORDER BY ALL",
                "SELECT * FROM agreement ORDER BY ALL",
                "SELECT * EXCLUDE (ingested_at) FROM runs ORDER BY run_id",
                "SELECT * FROM labels ORDER BY ALL",
                "SELECT run_id, tag, count(*), min(step), max(step) FROM scalars GROUP BY ALL ORDER BY ALL",
            )
        ]
        con.close()
    lineage, agreement = answers[True][:2]
    assert {r[0] for r in lineage} == {"attention_collapse_recovery", "deepspeed_resumed_after_kill"}
    assert len(agreement) > 5
    assert answers[True] == answers[False]
