"""`workbench watch` under a real writer (tensorboardX, JSONL, a console log) between polls:
half-written lines wait, a truncated log is read again with a problem row, the live alerts
equal a replay; notifiers: one webhook call per alert interval, retried with backoff, and a
failing notifier never stops the watch; the CLI until the runs finished."""

from __future__ import annotations

import http.server
import json
import math
import threading
import time
from pathlib import Path

import polars as pl
import pytest
from conftest import cli, ingest_paths
from rich.console import Console
from tensorboardX import SummaryWriter

from detectors.replay import replay
from detectors.rules import rules_from_text
from workbench.notify import CommandNotifier, WebhookNotifier
from workbench.store import Store
from workbench.watch import Watch

RULES = rules_from_text(
    """
[[rule]]
id = "spike"
when = "loss > mean(loss, 10) + 3 * std(loss, 10)"
cooldown = 5
[[rule]]
id = "nan"
when = "not (abs(loss) < 1e308)"
severity = "critical"
[[rule]]
id = "grad"
when = "grad_norm > 4 * ema(grad_norm, 0.9)"
warmup = 5
"""
)
COLS = ["run_id", "rule", "tag", "step_start", "step_fired", "step_end", "value", "message"]
QUIET = Console(stderr=True, quiet=True)


def loss_at(step: int) -> float:
    if step >= 170:
        return math.nan
    return (
        2 + math.exp(-step / 50) + 0.02 * math.sin(step * 1.7) + (3 if step in (60, 61, 62, 64, 120) else 0)
    )


class Job:
    """A training job's writers: TensorBoard (tensorboardX), JSONL and a nanoGPT console log."""

    def __init__(self, run: Path):
        run.mkdir(parents=True, exist_ok=True)
        self.run = run
        self.tb = SummaryWriter(str(run / "tb"), flush_secs=1)
        self.jsonl = open(run / "metrics.jsonl", "a")  # noqa: SIM115
        self.console = run / "stdout.log"

    def log(self, step: int, between=None) -> None:
        """One step; `between` runs while the JSONL line is half written."""
        loss, gn = loss_at(step), 1 + 0.1 * math.cos(step) + (9 if step == 90 else 0)
        self.tb.add_scalar("train/grad_norm", gn, step)
        self.tb.flush()
        line = json.dumps({"step": step, "loss": loss if math.isfinite(loss) else "NaN"}) + "\n"
        self.jsonl.write(line[:12])
        self.jsonl.flush()
        if between is not None:
            between()
        self.jsonl.write(line[12:])
        self.jsonl.flush()
        with open(self.console, "a") as f:
            f.write(f"step:{step}/200 train_loss:{loss:.4f} lr:0.001\n")

    def close(self) -> None:
        self.tb.close()
        self.jsonl.close()


