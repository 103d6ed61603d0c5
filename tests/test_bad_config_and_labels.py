"""Bad settings and labels are messages naming the file and line, or problem rows; never a
traceback, never silently stored."""

from __future__ import annotations

import json

import pytest
from conftest import cli, ingest_paths

from workbench.store import Store


def jsonl_run(folder, steps=range(50)):
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "log.jsonl", "w") as f:
        for i in steps:
            f.write(json.dumps({"step": i, "loss": 1.0 / (i + 1), "nan_check": float(i)}) + "\n")


@pytest.fixture(scope="module")
def ingested(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad_config")
    jsonl_run(root / "runs/a")
    store = Store(root / "store")
    ingest_paths(store, root / "runs")
    return store


@pytest.mark.parametrize(
    "text, line, said",
    [
        ("[aliases]\nloss = [\n", 2, "Invalid value"),
        ('[aliases]\nloss = "x"\nloss = "y"\n', 3, "workbench.toml, line 3: Cannot overwrite a value"),
        ('[aliases]\nloss = ["*"]\n', 2, "alias loss = '*' matches every tag"),
        ('[aliases]\ngrad_norm = "**"\n', 2, "alias grad_norm = '**' matches every tag"),
        ("[aliases]\nloss = 5\n", 2, "alias loss must be a glob or a list of globs"),
        ("aliases = 3\n", 1, "aliases must be a table"),
    ],
)
@pytest.mark.parametrize(
    "command",
    [
        ("runs",),
        ("sql", "SELECT count(*) FROM scalars"),
        ("tags", "a"),
        ("label", "a", "--outcome", "healthy"),
    ],
)
def test_a_bad_workbench_toml_is_a_message_naming_file_and_line(
    ingested, tmp_path, text, line, said, command
):
    (ingested.root / "workbench.toml").write_text(text)
    try:
        r = cli(*command, store=ingested)
    finally:
        (ingested.root / "workbench.toml").unlink()
    assert r.exit_code == 1, r.output
    assert f"{ingested.root / 'workbench.toml'}, line {line}: " in r.stderr and said in r.stderr
    assert "Traceback" not in r.output


def test_an_alias_naming_tags_still_works(ingested):
    (ingested.root / "workbench.toml").write_text('[aliases]\nloss = ["lo*"]\n')
    try:
        assert ingested.query("SELECT DISTINCT tag FROM scalars WHERE metric = 'loss'").rows() == [("loss",)]
    finally:
        (ingested.root / "workbench.toml").unlink()


def test_labels_for_a_missing_run_or_an_onset_outside_the_run_are_problem_rows(tmp_path):
    jsonl_run(tmp_path / "runs/a")
    jsonl_run(tmp_path / "runs/b")
    (tmp_path / "runs/labels.toml").write_text(
        '[runs.a]\noutcome = "failed"\nonset = 5000\n'
        '[runs.b]\noutcome = "failed"\nonset = 20\n'
        '[runs.ghost]\noutcome = "healthy"\n'
    )
    store = Store(tmp_path / "store")
    report = ingest_paths(store, tmp_path / "runs")
    problems = sorted((p.kind, p.message) for _, p in report.problems)
    assert problems == [
        ("label_onset_outside", '[runs."a"]: onset 5000 is outside the run\'s steps (0 to 49)'),
        ("label_unknown_run", f'[runs."ghost"]: no such run under {tmp_path / "runs"}'),
    ]
    stored = store.query("SELECT kind, path FROM problems ORDER BY kind").rows()
    assert stored == [(k, str(tmp_path / "runs/labels.toml")) for k, _ in problems]
    # the labels are kept: a run may come later, and the onset is the user's word
    labels = store.query("SELECT run_id, onset FROM labels WHERE source = 'manual' ORDER BY run_id").rows()
    assert labels == [("a", 5000), ("b", 20), ("ghost", None)]
    # once the run is there and the onset inside it, the problems go
    jsonl_run(tmp_path / "runs/ghost")
    (tmp_path / "runs/labels.toml").write_text(
        '[runs.a]\noutcome = "failed"\nonset = 40\n[runs.ghost]\noutcome = "healthy"\n'
    )
    assert ingest_paths(store, tmp_path / "runs").problems == []
    assert store.query("SELECT count(*) FROM problems").rows() == [(0,)]


def test_a_label_naming_a_folder_of_one_run_is_that_runs(tmp_path):
    # Lightning writes a run into run/lightning_logs/version_0; a label names the folder a user knows
    jsonl_run(tmp_path / "runs/lit/lightning_logs/version_0", steps=range(30))
    jsonl_run(tmp_path / "runs/sweep/seed0")
    jsonl_run(tmp_path / "runs/sweep/seed1")
    (tmp_path / "runs/labels.toml").write_text(
        '[runs.lit]\noutcome = "failed"\nonset = 20\n[runs.sweep]\noutcome = "healthy"\n'
    )
    store = Store(tmp_path / "store")
    report = ingest_paths(store, tmp_path / "runs")
    assert [(p.kind, p.message) for _, p in report.problems] == [
        (
            "label_unknown_run",
            '[runs."sweep"]: a folder of 2 runs (sweep/seed0, sweep/seed1); label one of them',
        )
    ]
    labels = store.query("SELECT run_id, outcome, onset FROM labels WHERE source = 'manual' ORDER BY run_id")
    assert labels.rows() == [("lit/lightning_logs/version_0", "failed", 20), ("sweep", "healthy", None)]
    assert ingest_paths(store, tmp_path / "runs").problems[0][1].kind == "label_unknown_run"  # said again
    assert store.query("SELECT count(*) FROM labels WHERE source = 'manual'").rows() == [(2,)]  # kept once


def test_a_malformed_labels_toml_names_its_line(tmp_path):
    jsonl_run(tmp_path / "runs/a")
    (tmp_path / "runs/labels.toml").write_text('[runs.a]\noutcome = "failed"\nonset = \n')
    report = ingest_paths(Store(tmp_path / "store"), tmp_path / "runs")
    [(_, p)] = report.problems
    assert (p.kind, p.offset) == ("bad_toml", 3) and p.message.startswith("line 3: ")


def test_label_onset_out_of_range_and_a_file_as_store_are_messages(ingested, tmp_path):
    r = cli("label", "a", "--outcome", "failed", "--onset", "99999999999999999999", store=ingested)
    assert r.exit_code == 2 and "99999999999999999999 is not in the range" in r.stderr
    r = cli("label", "a", "--outcome", "failed", "--onset", "-1", store=ingested)
    assert r.exit_code == 2 and "not in the range" in r.stderr
    r = cli("label", "a", "--outcome", "failed", "--onset", "5000", store=ingested)
    assert r.exit_code == 0 and "onset 5000 is outside the steps of a (0 to 49)" in " ".join(r.stderr.split())
    not_a_folder = tmp_path / "passwd"
    not_a_folder.write_text("root:x:0:0::/root:/bin/sh\n")
    for args in (("label", "a", "--outcome", "failed"), ("runs",), ("ingest", str(tmp_path)), ("compact",)):
        r = cli(*args, "--store", not_a_folder)
        assert r.exit_code == 1, (args, r.output)
        assert f"{not_a_folder} is a file, not a store folder" in " ".join(r.stderr.split())
    assert not_a_folder.read_text() == "root:x:0:0::/root:/bin/sh\n"
