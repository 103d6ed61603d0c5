"""`workbench watch` on a bad day: a second watch on the same store refuses, naming the first (or
waits to take over); a watch killed and restarted sends what no watch delivered, each delivery
carrying an id a receiver drops duplicates by; a full disk (a real tmpfs) or a damaged part
fails polls, not the watch; and two watches and an ingest killed at random moments over a
growing log lose no alert. A real webhook receiver on 127.0.0.1 counts what arrives."""

from __future__ import annotations

import http.server
import io
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import polars as pl
import pytest
from disks import fill, mounted_tmpfs
from rich.console import Console

from detectors.replay import replay
from detectors.rules import rules_from_text
from workbench.notify import WebhookNotifier, alert_id
from workbench.store import Store, layout
from workbench.watch import Watch

RULE_TEXT = '[[rule]]\nid = "spike"\nwhen = "loss > 10"\n'
RULES = rules_from_text(RULE_TEXT)
QUIET = Console(stderr=True, quiet=True)


def loss_at(step: int) -> float:
    return 20.0 if step % 40 == 20 else 1.0 + 1.0 / (step + 1)  # one alert interval per 40 steps


def log(run: Path, steps: range) -> None:
    run.mkdir(parents=True, exist_ok=True)
    with open(run / "metrics.jsonl", "a") as f:
        for s in steps:
            f.write(json.dumps({"step": s, "loss": loss_at(s)}) + "\n")


