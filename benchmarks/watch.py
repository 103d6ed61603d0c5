"""Live watch: how soon an alert is raised after its point is written, the CPU a watch uses per
1k new points, and that a poll costs the same whatever the run's length.

Peer: what a user runs without `watch`, the loop `workbench ingest` + `workbench replay` every
interval (the same library calls), which replays each run whole at every poll.

1. Latency and CPU: a writer process appends JSONL steps (loss and grad_norm every step, eval
   loss every 50) at --rate steps/s, with a loss spike (three steps high) every 1.5 s. `workbench watch` (the
   `Watch` loop: file-system events, --interval 1) follows it for --seconds with the default
   rules (built-ins and the guides' set); latency = the time the `loss_spike` alert was raised
   minus the time its line was written (the writer notes it). CPU: this process's CPU time per
   1k points ingested (the writer is another process). The peer loop follows the same writer.
2. Cost per poll as history grows: a run with 100 and with 100k steps already seen, then polls
   that each bring 100 new steps; median poll time of the watch and of the peer.

    python benchmarks/watch.py                 # ~2 minutes
    python benchmarks/watch.py --seconds 10 --history 20000
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from rich.console import Console

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from detectors.replay import default_rules, replay  # noqa: E402
from ingest.pipeline import ingest  # noqa: E402
from workbench.store import Store  # noqa: E402
from workbench.watch import Watch  # noqa: E402

QUIET = Console(stderr=True, quiet=True)
WRITER = r"""
import json, math, random, sys, time
path, rate, seconds, start, spikes = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
rng = random.Random(0)
t0 = time.time()
step = start
with open(path, "a") as f, open(spikes, "w") as s:
    while time.time() - t0 < seconds:
        # three steps high: `loss_spike` flags a spike that lasts (for_steps = 2), not one bad batch
        phase = step % int(1.5 * rate)
        spike = phase < 3 and step - start > 150
        rec = {"step": step, "loss": 2 + math.exp(-step / 5000) + rng.gauss(0, 0.02) + (10 if spike else 0),
               "grad_norm": math.exp(rng.gauss(0, 0.2))}
        if step % 50 == 0:
            rec["eval_loss"] = 2.2 + math.exp(-step / 5000)
        f.write(json.dumps(rec) + "\n")
        f.flush()
        if spike:
            s.write(f"{step - phase} {step} {time.time()}\n")
            s.flush()
        step += 1
        time.sleep(max(0.0, t0 + (step - start) / rate - time.time()))
