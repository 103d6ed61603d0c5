"""Replay speed: the vectorised engine vs a per-step Python loop, on the guides' rule set.

Builds a store of N runs x S steps x 8 dense metrics (+ a sparse eval loss every 100 steps):
noisy decaying losses with injected failures (attention collapse, dead FFN, memory jumps,
spikes) in a tenth of the runs. Then:
- engine: `replay_batches` over every run, as `workbench replay` runs it less storing the alerts
  (batches of runs, each loaded once while the last is evaluated, its rules a thread per core);
- peer: the guides' approach, a per-step loop over each run that keeps windows and streak
  counters per rule (as their AutoRecoveryManager / TBAlertManager do), on a subset of runs;
- checks that the two produce identical alerts on that subset.
Prints points/s for both and the ratio. Run by hand (the full size takes minutes):

    python benchmarks/replay.py                  # 200 runs x 100k steps x 8 metrics
    python benchmarks/replay.py --runs 20 --steps 20000
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from synthetic import write_run  # noqa: E402

from detectors import replay  # noqa: E402
from detectors.rules import load_rule_file  # noqa: E402
from workbench.store import Store  # noqa: E402
from workbench.store.points import Points  # noqa: E402

TAGS = [
    "loss",
    "grad_norm",
    "attn_entropy",
    "ffn_input_std/layer_0",
    "ln_input_std",
    "memory_gb",
    "grad_norm/layer_0",
    "grad_norm/layer_1",
]


def synth_run(
    rng: np.random.Generator, steps: int, failing: bool
) -> tuple[dict[str, np.ndarray], int | None]:
    """The series of one run, and the step its injected failure starts (None when healthy)."""
    t = np.arange(steps)
    s = {
        "loss": 1 + 3 * np.exp(-t / (steps / 5)) + rng.normal(0, 0.05, steps),
        "grad_norm": np.exp(rng.normal(0, 0.3, steps)),
        "attn_entropy": 2 + rng.normal(0, 0.1, steps),
        "ffn_input_std/layer_0": 0.8 + rng.normal(0, 0.05, steps),
        "ln_input_std": 1.2 + rng.normal(0, 0.05, steps),
        "memory_gb": 10 + np.cumsum(rng.normal(0, 0.001, steps)),
        "grad_norm/layer_0": np.exp(rng.normal(0, 0.3, steps)),
        "grad_norm/layer_1": np.exp(rng.normal(0, 0.3, steps)),
    }
    spikes = rng.choice(steps, size=max(1, steps // 20000), replace=False)
    s["loss"][spikes] += 3
    at = None
    if failing:
        at = int(rng.integers(steps // 4, steps // 2))
        kind = rng.integers(0, 3)
        if kind == 0:  # attention collapse with vanishing gradients
            s["grad_norm"][at:] = 1e-7
            s["attn_entropy"][at:] = 0.1
            s["loss"][at:] += 1.5
        elif kind == 1:  # dead FFN
            s["ffn_input_std/layer_0"][at:] = 1e-3
            s["ln_input_std"][at:] = 1e-2
        else:  # memory jump while gradients vanish
            s["memory_gb"][at:] += 4
            s["grad_norm"][at:] = 1e-4
    return s, at


def build_store(root: Path, runs: int, steps: int) -> Store:
    """The store, with labels: the injected failures (and their onsets) and healthy runs."""
    store = Store(root)
    rng = np.random.default_rng(0)
    labels = []
    with store.writer() as w:
        for i in range(runs):
            series, onset = synth_run(rng, steps, failing=i % 10 == 0)
            labels.append(
                {
                    "run_id": f"run_{i:03d}",
                    "outcome": "failed" if onset is not None else "healthy",
                    "onset": onset,
                    "kind": None,
                    "note": None,
                }
            )
            ev = 1 + 3 * np.exp(-np.arange(0, steps, 100) / (steps / 5)) + rng.normal(0, 0.02, steps // 100)
            names = [*TAGS, "eval_loss"]
            codes = np.concatenate(
                [np.full(steps, k, np.int32) for k in range(len(TAGS))]
                + [np.full(len(ev), len(TAGS), np.int32)]
            )
            step = np.concatenate([np.arange(steps)] * len(TAGS) + [np.arange(0, steps, 100)])
            value = np.concatenate([series[t] for t in TAGS] + [ev])
            run = f"run_{i:03d}"
            write_run(w, run, Points(names, codes, step, np.full(len(step), np.nan), value))
            if i % 20 == 19:
                print(f"  wrote {i + 1}/{runs} runs", file=sys.stderr)
        w.set_labels("benchmark", labels)
        w.commit()
    return store


# ---- the per-step loop (the guides' approach) ----------------------------------------------------
class Window:
    """A deque of the last n values with numpy statistics, as the guides' managers keep them."""

    def __init__(self, n):
        self.buf = deque(maxlen=n)

    def full(self):
        return len(self.buf) == self.buf.maxlen

    def mean(self):
        return float(np.mean(self.buf))

    def std(self):
        return float(np.std(self.buf, ddof=1))


