"""A folder or path that cannot be looked into costs only itself: a problem row naming it, and
every other run ingested."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ingest_paths

from workbench.store import Store

POINTS = 40


def unreadable(tmp_path: Path) -> Path:
    """A path whose stat or listing fails with EACCES: a `chmod 000` folder, or, for root (who
    ignores permissions), a link into /proc that even root may not follow (another namespace's
    process cwd)."""
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir()
        (locked / "log.jsonl").write_text('{"step": 0, "loss": 1.0}\n')
        locked.chmod(0)
        return locked
    for pid in ("1", "2"):
        target = Path(f"/proc/{pid}/cwd")
        try:
            os.stat(target)
        except PermissionError:
            return target
        except OSError:
            continue
    pytest.skip("running as root, and no /proc link here refuses root (permissions are not enforced)")


def good_run(folder: Path) -> None:
    folder.mkdir(parents=True)
    with open(folder / "log.jsonl", "w") as f:
        for i in range(POINTS):
            f.write(json.dumps({"step": i, "loss": 1.0 / (i + 1)}) + "\n")


@pytest.fixture
def tree(tmp_path):
    bad = unreadable(tmp_path)
    runs = tmp_path / "runs"
    good_run(runs / "a")
    good_run(runs / "z")
    if bad.parent != tmp_path:  # root: the /proc link sits inside the tree
        (runs / "b").symlink_to(bad)
    else:
        bad.rename(runs / "b")
    yield runs, bad
    if not (runs / "b").is_symlink():
        (runs / "b").chmod(0o755)  # so that pytest can remove it


def test_an_unreadable_folder_in_the_tree_is_a_problem_row(tree, tmp_path):
    runs, _ = tree
    store = Store(tmp_path / "store")
    report = ingest_paths(store, runs)
    assert [p for p, _ in report.problems] == [str(runs / "b")]
    [(path, message)] = store.query("SELECT path, message FROM problems").rows()
    assert path == str(runs / "b") and "Permission denied" in message, message
    assert store.query("SELECT run_id, count(*) FROM scalars GROUP BY run_id ORDER BY run_id").rows() == [
        ("a", POINTS),
        ("z", POINTS),
    ]


def test_an_unreadable_path_on_the_command_line_is_a_problem_row(tree, tmp_path):
    runs, bad = tree
    store = tmp_path / "store"
    done = subprocess.run(
        [sys.executable, "-m", "workbench", "ingest", str(runs / "a"), str(bad), "--store", str(store)],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert f"problem {bad} @ 0: not read: Permission denied" in done.stderr
    s = Store(store)
    assert s.query("SELECT path, kind FROM problems").rows() == [(str(bad), "not_read")]
    assert s.query("SELECT count(*) FROM scalars").rows() == [(POINTS,)]
    done = subprocess.run(  # only the unreadable path: nothing found, said so, exit 2
        [sys.executable, "-m", "workbench", "ingest", str(bad), "--store", str(store)],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr and "no log files found" in done.stderr