"""


def lines(start: int, n: int) -> str:
    rng = np.random.default_rng(start)
    out = []
    for step in range(start, start + n):
        rec = {
            "step": step,
            "loss": 2 + np.exp(-step / 5000) + rng.normal(0, 0.02),
            "grad_norm": float(np.exp(rng.normal(0, 0.2))),
        }
        if step % 50 == 0:
            rec["eval_loss"] = 2.2 + np.exp(-step / 5000)
        out.append(json.dumps(rec))
    return "\n".join(out) + "\n"


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class PeerLoop:
    """ingest + replay of every run, each poll: the alerts known after it ended."""

    def __init__(self, paths, store):
        self.paths, self.store = paths, store

    def poll(self) -> tuple[float, list[dict]]:
        t0 = time.perf_counter()
        ingest(self.paths, self.store, console=QUIET)
        res = replay(self.store, None, None)  # the default rules, as the watch
        return time.perf_counter() - t0, res.alerts.to_dicts()


def latency(tmp: Path, seconds: float, rate: float, interval: float, peer: bool) -> dict:
    runs, store = tmp / "runs", Store(tmp / "store")
    run = runs / "job"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(lines(0, 200))
    spikes = tmp / "spikes.txt"
    raised: dict[int, float] = {}
    polls = [0]
    if peer:
        loop = PeerLoop([runs], store)
        loop.poll()
    else:
        w = Watch([runs], store, default_rules(), console=QUIET)
        w.poll()
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            WRITER,
            str(run / "metrics.jsonl"),
            str(rate),
            str(seconds),
            "200",
            str(spikes),
        ]
    )
    c0 = cpu_s()
    if peer:
        while writer.poll() is None:
            t = time.time()
            _, alerts = loop.poll()
            polls[0] += 1
            done = time.time()
            for a in alerts:
                if a["rule"] == "loss_spike":
                    raised.setdefault(a["step_fired"], done)
            time.sleep(max(0.0, interval - (time.time() - t)))
    else:
        stop = threading.Event()

        def on_poll(r):
            polls[0] += 1
            for a in r.raised:
                if a["rule"] == "loss_spike":
                    raised.setdefault(a["step_fired"], a["raised_at"])

        t = threading.Thread(target=w.run, kwargs={"interval": interval, "stop": stop, "on_poll": on_poll})
        t.start()
        writer.wait()
        time.sleep(2 * interval)
        stop.set()
        t.join()
    writer.wait()
    cpu = cpu_s() - c0
    # per spike, its steps and when each line was written; latency from the line that completed
    # the alert's condition (the step it fired at) to the alert
    written: dict[int, list[tuple[int, float]]] = {}
    for first, step, at in (ln.split() for ln in spikes.read_text().splitlines()):
        written.setdefault(int(first), []).append((int(step), float(at)))
    firsts = [next(((s, t) for s, t in steps if s in raised), None) for steps in written.values()]
    lat = np.array([raised[s] - t for s, t in filter(None, firsts)])
    n_points = 2 * (len((run / "metrics.jsonl").read_text().splitlines()) - 200)  # loss, grad_norm
    return {
        "spikes": len(written),
        "alerted": len(lat),
        "p50": float(np.median(lat)) if len(lat) else float("nan"),
        "p95": float(np.percentile(lat, 95)) if len(lat) else float("nan"),
        "cpu_per_1k": cpu / (n_points / 1000),
        "polls": polls[0],
        "cpu_per_poll": cpu / max(1, polls[0]),
    }


def per_poll(tmp: Path, history: int, polls: int, peer: bool) -> float:
    runs, store = tmp / "runs", Store(tmp / "store")
    run = runs / "job"
    run.mkdir(parents=True)
    f = run / "metrics.jsonl"
    f.write_text(lines(0, history))
    poller = PeerLoop([runs], store) if peer else Watch([runs], store, default_rules(), console=QUIET)
    poller.poll()  # catch up with the history (not timed)
    times = []
    step = history
    for _ in range(polls):
        with open(f, "a") as fh:
            fh.write(lines(step, 100))
        step += 100
        r = poller.poll()
        times.append(r[0] if peer else r.seconds)
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--rate", type=float, default=50, help="steps written per second")
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--history", type=int, default=100_000)
    ap.add_argument("--polls", type=int, default=8)
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-watch-"))
    try:
        print(
            f"latency, {a.seconds:g}s at {a.rate:g} steps/s (2 points each), --interval {a.interval:g}, default rules"
        )
        res = {}
        for name, peer in (("watch", False), ("ingest+replay loop (peer)", True)):
            r = latency(base / f"lat-{peer}", a.seconds, a.rate, a.interval, peer)
            res[name] = r
            print(
                f"  {name:28s} spikes {r['spikes']:3d} alerted {r['alerted']:3d}  "
                f"latency p50 {r['p50']:.2f}s p95 {r['p95']:.2f}s  CPU {r['cpu_per_1k'] * 1000:.0f} ms per 1k points "
                f"({r['polls']} polls, {r['cpu_per_poll'] * 1000:.0f} ms each)"
            )
        w, p = res["watch"], res["ingest+replay loop (peer)"]
        print(
            f"  p95 latency: watch {w['p95']:.2f}s (target < 2s), peer/watch {p['p95'] / w['p95']:.1f}x; "
            f"CPU per 1k points peer/watch {p['cpu_per_1k'] / w['cpu_per_1k']:.1f}x"
        )
        print(
            f"cost per poll (100 new steps) with 100 vs {a.history:,} steps already seen, median of {a.polls}"
        )
        for name, peer in (("watch", False), ("ingest+replay loop (peer)", True)):
            small = per_poll(base / f"h100-{peer}", 100, a.polls, peer)
            big = per_poll(base / f"hbig-{peer}", a.history, a.polls, peer)
            print(
                f"  {name:28s} {small * 1000:7.0f} ms -> {big * 1000:7.0f} ms  ({big / small:.2f}x as history grows)"
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
