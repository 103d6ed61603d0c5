"""Live equals replay on real training: `workbench watch` follows three real training jobs
(tests/live_trainer.py: torch on CPU, logging TensorBoard + JSONL + console every step) while
they run — a healthy one, one that diverges to NaN, one that is SIGKILLed mid-line and resumed
from an earlier checkpoint — and when they have finished, the alerts it raised live equal
`workbench replay` over the finished logs, rule by rule and step by step (the default rules:
the built-ins and the guides' rule set)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from detectors.replay import replay as run_replay
from workbench.store import Store

pytest.importorskip("torch", reason="the live training test needs torch (CI installs torch==2.13.0, CPU)")

TRAINER = Path(__file__).parent / "live_trainer.py"
COLS = ["run_id", "rule", "tag", "step_start", "step_fired", "step_end", "value", "message", "severity"]


def trainer(run: Path, *args) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(TRAINER), str(run), *map(str, args)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def workbench(*args, **kw):
    return [sys.executable, "-m", "workbench", *map(str, args)]


@pytest.mark.slow
def test_live_alerts_equal_a_replay_of_the_finished_logs(tmp_path):
    runs, store = tmp_path / "runs", tmp_path / "store"
    runs.mkdir()
    env = {**os.environ, "WORKBENCH_STORE": str(store)}
    # the event-file kernels compiled (or loaded from the cache) before the jobs start, as on any
    # machine that has read an event file once: a first compile (~10 s) would outlast the jobs
    from tensorboardX import SummaryWriter

    with SummaryWriter(str(tmp_path / "warm" / "tb")) as w:
        w.add_scalar("loss", 1.0, 0)
    warm_env = {**env, "WORKBENCH_STORE": str(tmp_path / "warm_store")}
    subprocess.run(workbench("ingest", tmp_path / "warm"), env=warm_env, capture_output=True, check=True)
    watch = subprocess.Popen(
        workbench("watch", runs, "--interval", 0.3, "--until-finished"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    jobs = [
        trainer(runs / "healthy", "--steps", 140, "--seed", 0),
        trainer(
            runs / "diverges",
            "--steps",
            160,
            "--seed",
            1,
            "--diverge-at",
            70,
            "--nan-patience",
            30,
            "--nan-step-delay",
            0.1,
        ),
    ]
    killed = trainer(runs / "killed_resumed", "--steps", 150, "--seed", 2, "--kill-at", 110)
    assert killed.wait(300) == -9, killed.stderr.read()
    time.sleep(1.2)  # a restarted job: its new event file is named and stamped later
    jobs.append(trainer(runs / "killed_resumed", "--steps", 150, "--seed", 2, "--resume-from", 100))
    for j in jobs:
        assert j.wait(300) == 0, j.stderr.read()
    out, err = watch.communicate(timeout=300)
    assert watch.returncode == 0, err

    # the replay over the finished logs (the default rules, as `workbench replay` runs them)
    live = Store(store).connect().sql("SELECT * FROM alerts").pl().select(COLS).sort(COLS[:4])
    replay = run_replay(Store(store), None, None).alerts.select(COLS).sort(COLS[:4])
    diff = live.join(replay, on=COLS, how="anti", nulls_equal=True).with_columns(side=pl.lit("live only"))
    diff = pl.concat(
        [
            diff,
            replay.join(live, on=COLS, how="anti", nulls_equal=True).with_columns(side=pl.lit("replay only")),
        ]
    )
    assert diff.is_empty(), f"live and replay differ:\n{diff}\nwatch stderr:\n{err[-3000:]}"
    assert live.height == replay.height
    alerts = Store(store).connect().sql("SELECT * FROM alerts").pl()
    # each interval once, as the watch first raised it
    assert alerts.select(COLS[:4]).is_unique().all() and set(alerts["source"]) == {"live"}

    # what the runs really did, as the store and the alerts tell it
    con = Store(store).connect()
    nan = live.filter((pl.col("run_id") == "diverges") & (pl.col("rule") == "non_finite_loss"))
    assert nan.height == 1
    first_nan = con.sql(
        "SELECT min(step) FROM scalars WHERE run_id = 'diverges' AND metric = 'loss' AND NOT isfinite(value)"
    ).fetchall()[0][0]
    assert nan["step_start"][0] == first_nan
    # raised while the job still ran: before it wrote its end-of-run record (30 steps, 3 s later;
    # at the usual 0.02 s a step, a poll delayed by a loaded machine could come after the end)
    raised = alerts.filter((pl.col("source") == "live") & (pl.col("rule") == "non_finite_loss"))["raised_at"][
        0
    ]
    end_marker = max(p.stat().st_mtime for p in (runs / "diverges" / "tb").glob("*/events.out.tfevents.*"))
    assert raised < end_marker, f"raised {raised - end_marker:.1f} s after the job ended:\n{err[-3000:]}"
    superseded = con.sql(
        "SELECT count(*) FROM scalars_all WHERE run_id = 'killed_resumed' AND superseded AND step >= 100"
    ).fetchall()[0][0]
    assert superseded > 0  # the resumed job logged steps 100.. again
    assert con.sql("SELECT count(*) FROM problems WHERE run_id = 'killed_resumed'").fetchall()[0][0] >= 1
    statuses = dict(con.sql("SELECT run_id, status FROM runs").fetchall())
    assert statuses["diverges"] == "diverged" and statuses["healthy"] == "completed"

    # stdout: one JSON line per alert interval raised, never twice
    sent = [json.loads(line) for line in out.splitlines()]
    keys = [(a["run_id"], a["rule"], a["tag"], a["step_start"]) for a in sent]
    assert len(keys) == len(set(keys))
    assert ("diverges", "non_finite_loss", "", first_nan) in keys
