"""Server-side time to build the Curves page for 10 runs x 1M points, cold and with a warm cache.

The store is written directly (10 runs x N steps of a noisy decaying loss with a few spikes);
the page runs under Streamlit's AppTest (the server side of a page view: the script, the cached
reads, smoothing over every point, min/max downsampling, the plotly figure and its message).
Peer in the same run: the same figure built with plotly express from every raw point, as a
page without display downsampling would (what TensorBoard's users ask to avoid).

    python benchmarks/curves_page.py [--runs 10] [--steps 1000000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from synthetic import write_run  # noqa: E402

from workbench.store import Store  # noqa: E402
from workbench.store.points import Points  # noqa: E402


def build(root: Path, runs: int, steps: int) -> Store:
    store = Store(root)
    rng = np.random.default_rng(0)
    with store.writer() as w:
        for i in range(runs):
            t = np.arange(steps)
            y = 1 + 3 * np.exp(-t / (steps / 5)) + rng.normal(0, 0.05, steps)
            y[rng.choice(steps, 5, replace=False)] += 5
            run = f"run_{i:02d}"
            write_run(w, run, Points(["train/loss"], np.zeros(steps, np.int32), t, 1.7e9 + t * 0.5, y))
        w.commit()
    return store


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--steps", type=int, default=1_000_000)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    store = build(tmp / "store", args.runs, args.steps)
    os.environ["WORKBENCH_STORE"] = str(store.root)
    from streamlit.testing.v1 import AppTest

    runs = [f"run_{i:02d}" for i in range(args.runs)]
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=600).run()
    at.switch_page("workbench/app/pages/curves.py").run()
    t0 = time.perf_counter()
    at.multiselect(key="curves_runs").set_value(runs).run()
    cold = time.perf_counter() - t0
    assert not at.exception, at.exception
    warm = []
    for _ in range(3):
        t0 = time.perf_counter()
        at.run()
        warm.append(time.perf_counter() - t0)
    assert not at.exception and at.get("plotly_chart")

    import plotly.express as px

    t0 = time.perf_counter()
    df = store.connect().sql("SELECT run_id, step, value FROM scalars").pl()
    fig = px.line(df.to_pandas(), x="step", y="value", color="run_id")
    fig.to_json()
    naive = time.perf_counter() - t0
    shutil.rmtree(tmp)
    total = args.runs * args.steps
    print(f"{args.runs} runs x {args.steps:,} points = {total:,} points on the Curves page")
    print(f"workbench page, cold cache : {cold:6.2f}s (reads every point, smooths, downsamples)")
    print(f"workbench page, warm cache : {min(warm):6.2f}s (best of 3; target < 1 s)")
    print(
        f"plotly express, all points : {naive:6.2f}s (no downsampling; the browser then draws {total:,} points)"
    )
    print(f"ratio naive / warm page    = {naive / min(warm):.0f}x")


if __name__ == "__main__":
    main()