def live_and_replay(store: Store) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The alerts the watch stored, and those a replay of the same rules over the finished logs
    computes; after it the store holds each interval once, as the watch first raised it."""
    live = store.connect().sql("SELECT * FROM alerts WHERE source = 'live'").pl()
    replayed = replay(store, RULES, None).alerts
    after = store.connect().sql("SELECT * FROM alerts").pl()
    assert after.select(COLS[:4]).is_unique().all() and after.height == replayed.height
    assert (
        after.filter(pl.col("source") == "live")
        .select("rule", "step_start", "raised_at")
        .sort("rule", "step_start")
        .equals(live.select("rule", "step_start", "raised_at").sort("rule", "step_start"))
    )
    return live.select(COLS).sort(COLS[:4]), replayed.select(COLS).sort(COLS[:4])


def test_watch_follows_a_writer_and_equals_replay(tmp_path):
    store = Store(tmp_path / "store")
    job = Job(tmp_path / "runs" / "job")
    w = Watch([tmp_path / "runs"], store, RULES, console=QUIET, notify_history=True)
    polls = []
    for step in range(200):
        # some polls come while a JSONL line is half written: it is not data until it is whole
        job.log(step, (lambda: polls.append(w.poll())) if step % 17 == 5 else None)
        if step == 100:  # the console log is truncated and rewritten (a restarted `> stdout.log`)
            lines = "".join(f"step:{s}/200 train_loss:{loss_at(s):.4f} lr:0.001\n" for s in range(101))
            job.console.write_text("restarted\n" + lines)
            polls.append(w.poll())
    job.close()
    polls.append(w.poll(final=True))
    raised = [a for p in polls for a in p.raised]
    live, replayed = live_and_replay(store)
    assert live.equals(replayed), f"live:\n{live}\nreplay:\n{replayed}"
    assert set(live["rule"]) == {"spike", "nan", "grad"}
    # one spike interval for the storm at 60-64 (cooldown 5), one at 120; NaN from 170 on
    assert live.filter(pl.col("rule") == "spike")["step_start"].to_list() == [60, 120]
    assert live.filter(pl.col("rule") == "nan")[["step_start", "step_end"]].rows() == [(170, 199)]
    # every interval was raised once, most of them before the end
    keys = [(a["rule"], a["step_start"]) for a in raised]
    assert sorted(keys) == sorted(zip(live["rule"], live["step_start"], strict=True))
    problems = store.connect().sql("SELECT kind, message FROM problems").pl()
    assert "rewritten" in problems["kind"].to_list()
    assert "bad_json" not in problems["kind"].to_list()  # no half-written line was read as a record
    assert sum(a["rule"] == "spike" for p in polls[:-1] for a in p.raised) == 2  # raised while it ran


class Hook(http.server.BaseHTTPRequestHandler):
    """A webhook receiver on 127.0.0.1: answers 503 to the first `fail_first` calls."""

    received: list = []
    fail_first = 0
    calls = 0

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).calls += 1
        if type(self).calls <= type(self).fail_first:
            self.send_response(503)
            self.end_headers()
            return
        type(self).received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def hook():
    Hook.received, Hook.calls, Hook.fail_first = [], 0, 1
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/alerts", Hook
    server.shutdown()
    server.server_close()


def test_webhook_gets_one_call_per_alert_interval_and_a_failing_notifier_stops_nothing(tmp_path, hook):
    url, receiver = hook
    errors: list[str] = []
    sinks = [
        WebhookNotifier(url, errors.append, backoff=0.05),  # its first call gets a 503: retried
        WebhookNotifier("http://127.0.0.1:9/nothing-listens", errors.append, retries=1, backoff=0.01),
        CommandNotifier("exit 3", errors.append),
    ]
    store = Store(tmp_path / "store")
    job = Job(tmp_path / "runs" / "job")
    w = Watch([tmp_path / "runs"], store, RULES, sinks, console=QUIET)
    w.poll()  # the watch starts before the job writes
    for step in range(200):
        job.log(step)
        if step % 25 == 24:
            w.poll()
    job.close()
    w.poll(final=True)
    for s in sinks:
        s.close()
    live = store.connect().sql("SELECT run_id, rule, tag, step_start FROM alerts WHERE source = 'live'").pl()
    got = sorted((a["run_id"], a["rule"], a["tag"], a["step_start"]) for a in receiver.received)
    assert got == sorted(live.rows())  # exactly one call per alert interval
    assert len(got) == 4 and receiver.calls == len(got) + 1  # the 503 was retried once
    assert receiver.received[0]["severity"] in ("warning", "critical") and "raised_at" in receiver.received[0]
    assert sum("nothing-listens" in e for e in errors) == len(got)  # reported, not raised
    assert sum("command failed" in e and "exit 3" in e for e in errors) == len(got)


def test_cli_watch_until_finished(tmp_path):
    run = tmp_path / "runs" / "done"
    job = Job(run)
    for step in range(180):
        job.log(step)
    job.tb.add_hparams({"lr": 0.001}, {"hparam/loss": 2.0})  # the end-of-run record
    job.close()
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\nid = "nan"\nwhen = "not (abs(loss) < 1e308)"\n')
    store = Store(tmp_path / "store")
    t0 = time.monotonic()
    r = cli("watch", tmp_path / "runs", "--rules", rules, "--until-finished", store=store)
    assert r.exit_code == 0, r.stderr
    assert time.monotonic() - t0 < 60
    # alerts in what was already logged when the watch started are stored, not sent
    assert r.stdout == "" and "1 alerts in what was already logged" in r.stderr
    alerts = store.connect().sql("SELECT rule, step_start, source FROM alerts").pl()
    assert alerts.rows() == [("nan", 170, "live")]


def test_ctrl_c_while_the_watch_starts_stops_it_as_later(tmp_path, monkeypatch):
    """Ctrl-C before the first poll (while it loads, or opens the store) ends the watch as it
    does later: exit 0, no "Aborted!"."""

    def interrupted(*args, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(Watch, "__init__", interrupted)
    (tmp_path / "runs").mkdir()
    r = cli("watch", tmp_path / "runs", store=Store(tmp_path / "store"))
    assert r.exit_code == 0 and "Aborted" not in r.stderr + r.stdout


def test_one_alert_per_interval_with_where_it_was_first_raised(tmp_path):
    """A watch raises alerts live; a replay of the same rule file over the finished log finds
    the same intervals and adds none; a watch after a replay adds none
    either. Each interval is one row saying where and when it was first raised."""
    runs = tmp_path / "runs"
    job = Job(runs / "job")
    watched = Store(tmp_path / "watched")
    w = Watch([runs], watched, RULES, console=QUIET)
    for step in range(200):
        job.log(step)
        if step % 40 == 39:
            w.poll()
    job.close()
    w.poll(final=True)
    key = ["run_id", "rule", "tag", "step_start"]
    raised = watched.connect().sql("SELECT * FROM alerts").pl().sort(key)
    assert (
        raised.height >= 4 and set(raised["source"]) == {"live"} and raised["raised_at"].is_not_null().all()
    )
    for _ in range(2):  # a replay, and another one
        replay(watched, RULES, None)
        stored = watched.connect().sql("SELECT * FROM alerts").pl().sort(key)
        assert stored.select(key).equals(raised.select(key))  # one row per interval
        assert stored["source"].to_list() == ["live"] * raised.height
        assert stored["raised_at"].equals(raised["raised_at"])  # when the watch raised it

    replayed = Store(tmp_path / "replayed")  # the other way round: a replay, then a watch
    ingest_paths(replayed, runs)
    replay(replayed, RULES, None)
    first = replayed.connect().sql("SELECT * FROM alerts").pl().sort(key)
    Watch([runs], replayed, RULES, console=QUIET).poll(final=True)
    stored = replayed.connect().sql("SELECT * FROM alerts").pl().sort(key)
    assert stored.select(key).equals(first.select(key)) and stored.select(key).equals(raised.select(key))
    assert set(stored["source"]) == {"replay"} and stored["raised_at"].is_null().all()
