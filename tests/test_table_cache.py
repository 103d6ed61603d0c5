"""Tables a reader keeps beside a generation (`workbench.store.table_cache`): later readers get
the same answers from them, and anything that changes what they were computed from is read
afresh."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor

import duckdb
import pytest
from conftest import SAMPLE_RUNS, cli, copy_store, ingest_paths

from workbench.store import Store, views
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
    assert set(tables) == {n for n in views.TABLED_ONE_SHOT if n not in ("_run_status", "_runs_base")}
    warm = answers(store)
    assert warm == cold and kept(store) == tables  # read from the files, none computed again
    assert cold["scalars"][1][0][0] > 10_000 and cold["runs"][1][0][0] == len(RUNS)


def test_an_ingest_keeps_the_tables_every_connection_makes(ingested):
    assert set(kept(ingested)) == set(views.TABLED)  # written with catalog.duckdb, read by no one yet


def test_a_table_that_reads_the_clock_is_never_kept(store):
    cli("runs", store=store)
    assert (
        "_run_facts" in kept(store) and "_run_status" not in kept(store) and "_runs_base" not in kept(store)
    )


def test_a_kept_file_that_cannot_be_read_is_computed_again_and_replaced(store):
    before = cli("runs", "--format", "csv", store=store).stdout
    damaged = store.live_generation() / FOLDER / kept(store)["_run_totals"][0]
    damaged.write_bytes(b"PAR1 not a parquet file PAR1")
    assert cli("runs", "--format", "csv", store=store).stdout == before
    assert damaged.read_bytes().startswith(b"PAR1") and damaged.stat().st_size > 100


def test_a_kept_file_whose_rows_cannot_be_read_as_saved_is_computed_again(store):
    before = cli("runs", "--format", "csv", store=store).stdout
    wrong = store.live_generation() / FOLDER / kept(store)["_run_facts"][0]
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


def test_new_aliases_are_read_afresh_not_from_what_was_kept(store):
    def metric_of(tag: str) -> str:
        rows = cli("tags", "healthy_hf_trainer", "--format", "csv", store=store).stdout.splitlines()
        return next(r.split(",")[1] for r in rows if r.startswith(tag + ","))

    assert metric_of("eval_runtime") == ""
    (store.root / "workbench.toml").write_text('[aliases]\neval_time = ["eval_runtime"]\n')
    assert metric_of("eval_runtime") == "eval_time"
    (store.root / "workbench.toml").unlink()
    assert metric_of("eval_runtime") == ""


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
