"""The CLI as a user drives it (`python -m workbench`): stdout carries only results, exit codes,
messages. What a command prints, where the process is not the point, runs in process (cli)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
from click.testing import CliRunner
from conftest import DATA, cli, ingest_paths

from workbench.cli import main
from workbench.render import NOTES_QUERY
from workbench.store import Store

GEN = DATA / "generated"
ROOT = Path(__file__).parent.parent


class Ran(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def wb(*args, store, check=True, process=False, **kw) -> Ran:
    """A command as a user types it: in this process (what it prints, its exit code), or with
    `process` as `python -m workbench` where the process itself is under test."""
    if process:
        env = {**os.environ, "WORKBENCH_STORE": str(store)}
        p = subprocess.run(
            [sys.executable, "-m", "workbench", *map(str, args)],
            capture_output=True,
            text=True,
            env=env,
            **kw,
        )
        ran = Ran(p.returncode, p.stdout, p.stderr)
    else:
        r = cli(*args, store=Store(store))
        ran = Ran(r.exit_code, r.stdout, r.stderr)
    if check and ran.returncode != 0:
        raise AssertionError(f"exit {ran.returncode}\n{ran.stdout}\n{ran.stderr}")
    return ran


@pytest.fixture(scope="module")
def tbx_store(tmp_path_factory):
    store = tmp_path_factory.mktemp("cli") / "store"
    p = wb("ingest", GEN / "tbx_run", store=store, process=True)
    assert p.stdout == ""  # progress and summary go to stderr
    assert "ingested 1 runs" in p.stderr
    return store


def test_sql_csv_renders_as_duckdb(tbx_store):
    p = wb(
        "sql",
        "SELECT tag, step, value, superseded FROM scalars_all WHERE step = 120 AND tag = 'train/loss' "
        "ORDER BY superseded",
        "--format",
        "csv",
        store=tbx_store,
    )
    assert (
        p.stdout
        == "tag,step,value,superseded\ntrain/loss,120,0.4912022352218628,false\ntrain/loss,120,9.5,true\n"
    )


def test_sql_json_is_one_array_of_objects(tbx_store):
    p = wb(
        "sql",
        "SELECT run_id, count(*) AS n FROM scalars GROUP BY run_id",
        "--format",
        "json",
        store=tbx_store,
    )
    assert json.loads(p.stdout) == [{"run_id": "run_a", "n": 47}]
    empty = wb("sql", "SELECT * FROM scalars WHERE false", "--format", "json", store=tbx_store)
    assert json.loads(empty.stdout) == []


def test_a_long_table_shows_its_first_and_last_rows_and_says_how_to_get_all(tbx_store):
    p = wb("sql", "SELECT range AS n FROM range(100)", store=tbx_store)
    cells = [line.strip("│ ") for line in p.stdout.splitlines() if line.startswith("│")]  # body rows
    assert cells == [*map(str, range(20)), "⋮", *map(str, range(80, 100))]
    assert "(100 rows, 40 shown; --format csv or json gives all)" in p.stderr
    assert (
        len(wb("sql", "SELECT range AS n FROM range(100)", "--format", "csv", store=tbx_store).stdout.split())
        == 101
    )


def test_sql_step_is_bigint_and_views_have_contract_columns(tbx_store):
    p = wb(
        "sql", "SELECT column_name, column_type FROM (DESCRIBE scalars)", "--format", "csv", store=tbx_store
    )
    assert p.stdout.splitlines()[1:] == [
        "run_id,VARCHAR",
        "tag,VARCHAR",
        "metric,VARCHAR",
        "step,BIGINT",
        "wall_time,DOUBLE",
        "value,DOUBLE",
    ]
    cols = wb(
        "sql", "SELECT column_name FROM (DESCRIBE scalars_all)", "--format", "csv", store=tbx_store
    ).stdout
    assert {"source", "segment", "superseded"} <= set(cols.split())


@pytest.mark.parametrize(
    "query", ["DELETE FROM scalars", "COPY (SELECT 1) TO '/tmp/x.csv'", "ATTACH 'x.db'", "SELECT 1; SELECT 2"]
)
def test_sql_is_read_only(tbx_store, query):
    p = wb("sql", query, store=tbx_store, check=False)
    assert p.returncode == 1 and p.stdout == ""
    assert "error:" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("name", ["o'neil", "x' (FORMAT json); SELECT 'injected"])
def test_a_quote_in_tmpdir_is_a_path_not_sql(tbx_store, tmp_path, name):
    (tmp_path / name).mkdir()
    env = {**os.environ, "WORKBENCH_STORE": str(tbx_store), "TMPDIR": str(tmp_path / name)}
    for args in (["sql", "SELECT 41 + 1 AS x", "--format", "csv"], ["runs", "--format", "csv"]):
        p = subprocess.run(
            [sys.executable, "-m", "workbench", *args], capture_output=True, text=True, env=env
        )
        assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[1].startswith("run_a,")
    assert list((tmp_path / name).iterdir()) == []  # the result file was used and removed there


def test_sql_error_is_a_message(tbx_store):
    p = wb("sql", "SELECT nope FROM scalars", store=tbx_store, check=False)
    assert p.returncode == 1 and "nope" in p.stderr and "Traceback" not in p.stderr


def test_runs_and_tags_commands(tbx_store):
    runs = wb("runs", "--format", "csv", store=tbx_store).stdout.splitlines()
    assert runs[0].startswith("run_id,status,")
    assert runs[1].startswith("run_a,completed,tensorboard,3,3,57,3,0,250,0,")
    tags = wb("tags", "run_a", "--format", "csv", store=tbx_store).stdout.splitlines()
    assert tags == [
        "tag,metric,points,first_step,last_step,non_finite,looks_like",
        "hparam/final_loss,,1,0,0,0,loss",
        "train/loss,loss,26,0,250,0,",
        "train/lr,lr,20,0,190,0,",
    ]
    missing = wb("tags", "nope", store=tbx_store, check=False)
    assert missing.returncode == 2 and "workbench runs" in missing.stderr
    missing = wb("tags", "nope", "--format", "json", store=tbx_store, check=False)
    assert missing.returncode == 2 and "workbench runs" in missing.stderr and not missing.stdout


def test_a_read_ends_at_once_with_its_whole_answer_and_no_lease_held(tbx_store):
    """A read that printed its answer skips the interpreter's teardown (`cli.run`): all it
    printed is there, its lease is let go, and a failure still ends as any other."""
    query = "SELECT range AS i, 'row ' || range AS s FROM range(200000)"
    lines = wb("sql", query, "--format", "csv", store=tbx_store, process=True).stdout.splitlines()
    assert len(lines) == 200_001 and lines[-1] == "199999,row 199999"
    held = set((tbx_store / "leases").glob("*.lease"))  # (this process's own readers, not yet collected)
    p = wb("runs", "--format", "csv", store=tbx_store, process=True)
    assert set((tbx_store / "leases").glob("*.lease")) <= held  # let go, not left for the next collection
    assert p.stdout == wb("runs", "--format", "csv", store=tbx_store).stdout and "run_a," in p.stdout
    bad = wb("sql", "SELECT nope FROM scalars", store=tbx_store, process=True, check=False)
    assert bad.returncode == 1 and "nope" in bad.stderr and not bad.stdout


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full (a device that is always full) here")
def test_an_answer_that_cannot_be_written_is_an_error_not_a_silent_exit(tbx_store):
    env = {**os.environ, "WORKBENCH_STORE": str(tbx_store)}
    with open("/dev/full", "w") as full:
        p = subprocess.run(
            [sys.executable, "-m", "workbench", "runs", "--format", "csv"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
    assert p.returncode == 1 and "could not be written to standard output" in p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize(
    "args",
    [("sql", "select 1"), ("runs",), ("tags", "run_a"), ("sql", "select count(*) from scalars"), ("--help",)],
)
def test_read_commands_load_no_polars_pyarrow_or_numba(tbx_store, args):
    """A read answers from DuckDB alone: a user runs `workbench runs` dozens of times a day."""
    code = (
        "import atexit, runpy, sys;"
        "atexit.register(lambda: print('LOADED', sorted(m for m in ('polars', 'pyarrow', 'numba', 'numpy')"
        " if m in sys.modules), file=sys.stderr));"
        f"sys.argv = ['workbench', *{list(args)!r}];"
        "runpy.run_module('workbench', run_name='__main__')"
    )
    env = {**os.environ, "WORKBENCH_STORE": str(tbx_store)}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip()
    assert "LOADED []" in p.stderr


@pytest.mark.parametrize("kind", ["jsonl", "tfevents"])
def test_numba_loads_with_the_first_event_file_only(tmp_path, kind):
    """The event-file kernels load numba (about 0.3 s of a small ingest) when an event file is
    read, not with the readers: an ingest of JSONL logs never imports it."""
    run = tmp_path / "logs" / "run_a"
    run.mkdir(parents=True)
    if kind == "jsonl":
        lines = "".join(json.dumps({"step": s, "loss": 1 / s}) + "\n" for s in range(1, 50))
        (run / "metrics.jsonl").write_text(lines)
    else:
        event_file = DATA / "generated/tbx_run/run_a/events.out.tfevents.1796036286.vm"
        (run / event_file.name).write_bytes(event_file.read_bytes())
    argv = ["workbench", "ingest", str(tmp_path / "logs"), "--store", str(tmp_path / "store")]
    code = (
        "import atexit, runpy, sys;"
        "atexit.register(lambda: print('NUMBA', 'numba' in sys.modules, file=sys.stderr));"
        f"sys.argv = {argv!r};"
        "runpy.run_module('workbench', run_name='__main__')"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert "ingested 1 runs" in p.stderr
    assert f"NUMBA {kind == 'tfevents'}" in p.stderr


def test_exit_codes(tmp_path):
    store = tmp_path / "s"
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "events.out.tfevents.corrupt_mid").write_bytes(
        (GEN / "broken/events.out.tfevents.corrupt_mid").read_bytes()
    )
    ok = wb("ingest", bad, store=store, check=False)
    assert ok.returncode == 0 and "20826" in ok.stderr
    (bad / "events.out.tfevents.corrupt_mid").touch()
    strict = wb("ingest", bad, "--strict", store=tmp_path / "s2", check=False)
    assert strict.returncode == 1
    nothing = tmp_path / "nothing"
    nothing.mkdir()
    (nothing / "notes.txt").write_text("hi")
    none = wb("ingest", nothing, store=tmp_path / "s3", check=False)
    assert none.returncode == 2 and "no log files" in none.stderr
    missing = wb("ingest", tmp_path / "does-not-exist", store=tmp_path / "s4", check=False)
    assert missing.returncode == 2 and "does-not-exist" in missing.stderr
    nostore = wb("runs", store=tmp_path / "never", check=False, process=True)
    assert nostore.returncode == 1 and "workbench ingest" in nostore.stderr


@pytest.mark.parametrize("cmd", [None, *sorted(main.commands)])
def test_every_command_has_help_ending_with_an_example(cmd):
    """The last paragraph of the help text (before the options) is `Example:` and command lines."""
    p = CliRunner().invoke(main, [*([cmd] if cmd else []), "--help"], prog_name="workbench")
    assert p.exit_code == 0, p.output
    text = p.output.split("\nOptions:")[0].rstrip()
    head, *lines = [ln.strip() for ln in text.split("\n\n")[-1].splitlines()]
    assert head == "Example:" and lines
    assert all(ln.startswith("workbench ") for ln in lines), lines
    assert any(ln.startswith(f"workbench {cmd or ''}") for ln in lines)


def test_label_command_overrides_and_is_reported(tmp_path):
    store = tmp_path / "s"
    ingest_paths(Store(store), GEN / "tbx_run")
    assert (
        wb(
            "label", "run_a", "--outcome", "failed", "--onset", "120", "--kind", "loss_spike", store=store
        ).stdout
        == ""
    )
    rows = Store(store).query("SELECT run_id, outcome, onset, kind, source FROM labels").rows()
    assert rows == [("run_a", "failed", 120, "loss_spike", "manual")]
    bad = wb("label", "nope", "--outcome", "failed", store=store, check=False)
    assert bad.returncode == 2 and "workbench runs" in bad.stderr


def test_ingest_counts_notes_in_its_summary_and_lists_them_with_verbose(tmp_path):
    """A DeepSpeed run without a batch size in any config makes the monitor reader assume one:
    a note per CSV. The summary counts them and names the query; --verbose lists each."""
    run = ROOT / "sample_runs" / "deepspeed_default_log_level"
    quiet = cli("ingest", run, store=Store(tmp_path / "a"))
    notes = cli("sql", NOTES_QUERY, "--format", "csv", store=Store(tmp_path / "a")).stdout.splitlines()[1:]
    assert len(notes) == 8  # 7 monitor CSVs + the console whose steps are counted from timers
    assert not [ln for ln in quiet.stderr.splitlines() if ln.startswith("note ")]
    assert f"{len(notes)} notes (assumptions readers made)" in " ".join(quiet.stderr.split())
    loud = cli("ingest", run, "--verbose", store=Store(tmp_path / "b"))
    listed = [ln for ln in loud.stderr.splitlines() if ln.startswith("note ")]
    assert len(listed) == len(notes)
