"""The store proves its own integrity: each kind of damage is refused by every command (never
answered as if the store were whole or empty), reported by `workbench check`, and repaired, or
refused with what to do, by `workbench check --repair`."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import cli as run_cli
from conftest import ingest_paths
from writers import tbx_scalars

import workbench.store.layout as layout
import workbench.store.schema as schema
from workbench.errors import StoreError
from workbench.store import Store, StoreWriter
from workbench.store.points import Points

JSONL_LINES, TB_POINTS, EVALS = 120, 60, 3


def cli(store: Store, *args: str):
    """The CLI in-process: (exit code, stdout, stderr)."""
    r = run_cli(*args, store=store)
    return r.exit_code, r.stdout, r.stderr


def _trainer_state(path: Path) -> None:
    history = [{"step": s, "loss": 2.0 - s / 100} for s in range(1, 31)]
    history += [{"step": s, "eval_loss": 1.5 - s / 100} for s in (10, 20, 30)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"global_step": 30, "max_steps": 30, "log_history": history}))


def _logs(root: Path) -> None:
    (root / "a").mkdir(parents=True)
    with open(root / "a/metrics.jsonl", "w") as f:
        for s in range(JSONL_LINES):
            f.write(json.dumps({"step": s, "loss": 1 / (s + 1), "lr": 1e-3}) + "\n")
    tbx_scalars(root / "b", {"loss": [(s, s / 4) for s in range(TB_POINTS)]})
    _trainer_state(root / "c/trainer_state.json")


EXPECTED = JSONL_LINES * 2 + TB_POINTS + 33  # c: 30 losses and 3 eval losses


@pytest.fixture(scope="module")
def two_generations_snapshot(tmp_path_factory):
    """Logs and a store of three runs written by two ingests, built once: (work folder, a copy of it)."""
    work = tmp_path_factory.mktemp("two_generations") / "work"
    logs = work / "logs"
    _logs(logs)
    store = Store(work / "store")
    with open(logs / "a/metrics.jsonl") as f:
        lines = f.readlines()
    (logs / "a/metrics.jsonl").write_text("".join(lines[:100]))
    ingest_paths(store, logs)
    (logs / "a/metrics.jsonl").write_text("".join(lines))
    ingest_paths(store, logs)
    snapshot = work.with_name("snapshot")
    shutil.copytree(work, snapshot, symlinks=True)  # copy2: sizes and mtimes as the store recorded them
    return work, snapshot


@pytest.fixture
def two_generations(two_generations_snapshot):
    """A store of three runs written by two ingests (so that an older generation exists), whole
    again for each test: the snapshot put back at the same paths, since the store records its
    logs' absolute paths and the tests damage both."""
    work, snapshot = two_generations_snapshot
    shutil.rmtree(work)
    shutil.copytree(snapshot, work, symlinks=True)
    logs, store = work / "logs", Store(work / "store")
    assert [g.name for g in layout.generations(store.root)] == ["g00000001", "g00000002"]
    assert _points(store) == EXPECTED
    return logs, store


def _points(store: Store) -> int:
    return store.query("SELECT count(*) AS n FROM scalars_all")["n"][0]


def _part(store: Store, run_id: str, kind: str = "scalars") -> Path:
    folder = store.root / kind / layout.run_key(run_id)
    return sorted(folder.glob("*.parquet"))[0]


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def _files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.name != "lock"}


def test_a_whole_store_checks_whole(two_generations):
    _, store = two_generations
    code, out, _ = cli(store, "check")
    assert code == 0 and "the store is whole" in out
    tables = len(schema.META_TABLES) + len(schema.DERIVED_TABLES)
    assert f"generation g00000002: {tables} tables and 5 parts checked" in out
    marker = (store.root / layout.MARKER).read_text()
    assert marker == "training-log-workbench store, format 1\n"


