"""W&B offline run folders written here by wandb 0.31.0 (wandb-core) and 0.17.9 (the Python
internal process), read with the installed wandb's own reader; counted against what the loop
passed to `wandb.log` (tests/data/real/wandb_offline/train_wandb.py writes both)."""

from __future__ import annotations

import json
import sys

import pytest
from real_counts import REAL, assert_matches, expected, real_tree_store

CASES = {
    "wandb-0.31.0_clean": "completed",
    "wandb-0.31.0_crash_exit1": "crashed",
    "wandb-0.17.9_clean": "completed",
}


def run_dir(case: str) -> str:
    (folder,) = (REAL / "wandb_offline" / case / "wandb").iterdir()
    return folder.name


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return real_tree_store(tmp_path_factory, {case: f"wandb_offline/{case}/wandb" for case in CASES})


def run_id(store, case: str) -> str:
    ids = store.query(f"SELECT run_id FROM runs WHERE run_id LIKE '{case}%'")["run_id"].to_list()
    assert ids == [f"{case}/{run_dir(case)}"]
    return ids[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_history_matches_what_the_loop_logged(store, case):
    counted = expected(f"wandb_offline/{case}/{run_dir(case)}.logged.jsonl")
    assert {k for k in counted if not k.startswith("_")} == {
        "lr",
        "train/grad_norm",
        "train/loss",
        "val/loss",
    }
    assert_matches(store, run_id(store, case), counted)


@pytest.mark.parametrize("case", sorted(CASES))
def test_exit_record_is_the_status(store, case):
    status, evidence = store.query(
        f"SELECT status, evidence FROM runs WHERE run_id = '{run_id(store, case)}'"
    ).row(0)
    assert status == CASES[case]
    assert evidence.startswith("W&B run exited with code " + ("0" if CASES[case] == "completed" else "1"))


def test_run_files_belong_to_the_run_and_config_is_kept(store):
    run = run_id(store, "wandb-0.31.0_clean")
    files = dict(store.query(f"SELECT path, format FROM files WHERE run_id = '{run}'").rows())
    names = {p.split(run_dir("wandb-0.31.0_clean") + "/", 1)[1]: f for p, f in files.items()}
    assert names[f"run-{run_dir('wandb-0.31.0_clean').rsplit('-', 1)[1]}.wandb"] == "wandb"
    assert (
        "files/output.log" in names and "logs/debug.log" in names
    )  # listed under the run, not runs of their own
    config = json.loads(store.query(f"SELECT config FROM runs WHERE run_id = '{run}'")["config"][0])
    assert config["wandb"]["config"] == {"lr": 0.05, "hidden": 16, "steps": 120, "seed": 0}


def test_without_the_package_the_history_is_a_listed_problem(tmp_path_factory, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    store = real_tree_store(tmp_path_factory, {"old": "wandb_offline/wandb-0.17.9_clean/wandb"})
    run = f"old/{run_dir('wandb-0.17.9_clean')}"
    problems = store.query(f"SELECT kind, message FROM problems WHERE run_id = '{run}'").rows()
    assert (
        "needs_package",
        "W&B history not read: the wandb package is not installed (pip install -e '.[wandb]')",
    ) in problems
    assert store.query(f"SELECT count(*) n FROM scalars_all WHERE run_id = '{run}'")["n"][0] == 0
    note = store.query("SELECT note FROM files WHERE path LIKE '%wandb-summary.json'")["note"][0]
    assert note == "wandb-summary.json has no _step: nothing to place on the run's steps"
