"""A full disk during compact, replay, label and `check --repair` ends in the message ingest
gives (what to do, that the store holds what it held), never a traceback, and the store stays
whole: every point still there, counted from the logs.

The store lives on a real 8 MiB tmpfs (mounting needs root; the tests are skipped without it),
filled to the last byte and then to a few sizes below, where some files fit and others do not.
"""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import cli, ingest_paths
from disks import fill, mounted_tmpfs

from workbench.store import Store

RUNS, STEPS = 3, 2000
LEAVE = (0, 2_000, 8_000, 30_000, 100_000)  # bytes left: nothing, then room for a part of the work


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A store of RUNS logs ingested in three commits (so that compact has files to merge)."""
    root = tmp_path_factory.mktemp("pristine")
    for r in range(RUNS):
        (root / "runs" / f"run{r}").mkdir(parents=True)
        with open(root / "runs" / f"run{r}" / "log.jsonl", "w") as f:
            f.writelines(
                json.dumps({"step": i, "loss": 5.0 / (i + 1), "gn": i % 7}) + "\n" for i in range(STEPS)
            )
    store = Store(root / "store")
    ingest_paths(store, root / "runs" / "run0")
    ingest_paths(store, root / "runs" / "run1")
    ingest_paths(store, root / "runs")
    return store


@pytest.fixture
def small_fs(tmp_path):
    yield from mounted_tmpfs(tmp_path / "fs")


def points(store: Store) -> int:
    return store.query("SELECT count(*) FROM scalars").rows()[0][0]


def damage_a_part(store: Store) -> None:
    part = sorted((store.root / "scalars").rglob("*.parquet"))[0]
    part.write_bytes(part.read_bytes()[:100])


COMMANDS = {
    "compact": ("compact",),
    "replay": ("replay",),
    "label": ("label", "run0", "--outcome", "failed", "--onset", "5"),
    "check --repair": ("check", "--repair"),
}


@pytest.mark.slow  # 4 commands x 5 fills of a real file system: about 20 s on 2 cores
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_full_disk_is_a_message_and_the_store_stays_whole(pristine, small_fs, command):
    expected = RUNS * STEPS * 2
    outcomes = []
    for leave in LEAVE:
        store = Store(small_fs / "store")
        shutil.copytree(pristine.root, store.root)
        if command == "check --repair":
            damage_a_part(store)
        filler = fill(small_fs, leave)
        r = cli(*COMMANDS[command], store=store)  # an exception it did not turn into a message fails here
        said = " ".join(r.stderr.split())
        outcomes.append(r.exit_code)
        if r.exit_code != 0:
            assert r.exit_code == 1 and "disk full" in said and "free some space" in said, (leave, r.output)
        filler.unlink()
        if command == "check --repair":
            assert cli("check", "--repair", store=store).exit_code == 0  # with room again: mended
        report = store.check()
        assert report.ok, (leave, [d.message for d in report.damage])
        assert points(store) == expected
        shutil.rmtree(store.root)
    assert outcomes[0] == 1  # full to the last byte: refused, said so
