"""JSON Lines metric logs: malformed lines, numbers as strings, bare NaN/Infinity."""

from __future__ import annotations

import pytest
from conftest import ingest_paths
from real_counts import assert_matches, expected, real_tree_store


def test_malformed_jsonl_lines_are_reported_with_line_numbers(store, tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        '{"step": 0, "loss": 1.0}\n{"step": 1, "loss": NaN}\nnot json at all\n[1, 2]\n{"step": 3, "loss": "0.50", "lr": Infinity}\n'
    )
    r = ingest_paths(store, run)
    assert [(p.offset, p.kind) for _, p in r.problems] == [(3, "bad_json"), (4, "bad_json")]
    df = store.query("SELECT tag, step, value FROM scalars ORDER BY tag, step")
    rows = df.rows()
    assert rows[0] == ("loss", 0, 1.0) and rows[1][:2] == ("loss", 1) and rows[1][2] != rows[1][2]
    assert rows[2] == ("loss", 3, 0.5) and rows[3] == ("lr", 3, float("inf"))


# ---- step keys other than `step`: the same real run logged with its step
# under each key real scripts use (tests/data/real/custom_names, written by train_custom.py)
STEP_KEYS = ("it", "iter", "iteration", "global_step", "_step", "trainer/global_step", "batch")
FOLDERS = {key: f"jsonl_{key.replace('/', '_')}" for key in STEP_KEYS}


@pytest.fixture(scope="module")
def custom(tmp_path_factory):
    return real_tree_store(tmp_path_factory, {f: f"custom_names/{f}" for f in FOLDERS.values()})


@pytest.mark.parametrize("key", STEP_KEYS)
def test_the_step_key_real_scripts_use_is_taken_and_named(custom, key):
    run = FOLDERS[key]
    assert_matches(custom, run, expected(f"custom_names/{run}/metrics.jsonl"))
    note = custom.query(f"SELECT note FROM files WHERE run_id = '{run}'")["note"][0]
    assert note == f"step from `{key}`"
    assert key not in set(custom.query(f"SELECT DISTINCT tag FROM scalars WHERE run_id = '{run}'")["tag"])