class Receiver(http.server.BaseHTTPRequestHandler):
    """A webhook receiver: every POST's Idempotency-Key and body, in order of arrival."""

    got: list[tuple[str, dict]] = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).got.append((self.headers["Idempotency-Key"], body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def receiver():
    Receiver.got = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", Receiver.got
    server.shutdown()
    server.server_close()


def steps_received(got: list[tuple[str, dict]]) -> list[int]:
    for key, body in got:
        assert key == body["alert_id"] == alert_id(body)  # the id names the alert, in header and body
    return sorted(body["step_start"] for _, body in got)


def live_and_replayed(store: Store) -> tuple[list[tuple], list[tuple]]:
    """The alerts the watch stored, and those a replay of the finished logs computes (the store
    keeps each interval once, as the watch first raised it)."""
    cols = ["run_id", "rule", "step_start", "step_end"]
    live = store.alerts().filter(pl.col("source") == "live").select(cols).sort(cols).rows()
    replayed = replay(store, RULES, None).alerts.select(cols).sort(cols).rows()
    return live, replayed


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


# ---- one watch per store ------------------------------------------------------------------


def watch_cmd(runs: Path, rules: Path, *args) -> list[str]:
    return [sys.executable, "-m", "workbench", "watch", str(runs), "--rules", str(rules), *map(str, args)]


def holder(store: Path) -> int | None:
    try:
        return json.loads((store / layout.WATCH_LOCK).read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None


def followed(store: Path) -> bool:
    """Whether a watch made its first poll on the store (it recorded the folders it follows)."""
    try:
        gen = layout.current_generation(store)
        return gen is not None and layout.read_meta("watched", gen).height > 0
    except Exception:  # noqa: BLE001 - not yet, or mid-publish
        return False


def test_a_second_watch_refuses_naming_the_first_and_a_standby_takes_over(tmp_path, receiver):
    url, got = receiver
    runs, store, rules = tmp_path / "runs", tmp_path / "store", tmp_path / "rules.toml"
    rules.write_text(RULE_TEXT)
    log(runs / "job", range(0))
    env = {**os.environ, "WORKBENCH_STORE": str(store)}
    args = ("--interval", 0.2, "--notify-url", url)
    first = subprocess.Popen(
        watch_cmd(runs, rules, *args), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    standby = None
    try:
        wait_for(lambda: holder(store) == first.pid and followed(store), 30, "the first watch's first poll")
        standby_err = tmp_path / "standby.err"
        with open(standby_err, "w") as err:
            standby = subprocess.Popen(
                watch_cmd(runs, rules, *args, "--wait", "inf"), env=env, stdout=subprocess.DEVNULL, stderr=err
            )
        second = subprocess.run(watch_cmd(runs, rules), env=env, capture_output=True, text=True, timeout=60)
        assert second.returncode == 1 and second.stdout == ""
        said = " ".join(second.stderr.split())
        assert (
            f"another watch (pid {first.pid} on {socket.gethostname()}, workbench watch following {runs}"
            in said
        )
        assert "since 20" in said and "--wait SECONDS" in said and "Traceback" not in said
        wait_for(
            lambda: "waiting for the store's watch" in standby_err.read_text(), 30, "the standby to wait"
        )
        assert f"(pid {first.pid} on" in standby_err.read_text()
        first.kill()
        first.wait()
        wait_for(lambda: holder(store) == standby.pid, 30, "the standby to take over")
        log(runs / "job", range(100))
        wait_for(lambda: len(got) >= 2, 30, "the standby's notifications")
        standby.send_signal(signal.SIGINT)
        assert standby.wait(60) == 0
    finally:
        for p in (first, standby):
            if p is not None and p.poll() is None:
                p.kill()
    assert steps_received(got) == [20, 60]
    live, replayed = live_and_replayed(Store(store))
    assert live == replayed and len(live) == 2


# ---- restarts: what was never delivered is sent -------------------------------------------


def test_a_restarted_watch_sends_what_was_never_sent(tmp_path, receiver):
    url, got = receiver
    runs, store = tmp_path / "runs", Store(tmp_path / "store")
    errors: list[str] = []

    def watch(hook: str = url) -> Watch:
        return Watch([runs], store, RULES, [WebhookNotifier(hook, errors.append, retries=0)], console=QUIET)

    log(runs / "job", range(50))  # the alert at 20 is in the logs before any watch: history
    w1 = watch()
    w1.poll()
    log(runs / "job", range(50, 100))
    w1.poll()  # sends 60
    w1.dispatch.close()
    # ... and is killed before its next poll stores that 60 was delivered; the job goes on
    log(runs / "job", range(100, 150))  # 100 and 140, raised between the kill and a restart
    w2 = watch()
    w2.poll()  # sends 60 again (it cannot know it arrived) and 100, 140
    w2.dispatch.close()
    w2.poll()  # stores what was delivered
    log(runs / "job", range(150, 200))  # 180, sent to a receiver that is down
    w3 = watch("http://127.0.0.1:9/down")
    w3.poll()
    w3.dispatch.close()
    w3.poll()
    w4 = watch()
    w4.poll()  # sends 180, that failed, and nothing that was delivered
    w4.dispatch.close()
    w4.poll()

    assert steps_received(got) == [60, 60, 100, 140, 180]
    assert len({key for key, _ in got}) == 4  # the duplicate 60 carries the same id
    assert sum("127.0.0.1:9/down" in e for e in errors) == 1
    outcomes = store.query("SELECT step_start, outcome FROM deliveries ORDER BY step_start").rows()
    assert outcomes == [(20, "history"), (60, "sent"), (100, "sent"), (140, "sent"), (180, "sent")]
    live, replayed = live_and_replayed(store)
    assert live == replayed and [r[2] for r in live] == [20, 60, 100, 140, 180]  # each stored once


# ---- failed polls -------------------------------------------------------------------------


@pytest.fixture
def small_fs(tmp_path):
    """A real 8 MiB file system (tmpfs): mounting needs root, else the test is skipped."""
    yield from mounted_tmpfs(tmp_path / "fs")


def test_a_full_disk_fails_polls_not_the_watch(tmp_path, small_fs, receiver):
    url, got = receiver
    runs, store, rules = tmp_path / "runs", small_fs / "store", tmp_path / "rules.toml"
    rules.write_text(RULE_TEXT)
    log(runs / "job", range(0))
    env = {**os.environ, "WORKBENCH_STORE": str(store)}
    w = subprocess.Popen(
        watch_cmd(runs, rules, "--interval", 0.2, "--notify-url", url),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: followed(store), 30, "the watch's first poll")
        log(runs / "job", range(100))
        wait_for(lambda: len(got) >= 2, 30, "the alerts before the disk is full")
        # full to the last byte, then with a little room (a part fits, a table does not)
        for leave, steps in ((0, range(100, 150)), (20_000, range(150, 200))):
            fill(small_fs, leave)
            log(runs / "job", steps)
            time.sleep(1.5)
            assert w.poll() is None, w.stderr.read()
        (small_fs / "filler").unlink()
        log(runs / "job", range(200, 300))
        wait_for(lambda: len(got) >= 7, 40, "the alerts logged while and after the disk was full")
        w.send_signal(signal.SIGINT)
        err = w.communicate(timeout=60)[1]
    finally:
        if w.poll() is None:
            w.kill()
    assert w.returncode == 0 and "Traceback" not in err, err
    said = " ".join(err.split())
    assert "poll failed: disk full while writing the store" in said and "the watch goes on" in said
    assert steps_received(got) == [20, 60, 100, 140, 180, 220, 260]
    s = Store(store)
    problems = s.problems().filter(pl.col("kind") == "watch_failed")["message"].to_list()
    assert problems and all("disk full while writing the store" in m for m in problems)
    live, replayed = live_and_replayed(s)
    assert live == replayed and len(live) == 7


def test_a_damaged_part_fails_polls_until_it_is_whole_again(tmp_path):
    runs, store = tmp_path / "runs", Store(tmp_path / "store")
    said = io.StringIO()
    w = Watch([runs], store, RULES, console=Console(file=said, width=200))
    log(runs / "job", range(50))
    assert w.poll_safely() is not None
    log(runs / "job", range(50, 100))
    from conftest import ingest_paths

    ingest_paths(store, runs, light=True)  # another process ingests the new lines first
    part = next(
        p
        for p in (store.root / "scalars").rglob("*.parquet")
        if p.stat().st_mtime_ns
        == max(q.stat().st_mtime_ns for q in (store.root / "scalars").rglob("*.parquet"))
    )
    whole = part.read_bytes()
    part.write_bytes(whole[: len(whole) // 2])
    assert w.poll_safely() is None and w.poll_safely() is None  # said once, the watch goes on
    assert said.getvalue().count("poll failed:") == 1
    part.write_bytes(whole)
    result = w.poll_safely()
    assert result is not None and [a["step_start"] for a in result.raised] == [60]
    assert "polls work again" in said.getvalue(), said.getvalue()


# ---- the acceptance: kill -9 at random moments ----------------------------------------------


@pytest.mark.slow  # some 15 s on an idle machine: processes started and killed a dozen times
def test_two_watches_and_an_ingest_killed_at_random_lose_no_alert(tmp_path, receiver):
    """Two watches (one follows the store, the other waits to take over) and a `workbench
    ingest`, each killed -9 at random moments and started again while a log grows: every alert
    a replay of the finished log finds is stored once and was notified at least once, each
    delivery with the alert's id."""
    url, got = receiver
    runs, store, rules = tmp_path / "runs", tmp_path / "store", tmp_path / "rules.toml"
    rules.write_text(RULE_TEXT)
    log(runs / "job", range(0))
    env = {**os.environ, "WORKBENCH_STORE": str(store)}
    rng = random.Random(27)
    started: Counter = Counter()

    def start(name: str) -> subprocess.Popen:
        started[name] += 1
        err = open(tmp_path / f"{name}.{started[name]}.err", "w")  # noqa: SIM115 - the child keeps it
        cmd = (
            [sys.executable, "-m", "workbench", "ingest", str(runs)]
            if name == "ingest"
            else watch_cmd(runs, rules, "--interval", 0.2, "--notify-url", url, "--wait", "inf")
        )
        return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)

    procs = {"watch_a": start("watch_a"), "watch_b": start("watch_b")}
    killed: Counter = Counter()
    try:
        wait_for(lambda: followed(store), 30, "the first watch's first poll")
        procs["ingest"] = start("ingest")
        step, end = 0, time.monotonic() + 6
        next_kill = time.monotonic() + rng.uniform(0.3, 1.2)
        while time.monotonic() < end:
            log(runs / "job", range(step, step + 15))
            step += 15
            if procs["ingest"].poll() is not None:
                procs["ingest"] = start("ingest")
            if time.monotonic() >= next_kill:  # the watch that follows the store, the other, or ingest
                active = next((n for n in ("watch_a", "watch_b") if procs[n].pid == holder(store)), "watch_a")
                victim = rng.choice(
                    [active, active, "watch_b" if active == "watch_a" else "watch_a", "ingest"]
                )
                procs[victim].kill()
                procs[victim].wait()
                killed[victim] += 1
                procs[victim] = start(victim)
                next_kill = time.monotonic() + rng.uniform(0.3, 1.2)
            time.sleep(0.1)
        procs["ingest"].kill()  # the last one too: the watch reads what it left
        procs["ingest"].wait()
        expected = [s for s in range(step) if loss_at(s) > 10]  # counted from the log's own values
        wait_for(lambda: set(expected) <= {b["step_start"] for _, b in got}, 60, "every alert's notification")

        def up(name: str) -> bool:  # following the store, or waiting to take over (not starting)
            said = (tmp_path / f"{name}.{started[name]}.err").read_text()
            return procs[name].pid == holder(store) or "waiting for the store's watch" in said

        wait_for(lambda: up("watch_a") and up("watch_b"), 30, "both watches started")
        for name in ("watch_a", "watch_b"):
            procs[name].send_signal(signal.SIGINT)
        assert [procs[n].wait(60) for n in ("watch_a", "watch_b")] == [0, 0]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    errors = [f.read_text() for f in tmp_path.glob("*.err")]
    assert not [e for e in errors if "Traceback" in e]
    assert sum(killed.values()) >= 4 and killed["watch_a"] + killed["watch_b"] >= 2

    s = Store(store)
    live, replayed = live_and_replayed(s)
    assert [r[2] for r in replayed] == expected
    assert live == replayed  # each stored once
    ids = {alert_id({"run_id": r, "rule": rule, "step_start": st}) for r, rule, st, _ in replayed}
    received = Counter(key for key, _ in got)
    assert set(received) == ids  # every alert notified, nothing else
    assert steps_received(got) == sorted(b["step_start"] for _, b in got)
    delivered = s.query("SELECT alert_id, outcome FROM deliveries").rows()
    assert sorted(delivered) == sorted((i, "sent") for i in ids)
    print(f"{step} steps, {len(ids)} alerts, {len(got)} deliveries, kills {dict(killed)}")
