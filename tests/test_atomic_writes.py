"""Files the workbench writes outside the store (`backtest --out`) are whole or as they were:
a kill or a full disk while writing leaves the previous files intact."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import cli, ingest_paths
from disks import fill, mounted_tmpfs

from detectors.backtest import Settings, backtest
from detectors.rules import rules_from_text
from workbench.errors import WorkbenchError
from workbench.store import Store

RULES = '[[rule]]\nid = "high"\nwhen = "loss > 2"\n'


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    root = tmp_path_factory.mktemp("labelled")
    for run, nan_at in (("failed", 30), ("healthy", None)):
        (root / "runs" / run).mkdir(parents=True)
        with open(root / "runs" / run / "log.jsonl", "w") as f:
            for i in range(60):
                loss = (
                    "NaN" if nan_at is not None and i >= nan_at else 1.0 + (3.0 if nan_at and i > 25 else 0.0)
                )
                f.write(f'{{"step": {i}, "loss": {loss}}}\n')
    (root / "runs/labels.toml").write_text('[runs.healthy]\noutcome = "healthy"\n')
    store = Store(root / "store")
    ingest_paths(store, root / "runs")
    (root / "rules.toml").write_text(RULES)
    result = backtest(store, rules_from_text(RULES), None, Settings(bootstrap=0), predictors=False)
    return store, root / "rules.toml", result


def backtest_out(store, rules, out):
    return cli("backtest", "--rules", rules, "--bootstrap", 0, "--out", out, store=store)


def contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture
def small_fs(tmp_path):
    yield from mounted_tmpfs(tmp_path / "fs")


def test_a_full_disk_leaves_the_previous_results(labelled, small_fs):
    store, rules, result = labelled
    out = small_fs / "results"
    assert backtest_out(store, rules, out).exit_code == 0
    before = contents(out)
    assert json.loads(before["backtest.json"])["rules"][0]["rule"] == "high"
    filler = fill(small_fs)
    r = backtest_out(store, rules, out)  # the command: its message and exit code
    assert r.exit_code == 1, r.output
    said = " ".join(r.stderr.split())
    assert f"error: disk full while writing {out / 'backtest.json'}" in said
    assert "the files there are as they were before" in said
    assert contents(out) == before  # no file truncated, no temporary file left
    filler.unlink()
    for leave in (2000, 20_000):  # room for a part of the files
        filler = fill(small_fs, leave)
        with pytest.raises(WorkbenchError, match="disk full while writing"):
            result.write(out)
        assert contents(out) == before
        filler.unlink()
    result.write(out)  # with room again: written whole
    assert json.loads((out / "backtest.json").read_text()) == json.loads(result.to_json())


WRITER = """
import sys
from pathlib import Path
from workbench.store import atomic

out = Path(sys.argv[1])
atomic.write_files({out / "backtest.json": b"[" * (64 << 20), out / "rules.csv": b"x" * (64 << 20)})
"""


def test_a_kill_while_writing_leaves_the_previous_files(labelled, tmp_path):
    out = tmp_path / "results"
    labelled[2].write(out)
    before = contents(out)
    for delay in (0.0, 0.01, 0.03):  # while 128 MiB of temporary files are written and flushed
        p = subprocess.Popen([sys.executable, "-c", WRITER, str(out)])
        deadline = time.monotonic() + 30
        while not any(n.startswith(".") for n in os.listdir(out)) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(delay)
        writing = [n for n in os.listdir(out) if n.startswith(".backtest.json.")]
        assert p.poll() is None and writing, "the kill lands while the new files are being written"
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        assert {k: v for k, v in contents(out).items() if not k.startswith(".")} == before
    json.loads((out / "backtest.json").read_text())
