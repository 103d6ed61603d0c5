"""Many small runs on one machine: ingest throughput, its growth with the number of runs, and
how fast the store answers afterwards.

Writes real log files: JSONL lines as HF/plain PyTorch loggers write them, Keras CSVLogger
files, DeepSpeed monitor CSVs and small TensorBoard event files (tensorboardX), then ingests
them with `workbench ingest`'s library call and compares against a bare parse loop over the
same files (`json.loads` per line, `csv.reader` per line), the two timed in turn `--rounds`
times (3) on the same files: medians, and the median and range of each round's ratio.

    python benchmarks/many_runs.py --quick          # 1k JSONL runs (+ a 100-run mix), ~1 min
    python benchmarks/many_runs.py --runs 1000 10000   # the linearity curve, 10k takes minutes
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LINES = 500  # records per JSONL file: 3 metrics each -> 1,500 points per run


def write_jsonl(folder: Path, seed: int, lines: int = LINES) -> int:
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    loss, out = 4.0 + rng.random(), []
    for step in range(1, lines + 1):
        loss *= 0.999
        out.append(
            json.dumps(
                {
                    "step": step,
                    "loss": round(loss + rng.gauss(0, 0.01), 6),
                    "learning_rate": 3e-4 * min(1, step / 50),
                    "grad_norm": round(abs(rng.gauss(1, 0.2)), 5),
                    "epoch": round(step / lines, 4),
                }
            )
        )
    (folder / "metrics.jsonl").write_text("\n".join(out) + "\n")
    return 4 * lines  # step is the axis: loss, learning_rate, grad_norm, epoch


def write_keras_csv(folder: Path, seed: int, epochs: int = 200) -> int:
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "training.log", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["epoch", "accuracy", "learning_rate", "loss", "val_accuracy", "val_loss"])
        for e in range(epochs):
            w.writerow([e, rng.random(), 1e-3, 2 / (e + 1), rng.random(), 2.2 / (e + 1)])
    return 6 * epochs


def write_monitor_csv(folder: Path, seed: int, rows: int = 300) -> int:
    rng = random.Random(seed)
    job = folder / "monitor_csv" / "job"
    job.mkdir(parents=True, exist_ok=True)
    (folder / "ds_config.json").write_text(json.dumps({"train_batch_size": 8}))
    for name in ("Train_Samples_train_loss", "Train_Samples_lr"):
        lines = ["step,value"] + [f"{8 * (i + 1)},{rng.random()}" for i in range(rows)]
        (job / f"{name}.csv").write_text("\n".join(lines) + "\n")
    return 2 * rows * 2  # each row is a value and a `samples` point


def write_tb(folder: Path, seed: int, steps: int = 200) -> int:
    from tensorboardX import SummaryWriter

    rng = random.Random(seed)
    with SummaryWriter(str(folder)) as w:
        for s in range(steps):
            w.add_scalar("train/loss", 3 * math.exp(-s / 100) + rng.random() * 0.01, s)
            w.add_scalar("train/lr", 1e-4, s)
    return 2 * steps


WRITERS = {
    "jsonl": write_jsonl,
    "keras_csv": write_keras_csv,
    "monitor_csv": write_monitor_csv,
    "tb": write_tb,
}


def make_runs(root: Path, n: int, kinds: list[str]) -> int:
    """n finished runs: their files dated an hour back, as an archive of a lab's runs (a file
    written seconds ago is a log still growing, which a later ingest settles: reads again)."""
    points = 0
    for i in range(n):
        kind = kinds[i % len(kinds)]
        points += WRITERS[kind](root / f"run{i:05d}", i)
    past = time.time() - 3600
    for p in root.rglob("*"):
        os.utime(p, (past, past))
    return points


def bare_loop(root: Path) -> float:
    """The peer: json.loads (or csv.reader) over every line of every file, nothing kept."""
    t0 = time.perf_counter()
    for p in sorted(root.rglob("*")):
        if p.suffix == ".jsonl":
            with open(p) as f:
                for line in f:
                    json.loads(line)
        elif p.suffix in (".csv", ".log"):
            with open(p, newline="") as f:
                for _ in csv.reader(f):
                    pass
    return time.perf_counter() - t0


def timed_cli(store: Path, *args: str) -> float:
    t0 = time.perf_counter()
    exe = Path(sys.executable).with_name("workbench")  # the installed command, as users start it
    subprocess.run([str(exe), *args, "--store", str(store)], check=True, capture_output=True)
    return time.perf_counter() - t0


def one(n: int, kinds: list[str], workers: int | None, tmp: Path, rounds: int = 1) -> dict:
    from ingest.pipeline import ingest
    from workbench.executor import LocalExecutor
    from workbench.store import Store

    runs, store_dir = tmp / f"runs{n}", tmp / f"store{n}"
    shutil.rmtree(runs, ignore_errors=True)
    shutil.rmtree(store_dir, ignore_errors=True)
    make_runs(runs, n, kinds)
    ex = LocalExecutor(workers) if workers else None
    bares, tooks = [], []
    for _ in range(rounds):  # the peer and a fresh ingest in turn: the machine's speed moves both
        bares.append(bare_loop(runs))
        shutil.rmtree(store_dir, ignore_errors=True)
        store = Store(store_dir)
        t0 = time.perf_counter()
        report = ingest([runs], store, executor=ex)
        tooks.append(time.perf_counter() - t0)
        assert len(report.runs) == n and not report.problems, report.problems[:3]
    ratios = [t / b for t, b in zip(tooks, bares, strict=True)]
    t0 = time.perf_counter()
    con = store.connect()
    open_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    got = con.sql(f"SELECT count(*) FROM scalars WHERE run_id = 'run{n // 2:05d}'").fetchall()[0][0]
    query_s = time.perf_counter() - t0
    con.close()
    assert got > 0
    # incremental: one changed run among n
    target = runs / f"run{n // 2:05d}"
    f = next(p for p in sorted(target.rglob("*")) if p.is_file() and p.suffix in (".jsonl", ".log", ".csv"))
    with open(f, "a") as fh:
        fh.write(json.dumps({"step": 10**6, "loss": 1.0}) + "\n" if f.suffix == ".jsonl" else "")
    t0 = time.perf_counter()
    again = ingest([runs], store)
    incr_s = time.perf_counter() - t0
    return {
        "runs": n,
        "points": report.points,
        "ingest_s": statistics.median(tooks),
        "bare_s": statistics.median(bares),
        "ratio": statistics.median(ratios),
        "ratio_range": (min(ratios), max(ratios)),
        "rounds": rounds,
        "open_s": open_s,
        "query_s": query_s,
        "incremental_s": incr_s,
        "incr_files_read": again.files_read,
        "sql_select1_s": timed_cli(store_dir, "sql", "select 1"),
        "cli_runs_s": timed_cli(store_dir, "runs"),
        "cli_runs_csv_s": timed_cli(store_dir, "runs", "--format", "csv"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--quick", action="store_true", help="1k JSONL runs and a 100-run mix of every format")
    ap.add_argument("--kinds", nargs="+", default=["jsonl"], choices=sorted(WRITERS))
    ap.add_argument(
        "--workers", type=int, default=None, help="ingest processes (default: chosen by the work)"
    )
    ap.add_argument("--tmp", default=None)
    ap.add_argument(
        "--rounds", type=int, default=3, help="bare loop and ingest timed in turn this many times (medians)"
    )
    args = ap.parse_args()
    sizes = [1000] if args.quick else args.runs
    tmp = Path(args.tmp or tempfile.mkdtemp(prefix="many_runs_"))
    # what a process pays once (imports, pyarrow's look for pandas on the first array of a
    # shared part, the compiled kernels' cache), on as many runs as share parts, so that no row
    # below carries it
    from ingest.pipeline import SHARED_MIN_RUNS, ingest
    from workbench.store import Store

    make_runs(tmp / "warm", SHARED_MIN_RUNS, args.kinds)
    t0 = time.perf_counter()
    ingest([tmp / "warm"], Store(tmp / "warm_store"))
    print(
        f"first ingest in this process ({SHARED_MIN_RUNS} runs; its one-time costs): {time.perf_counter() - t0:.2f}s"
    )
    rows = [one(n, args.kinds, args.workers, tmp, args.rounds) for n in sizes]
    if args.quick:
        mix = one(100, sorted(WRITERS), args.workers, tmp)
    for r in rows + ([mix] if args.quick else []):
        print(
            f"{r['runs']:>6} runs  {r['points']:>11,} points  ingest {r['ingest_s']:7.2f}s "
            f"({r['points'] / r['ingest_s'] / 1e6:5.2f}M points/s, {1000 * r['ingest_s'] / r['runs']:.2f} ms/run)  "
            f"bare parse loop {r['bare_s']:6.2f}s -> ingest/bare {r['ratio']:4.2f}x "
            f"({r['ratio_range'][0]:.2f}-{r['ratio_range'][1]:.2f}, medians of {r['rounds']} rounds)  "
            f"open {r['open_s'] * 1000:.0f} ms  one-run query {r['query_s'] * 1000:.0f} ms  "
            f"re-ingest of 1 changed run {r['incremental_s']:.2f}s ({r['incr_files_read']} file read)  "
            f"`sql select 1` {r['sql_select1_s']:.2f}s  `runs` {r['cli_runs_s']:.2f}s "
            f"(--format csv {r['cli_runs_csv_s']:.2f}s)"
        )
    if len(rows) > 1:
        a, b = rows[0], rows[-1]
        print(
            f"time ratio {b['runs']}/{a['runs']} runs: {b['ingest_s'] / a['ingest_s']:.1f}x "
            f"for {b['runs'] / a['runs']:.0f}x the runs (linear <= {1.2 * b['runs'] / a['runs']:.0f}x)"
        )
    print(
        f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB (this process), "
        f"{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024:.0f} MiB (largest child process: ingest workers, the CLI commands)"
    )
    if not args.tmp:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