class Streak:
    """for_steps / cooldown / intervals, one step at a time."""

    def __init__(self, rule, for_steps=1, cooldown=0):
        self.rule, self.for_steps, self.cooldown = rule, for_steps, cooldown
        self.n = 0
        self.start = None
        self.open = None  # the current alert [start, fired, end]
        self.alerts = []

    def step(self, t, cond):
        if cond:
            if self.n == 0:
                self.start = t
            self.n += 1
            if self.n == self.for_steps:
                if self.alerts and t - self.alerts[-1][2] <= self.cooldown:
                    self.open = self.alerts[-1]
                else:
                    self.open = [self.start, t, t]
                    self.alerts.append(self.open)
            if self.n >= self.for_steps:
                self.open[2] = t
        else:
            self.n = 0
            self.open = None


LOOP_RULES = (
    "guides_P1",
    "guides_P2",
    "guides_P3",
    "guides_P4",
    "guides_loss_spike",
    "guides_loss_drop",
    "guides_layer_ratio",
    "guides_slope_plateau",
)


def loop_run(series: dict[str, np.ndarray], eval_steps: np.ndarray, eval_vals: np.ndarray) -> dict[str, list]:
    """The guides' eight rules (LOOP_RULES), checked at every step like a live callback would."""
    rules = {
        "guides_P1": Streak("P1", 5),
        "guides_P2": Streak("P2", 5),
        "guides_P3": Streak("P3", 10),
        "guides_P4": Streak("P4"),
        "guides_loss_spike": Streak("spike", 1, 20),
        "guides_loss_drop": Streak("drop", 1, 20),
        "guides_layer_ratio": Streak("ratio"),
        "guides_slope_plateau": Streak("slope", 10),
    }
    loss_w, mem_w = Window(100), Window(50)
    slope_loss, slope_gn, slope50 = deque(maxlen=20), deque(maxlen=20), deque(maxlen=50)
    ev_i, last_eval = 0, None

    def slope(points):  # the guides fit a line with numpy at every step
        x, y = zip(*points, strict=True)
        return float(np.polyfit(x, y, 1)[0])

    steps = len(series["loss"])
    for t in range(steps):
        loss, gn = series["loss"][t], series["grad_norm"][t]
        ent, ffn, ln = (
            series["attn_entropy"][t],
            series["ffn_input_std/layer_0"][t],
            series["ln_input_std"][t],
        )
        mem, g0, g1 = series["memory_gb"][t], series["grad_norm/layer_0"][t], series["grad_norm/layer_1"][t]
        rules["guides_P1"].step(t, gn < 1e-5 and ent < 0.3)
        rules["guides_P2"].step(t, ffn < 0.005 and ln < 0.05)
        rules["guides_P4"].step(t, mem_w.full() and mem - min(mem_w.buf) > 3 and gn < 1e-3)
        full = loss_w.full()
        rules["guides_loss_spike"].step(t, full and loss > loss_w.mean() + 3 * loss_w.std())
        rules["guides_loss_drop"].step(t, full and loss < loss_w.mean() - 2 * loss_w.std())
        rules["guides_layer_ratio"].step(t, g0 / g1 > 1000)
        slope_loss.append((t, loss))
        slope_gn.append((t, gn))
        slope50.append((t, loss))
        rules["guides_slope_plateau"].step(
            t, len(slope_loss) == 20 and abs(slope(slope_loss)) < 1e-4 and slope(slope_gn) > -5e-4
        )
        if ev_i < len(eval_steps) and eval_steps[ev_i] == t:  # P3 runs at eval steps only
            ev = eval_vals[ev_i]
            cond = (
                last_eval is not None
                and len(slope50) == 50
                and slope(slope50) < 0
                and abs(ev - last_eval) < 0.001
            )
            rules["guides_P3"].step(t, cond)
            last_eval, ev_i = ev, ev_i + 1
        loss_w.buf.append(loss)
        mem_w.buf.append(mem)
    return {k: [tuple(a) for a in s.alerts] for k, s in rules.items()}