DAMAGE = {
    "scalar part deleted": lambda s: _part(s, "a").unlink(),
    "scalar part truncated": lambda s: os.truncate(_part(s, "b"), 40),
    "scalar part with a flipped byte": lambda s: _flip(_part(s, "b"), 200),
    "events part deleted": lambda s: _part(s, "c", "events").unlink(),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_part_is_refused_reported_and_read_again_from_its_log(two_generations, damage):
    _, store = two_generations
    DAMAGE[damage](store)
    for command in (["runs"], ["sql", "SELECT count(*) FROM scalars"], ["tags", "a"]):
        code, out, err = cli(store, *command)
        assert code == 1 and out == "" and "workbench check" in err, command
    code, out, _ = cli(store, "check")
    assert code == 1 and "damaged" in out and "workbench check --repair" in out
    code, out, _ = cli(store, "check", "--repair")
    assert code == 0 and "read again from the log" in out and "the store is whole again" in out
    assert _points(store) == EXPECTED
    assert store.query("SELECT count(*) AS n FROM events WHERE kind = 'eval'")["n"][0] == EVALS
    assert cli(store, "check")[0] == 0


def test_a_damaged_part_whose_log_is_gone_is_dropped_with_a_report(two_generations):
    logs, store = two_generations
    lost = store.query("SELECT count(*) AS n FROM scalars_all WHERE run_id = 'b'")["n"][0]
    _part(store, "b").unlink()
    shutil.rmtree(logs / "b")
    code, out, _ = cli(store, "check", "--repair")
    assert code == 0 and f"{lost} points of 1 chunks lost" in out
    assert _points(store) == EXPECTED - lost
    runs = dict(store.query("SELECT run_id, points FROM runs").rows())
    assert runs["b"] == 0 and runs["a"] == JSONL_LINES * 2
    problem = store.query("SELECT kind, message FROM problems WHERE run_id = 'b'").rows()
    assert problem[0][0] == "store_damage" and "log file is gone" in problem[0][1]


def test_a_damaged_events_part_whose_log_is_gone_costs_only_the_events(two_generations):
    logs, store = two_generations
    _part(store, "c", "events").unlink()
    shutil.rmtree(logs / "c")
    code, out, _ = cli(store, "check", "--repair")
    assert code == 0 and "the events of 1 chunks lost" in out
    assert _points(store) == EXPECTED
    assert store.query("SELECT count(*) AS n FROM events")["n"][0] == 0


@pytest.mark.parametrize("how", ["truncated", "flipped"])
def test_a_damaged_table_of_the_live_generation_goes_back_to_the_last_intact_one(two_generations, how):
    logs, store = two_generations
    table = store.root / "meta/g00000002/files.parquet"
    os.truncate(table, 100) if how == "truncated" else _flip(table, 50)
    code, _, err = cli(store, "sql", "SELECT count(*) FROM scalars")
    assert code == 1 and "g00000002/files.parquet" in err and "workbench check" in err
    code, out, _ = cli(store, "check", "--repair")
    assert code == 0 and "CURRENT now names g00000001 (was g00000002)" in out
    assert _points(store) == 100 * 2 + TB_POINTS + 33  # as the first ingest left it
    ingest_paths(store, logs)  # the next ingest redoes what came after
    assert _points(store) == EXPECTED and cli(store, "check")[0] == 0


@pytest.mark.parametrize("current", ["garbage", "empty", "missing"])
def test_a_damaged_current_is_never_taken_for_an_empty_store(two_generations, current):
    logs, store = two_generations
    if current == "missing":
        (store.root / "CURRENT").unlink()
    else:
        (store.root / "CURRENT").write_text("zzz\n" if current == "garbage" else "")
    before = _files_under(store.root)
    code, out, err = cli(store, "sql", "SELECT count(*) FROM scalars")
    assert code == 1 and out == "" and "damaged" in err and "CURRENT" in err
    code, _, err = cli(store, "ingest", str(logs))  # refuses: no garbage collection of everything
    assert code == 1 and "damaged" in err
    assert _files_under(store.root) == before
    code, out, _ = cli(store, "check")
    assert code == 1 and "CURRENT" in out
    code, out, _ = cli(store, "check", "--repair")
    assert code == 0 and "CURRENT now names g00000002" in out
    assert _points(store) == EXPECTED


def test_metadata_gone_with_parts_left_is_refused_and_nothing_is_deleted(two_generations):
    logs, store = two_generations
    shutil.rmtree(store.root / "meta")
    (store.root / "CURRENT").unlink()
    parts = _files_under(store.root / "scalars")
    assert cli(store, "ingest", str(logs))[0] == 1
    code, out, _ = cli(store, "check", "--repair")
    assert code == 1 and "start a fresh store from the logs" in out
    assert _files_under(store.root / "scalars") == parts


def test_a_first_generation_that_is_damaged_has_nothing_to_go_back_to(tmp_path):
    _logs(tmp_path / "logs")
    store = Store(tmp_path / "store")
    ingest_paths(store, tmp_path / "logs")
    os.truncate(store.root / "meta/g00000001/chunks.parquet", 10)
    code, out, _ = cli(store, "check", "--repair")
    assert code == 1 and "not repaired" in out and "no intact metadata generation" in out


def test_a_store_of_a_newer_format_is_refused_by_every_command(two_generations):
    logs, store = two_generations
    (store.root / layout.MARKER).write_text("training-log-workbench store, format 9\n")
    for command in (["runs"], ["ingest", str(logs)], ["check"], ["check", "--repair"]):
        code, out, err = cli(store, *command)
        assert code == 1 and "format 9, newer than this workbench reads (format 1)" in out + err, command


def test_a_garbage_marker_is_refused_then_rewritten_by_repair(two_generations):
    _, store = two_generations
    (store.root / layout.MARKER).write_text("hello")
    code, _, err = cli(store, "runs")
    assert code == 1 and "names no store format" in err
    code, out, _ = cli(store, "check", "--repair")
    assert code == 0 and "WORKBENCH_STORE rewritten" in out
    assert _points(store) == EXPECTED


def test_a_store_written_before_format_versions_reads_and_is_upgraded(two_generations):
    logs, store = two_generations
    (store.root / layout.MARKER).write_text("")
    assert _points(store) == EXPECTED and cli(store, "check")[0] == 0
    ingest_paths(store, logs)
    assert (store.root / layout.MARKER).read_text().endswith("format 1\n")


def test_gc_keeps_what_it_cannot_prove_unreferenced(two_generations):
    logs, store = two_generations
    stranger = store.root / "scalars" / layout.run_key("a") / "notes.txt"
    stranger.write_text("mine")
    orphan = store.root / "scalars" / layout.run_key("a") / "c999.parquet"
    shutil.copy(_part(store, "a"), orphan)
    os.truncate(store.root / "meta/g00000001/chunks.parquet", 10)  # the lagging generation
    (logs / "b/extra.txt").write_text("not a log\n")  # something to commit
    ingest_paths(store, logs)
    assert stranger.exists() and orphan.exists()  # g00000001 unreadable: no part is provably unused
    ingest_paths(store, logs)
    assert stranger.exists() and not orphan.exists()  # both kept generations read: the orphan goes
    assert [g.name for g in layout.generations(store.root)] == ["g00000002", "g00000003", "g00000004"]


def test_a_generation_newer_than_current_was_never_published_and_is_collected(two_generations):
    logs, store = two_generations
    shutil.copytree(store.root / "meta/g00000002", store.root / "meta/g00000007")
    ingest_paths(store, logs)
    gens = [g.name for g in layout.generations(store.root)]
    assert gens == ["g00000001", "g00000002", "g00000008"]  # numbered above it, then it is gone


def test_disk_full_at_commit_keeps_the_previous_generation(two_generations):
    logs, store = two_generations
    (store.root / "CURRENT.tmp").symlink_to("/dev/full")  # the kernel's own ENOSPC
    _trainer_state(logs / "d/trainer_state.json")
    code, _, err = cli(store, "ingest", str(logs))  # an error the CLI did not turn into a message fails
    assert code == 1 and "Traceback" not in err
    assert "disk full while writing the store" in err
    assert (store.root / "CURRENT").read_text() == "g00000002\n" and _points(store) == EXPECTED
    assert not (store.root / "meta/g00000003").exists()
    ingest_paths(store, logs)  # with space again, the same ingest completes
    assert _points(store) == EXPECTED + 33


def test_disk_full_while_writing_a_part_is_a_store_error(tmp_path):
    store = Store(tmp_path / "store")
    with store.writer() as w:
        tmp = layout.scalar_part(store.root, "r", w.next_chunk_id)
        tmp = tmp.with_name(tmp.name + ".tmp")
        tmp.parent.mkdir(parents=True)
        tmp.symlink_to("/dev/full")
        pts = Points(["loss"], [0] * 1000, list(range(1000)), [0.0] * 1000, [1.0] * 1000)
        w.add_chunk("r", "/logs/r.jsonl", "jsonl", 0, 10, pts)
        with pytest.raises(StoreError, match="disk full"):
            w.commit()
    assert not store.exists()


def test_queries_never_reach_for_the_network(two_generations):
    _, store = two_generations
    code, _, err = cli(store, "sql", "SELECT * FROM read_csv('https://example.invalid/x.csv')")
    assert code == 1 and "httpfs" in err
    con = store.connect()
    settings = con.execute(
        "SELECT current_setting('autoinstall_known_extensions'), current_setting('autoload_known_extensions')"
    ).fetchone()
    assert settings == (False, False)


def test_a_slow_query_draws_no_progress_bar_on_stdout(two_generations):
    """DuckDB draws one on stdout for a query past 2 s: into a script's or a notebook's output.
    Asked of the connection, since a query that slow would make the test slow."""
    _, store = two_generations
    for con in (store.connect(), store.connect("SELECT count(*) FROM scalars")):
        assert con.execute("SELECT current_setting('enable_progress_bar')").fetchone() == (False,)


def test_a_store_folder_named_with_glob_characters(tmp_path):
    _logs(tmp_path / "logs")
    store = Store(tmp_path / "store[1]*")
    ingest_paths(store, tmp_path / "logs")
    assert _points(store) == EXPECTED and cli(store, "check")[0] == 0
    with open(tmp_path / "logs/a/metrics.jsonl", "a") as f:  # a second ingest reads the first's tables
        f.write(json.dumps({"step": JSONL_LINES, "loss": 0.5, "lr": 1e-3}) + "\n")
    again = ingest_paths(store, tmp_path / "logs")
    assert again.derive_errors == {} and _points(store) == EXPECTED + 2


def test_a_writer_opened_for_repair_skips_the_part_check(two_generations):
    _, store = two_generations
    _part(store, "a").unlink()
    with pytest.raises(StoreError, match="is missing"):
        StoreWriter(store.root)
    StoreWriter(store.root, verify=False).close()


def test_a_first_ingest_killed_before_it_published_is_not_damage(tmp_path):
    """Parts and a renamed generation, but no CURRENT ever written: what kill -9 leaves of a first
    ingest. Nothing ever referred to them, so the next ingest collects them and starts over."""
    _logs(tmp_path / "logs")
    store = Store(tmp_path / "store")
    ingest_paths(store, tmp_path / "logs")
    for name in ("CURRENT", "catalog.duckdb"):
        (store.root / name).unlink()
    (store.root / layout.MARKER).write_text("")  # as it is before the first publish
    assert not store.exists()  # not yet written, not damaged
    ingest_paths(store, tmp_path / "logs")
    assert _points(store) == EXPECTED and cli(store, "check")[0] == 0
    assert [g.name for g in layout.generations(store.root)] == ["g00000002"]
    assert len(list((store.root / "scalars").glob("*/*"))) == 3  # the leftovers were collected
