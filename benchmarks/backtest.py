"""Backtest speed: a 20-point threshold sweep of 10 rules over 100 runs x 100k steps, and the
cross-validated tuning of those sweeps (`workbench backtest --tune`).

The store comes from benchmarks/replay.py (8 dense metrics, failures injected in a tenth of the
runs, labelled with their onsets). Window statistics are computed once per batch of runs and
shared by every threshold; each sweep point then only re-evaluates its condition and streaks.
Tuning replays nothing again: each fold's pick is a masked sum over per-run count vectors. Its
peer, measured in the same run on the same outcomes, is the plain loop a script would write:
for every fold and every sweep point, the metrics of the training runs recomputed from the
runs' outcomes (`detectors.scoring.metrics`); both must pick the same points. Prints the time,
points/s and the tuning ratio. Run by hand:

    python benchmarks/backtest.py [--runs 100] [--steps 100000]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from replay import TAGS, build_store  # noqa: E402

from detectors.backtest import Settings, backtest, load_labels  # noqa: E402
from detectors.replay import batches, needs_peers, replay_batches  # noqa: E402
from detectors.rules import Rule  # noqa: E402
from detectors.scoring import alarms_by_run, metrics, outcomes  # noqa: E402
from detectors.tuning import tune_rule  # noqa: E402


def sweep(lo: float, hi: float, log: bool = False) -> list[float]:
    return [float(x) for x in (np.geomspace(lo, hi, 20) if log else np.linspace(lo, hi, 20))]


RULES = [
    Rule(
        "spike",
        "loss > mean(loss, 100) + t * std(loss, 100)",
        cooldown=20,
        params={"t": 3},
        sweep={"t": sweep(2, 8)},
    ),
    Rule(
        "drop",
        "loss < mean(loss, 100) - t * std(loss, 100)",
        cooldown=20,
        params={"t": 2},
        sweep={"t": sweep(1, 6)},
    ),
    Rule(
        "P1",
        "grad_norm < t and attn_entropy < 0.3",
        for_steps=5,
        params={"t": 1e-5},
        sweep={"t": sweep(1e-8, 1e-2, log=True)},
    ),
    Rule(
        "P2",
        "`ffn_input_std/*` < t and ln_input_std < 0.05",
        for_steps=5,
        params={"t": 5e-3},
        sweep={"t": sweep(1e-4, 1e-1, log=True)},
    ),
    Rule(
        "P4",
        "memory_gb - min(memory_gb, 50) > t and grad_norm < 1e-3",
        params={"t": 3},
        sweep={"t": sweep(0.5, 6)},
    ),
    Rule(
        "ema_grad",
        "grad_norm > t * ema(grad_norm, 0.95)",
        warmup=20,
        cooldown=20,
        params={"t": 5},
        sweep={"t": sweep(1.5, 10)},
    ),
    Rule(
        "layer_ratio",
        "`grad_norm/layer_0` / `grad_norm/layer_1` > t",
        params={"t": 1000},
        sweep={"t": sweep(2, 1e4, log=True)},
    ),
    Rule(
        "llmfoundry", "loss >= t * mean(loss, 100)", for_steps=5, params={"t": 2}, sweep={"t": sweep(1.1, 3)}
    ),
    Rule(
        "megatron",
        "abs(grad_norm) >= t * max_first(grad_norm, 100)",
        params={"t": 10},
        sweep={"t": sweep(1, 20)},
    ),
    Rule(
        "slope_plateau",
        "abs(slope(loss, 20)) < t and slope(grad_norm, 20) > -5e-4",
        for_steps=10,
        params={"t": 1e-4},
        sweep={"t": sweep(1e-6, 1e-2, log=True)},
    ),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--steps", type=int, default=100_000)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    store = build_store(tmp / "store", args.runs, args.steps)
    points = args.runs * (args.steps * len(TAGS) + args.steps // 100)
    t0 = time.perf_counter()
    res = backtest(store, RULES, None, Settings(bootstrap=0), predictors=False)
    dt = time.perf_counter() - t0
    evaluations = len(res.rules)
    best = max(
        (r for r in res.rules if r["rule"] == "P1"),
        key=lambda r: (r["recall"] or 0, -(r["false_alarms_per_1k"] or 0)),
    )
    print(
        f"{args.runs} runs x {args.steps:,} steps x {len(TAGS)} metrics = {points:,} points; "
        f"{len(RULES)} rules x 20 thresholds = {evaluations} scored rule points"
    )
    print(
        f"backtest: {dt:.1f}s  ({points / dt:,.0f} points/s; {points * evaluations / dt:,.0f} point-evaluations/s); target < 60 s"
    )
    print(
        f"e.g. P1 best point: {best['params']} recall {best['recall']} at {best['false_alarms_per_1k']} FA/1k"
    )
    tuning(store, args.runs)
    shutil.rmtree(tmp)


def naive_pick(outs: list[dict], train: list[str], budget: float) -> int:
    """The peer: every point's metrics recomputed over the training runs' outcomes."""

    def key(i):
        m = metrics([outs[i][r] for r in train if r in outs[i]])
        fa = m["false_alarms_per_1k"] or 0.0
        return (fa <= budget, m["recall"] or 0.0, -fa, m["separation"] or -1.0, i == 0)

    keys = [key(i) for i in range(len(outs))]
    if not any(k[0] for k in keys):
        return max(range(len(outs)), key=lambda i: (keys[i][2], keys[i][1], keys[i][4]))
    return max(range(len(outs)), key=lambda i: keys[i])


def tuning(store, n_runs: int) -> None:
    """Leave-one-run-out tuning of every sweep: the library vs the plain per-fold loop."""
    points = [p for rule in RULES for p in rule.sweep_points()]
    groups = batches(store, None, whole_groups=needs_peers(points))  # as `workbench backtest` batches them
    runs, _ = load_labels(store, [r for g in groups for r in g])

    def note_steps(data):
        for run, steps in data.logged_steps().items():
            runs[run].steps, runs[run].first_step = steps, int(steps[0])

    done = replay_batches(store, points, groups, on_batch=note_steps)
    st = Settings(bootstrap=0)
    outs = [outcomes(alarms_by_run(d.alerts, runs, st), d.evaluable, runs, st) for d in done]
    ids = sorted(runs)
    folds = [[r] for r in ids]
    per_rule = [(i * 20, (i + 1) * 20) for i in range(len(RULES))]
    t0 = time.perf_counter()
    ours = [
        tune_rule([(points[j], outs[j], j == a) for j in range(a, b)], ids, [], folds, 1.0)[0]
        for a, b in per_rule
    ]
    dt_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    peer = []
    for a, b in per_rule:
        o = outs[a:b]
        picks = [naive_pick(o, [r for r in ids if r != f[0]], 1.0) for f in folds]
        peer.append(picks)
    dt_peer = time.perf_counter() - t0
    same = all(
        points[a + naive_pick(outs[a:b], ids, 1.0)].params_json == row["picked_params"]
        for (a, b), row in zip(per_rule, ours, strict=True)
    )
    print(
        f"tuning ({len(RULES)} rules x 20 points, leave-one-run-out over {n_runs} runs): {dt_ours:.2f}s; "
        f"peer (metrics per fold and point): {dt_peer:.2f}s; ratio {dt_peer / dt_ours:.0f}x; same picks: {same}"
    )


if __name__ == "__main__":
    main()