def cumsum_floor(data, runs: int, window: int = 100) -> float:
    """Seconds for the least any replay must do on the loop's runs: one rolling mean per series
    by numpy cumsum, already in memory (the floor the engine is held to, within 5x)."""
    import polars as pl

    series = []
    for i in range(runs):
        p = data.points.filter(pl.col("run_id") == f"run_{i:03d}")
        series += [p.filter(pl.col("tag") == t).sort("step")["value"].to_numpy() for t in TAGS]
    t0 = time.perf_counter()
    for v in series:
        c = np.cumsum(np.r_[0.0, v])
        _ = (c[window:] - c[:-window]) / window
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--loop-runs", type=int, default=2, help="runs replayed by the per-step loop too")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    t0 = time.perf_counter()
    store = build_store(tmp / "store", args.runs, args.steps)
    print(f"store built in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
    # the guides' rules the per-step loop implements (the others read tags this data lacks)
    rules = [r for r in load_rule_file(ROOT / "detectors/guides.toml") if r.id in LOOP_RULES]
    total = args.runs * (args.steps * len(TAGS) + args.steps // 100)

    # what a process pays once (the compiled kernels' cache, the first DuckDB query and polars
    # plan), on one run, so that the rows below do not carry it, as the peer loop carries none
    t0 = time.perf_counter()
    replay.replay_batches(store, rules, [["run_000"]])
    t_first = time.perf_counter() - t0
    print(f"first replay in this process (1 run; its one-time costs): {t_first:.2f}s")

    t0 = time.perf_counter()
    # what `workbench replay` runs, less storing the alerts: its batches, each loaded once
    groups = replay.batches(store, None, whole_groups=replay.needs_peers(rules))
    done = replay.replay_batches(store, rules, groups)
    t_engine = time.perf_counter() - t0
    import polars as pl

    engine = pl.concat([d.alerts for d in done])

    data = replay.load(store, [f"run_{i:03d}" for i in range(args.loop_runs)])
    t0 = time.perf_counter()
    loop_points = 0
    mismatches = 0
    for i in range(args.loop_runs):
        run = f"run_{i:03d}"
        p = data.points.filter(pl.col("run_id") == run)
        series = {t: p.filter(pl.col("tag") == t).sort("step")["value"].to_numpy() for t in TAGS}
        ev = p.filter(pl.col("tag") == "eval_loss").sort("step")
        loop_points += p.height
        got = loop_run(series, ev["step"].to_numpy(), ev["value"].to_numpy())
        for rule_id, alerts in got.items():
            mine = engine.filter((pl.col("run_id") == run) & (pl.col("rule") == rule_id)).sort("step_start")
            mine = [tuple(r) for r in mine.select("step_start", "step_fired", "step_end").iter_rows()]
            if mine != [tuple(a) for a in alerts]:
                mismatches += 1
                print(f"  MISMATCH {run} {rule_id}: engine {mine[:3]} loop {alerts[:3]}", file=sys.stderr)
    t_loop = time.perf_counter() - t0
    t_floor = cumsum_floor(data, args.loop_runs)
    shutil.rmtree(tmp)
    print(
        f"data: {args.runs} runs x {args.steps:,} steps x {len(TAGS)} metrics (+ eval) = {total:,} points; "
        f"{len(rules)} rules; {engine.height} alerts"
    )
    print(f"engine (vectorised)   : {total / t_engine:>14,.0f} points/s  ({t_engine:.1f}s, all runs)")
    print(
        f"per-step Python loop  : {loop_points / t_loop:>14,.0f} points/s  ({t_loop:.1f}s, {args.loop_runs} runs)"
    )
    ratio = (total / t_engine) / (loop_points / t_loop)
    floor = loop_points / t_floor
    print(f"numpy cumsum floor    : {floor:>14,.0f} points/s  (one rolling mean per series, no rule logic)")
    print(f"ratio engine / loop   = {ratio:.0f}x (target >= 100x)")
    print(f"floor / engine        = {floor / (total / t_engine):.1f}x (target <= 5x)")
    print(
        f"alerts identical on the loop's {args.loop_runs} runs: {'yes' if mismatches == 0 else f'NO ({mismatches} rule/run pairs differ)'}"
    )


if __name__ == "__main__":
    main()
