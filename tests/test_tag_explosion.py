"""A log that names a new key in every record (a tag explosion) costs memory by its points, not
keys x records, and past `[ingest] max_tags_per_run` distinct tags a run's further tags are a
problem row, not thousands of series that bury the rest."""

from __future__ import annotations

import json

import pytest
from conftest import cli, ingest_paths

from ingest.jsonl import block_points
from workbench.store import Store

LINES, KEYS, LIMIT = 100, 100, 500


def exploding(i: int, keys: int = KEYS) -> str:
    return json.dumps({"step": i, "loss": 1.0 / (i + 1), **{f"k{i}_{j}": j / 10 for j in range(keys)}})


def test_a_block_of_records_with_new_keys_each_is_read_point_by_point():
    wide = [exploding(i, 200) for i in range(200)]
    assert block_points(wide) is None  # its table would hold 200 x 40,001 cells for 40,200 points
    narrow = [json.dumps({"step": i, "loss": 1.0, "lr": 0.1}) for i in range(200)]
    points, last, key, records = block_points(narrow)
    assert (len(points), last, key, records) == (400, 199, "step", 200)  # the table path still
    # train and evaluation records by turns, a few keys each: still the table path
    mixed = [
        json.dumps({"step": i, **({"loss": 1.0} if i % 2 else {"eval_loss": 2.0, "eval_acc": 0.5})})
        for i in range(200)
    ]
    assert len(block_points(mixed)[0]) == 300


@pytest.fixture
def exploded(tmp_path):
    (tmp_path / "runs/x").mkdir(parents=True)
    (tmp_path / "runs/x/log.jsonl").write_text("".join(exploding(i) + "\n" for i in range(LINES)))
    store = Store(tmp_path / "store")
    store.root.mkdir()
    (store.root / "workbench.toml").write_text(f"[ingest]\nmax_tags_per_run = {LIMIT}\n")
    return store, tmp_path / "runs"


@pytest.mark.slow  # two ingests of 10,000 points in 10,000 tags: about 5 s on 2 cores
def test_tags_past_the_limit_are_a_problem_row_and_the_first_ones_are_kept(exploded):
    store, runs = exploded
    report = ingest_paths(store, runs)
    # first seen, first kept: loss (every line), then the k-keys in the order they were logged
    kept_k = LIMIT - 1
    dropped = LINES * KEYS - kept_k
    [(_, problem)] = report.problems
    assert problem.kind == "too_many_tags"
    assert problem.message == (
        f"{dropped:,} more distinct tags than the run's limit of {LIMIT:,} (max_tags_per_run under "
        f"[ingest] in workbench.toml); their {dropped:,} points were not stored"
    )
    assert store.query("SELECT count(DISTINCT tag), count(*) FROM scalars").rows() == [
        (LIMIT, LINES + kept_k)
    ]
    assert store.query("SELECT count(*) FROM scalars WHERE tag = 'loss'").rows() == [(LINES,)]
    last_kept = f"k{(kept_k - 1) // KEYS}_{(kept_k - 1) % KEYS}"
    assert store.query("SELECT count(*) FROM scalars WHERE tag = ?", [last_kept]).rows() == [(1,)]
    assert store.query("SELECT kind FROM problems").rows() == [("too_many_tags",)]
    # appended records: loss is still stored, new tags are not (the run holds its limit)
    with open(runs / "x/log.jsonl", "a") as f:
        f.write(exploding(LINES) + "\n")
    report = ingest_paths(store, runs)
    assert [p.kind for _, p in report.problems] == ["too_many_tags"]
    assert store.query("SELECT count(DISTINCT tag), count(*) FROM scalars").rows() == [
        (LIMIT, LINES + 1 + kept_k)
    ]


def test_the_limit_setting_must_be_a_whole_number(exploded):
    store, runs = exploded
    (store.root / "workbench.toml").write_text("[ingest]\n\nmax_tags_per_run = 0\n")
    r = cli("ingest", runs, store=store)
    assert r.exit_code == 1
    assert (
        f"{store.root / 'workbench.toml'}, line 3: max_tags_per_run must be a whole number of at least 1"
        in (" ".join(r.stderr.split()))
    )
