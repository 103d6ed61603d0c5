"""Many small runs through `--executor ray` on this machine: wall time against the local
executor, the cost of one Ray task, and (with --s3) ingest from an S3 server on loopback.

The runs are `benchmarks/many_runs.py`'s (real JSONL/CSV/TensorBoard files). Peers measured in
the same run: the local executor in this process (`local x1`) and a process per core (`local
xN`); Ray runs on a local cluster of N CPUs, started before the clock (its start-up is printed
apart). Per-task overhead: a no-op mapped one item per task, against the same in this process.
The per-run cost measured here is what the README's 100k-run projection uses.

    python benchmarks/many_runs_ray.py                      # 300 JSONL runs, ~1-2 min
    python benchmarks/many_runs_ray.py --runs 2000 --kinds jsonl keras tb --s3
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from many_runs import WRITERS, make_runs  # noqa: E402 (the same synthetic runs)


def noop(x):
    return x


class Timing:
    """An executor that counts the time spent inside its map (the per-run read tasks): the rest
    of an ingest is the driver's (discovery, planning, staging, commit)."""

    def __init__(self, inner):
        self.inner, self.name, self.workers, self.seconds = inner, inner.name, inner.workers, 0.0

    def map(self, fn, items):
        it = iter(self.inner.map(fn, items))
        while True:
            t0 = time.perf_counter()
            try:
                out = next(it)
            except StopIteration:
                return
            finally:
                self.seconds += time.perf_counter() - t0
            yield out


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def ingest_with(executor, runs: Path, store_dir: Path, fresh: bool = True):
    from ingest.pipeline import ingest
    from workbench.store import Store

    if fresh:
        shutil.rmtree(store_dir, ignore_errors=True)
    store = Store(store_dir)
    took, report = timed(lambda: ingest([runs], store, executor=executor))
    assert not report.problems, report.problems[:3]
    return took, report, store


def rows_of(store):
    con = store.connect()
    try:
        return con.sql("SELECT * FROM scalars_all ORDER BY ALL").pl()
    finally:
        con.close()


def s3_ingest(runs: Path, tmp: Path) -> tuple[float, float, int]:
    """(sync s, ingest s, bytes) of the runs uploaded to moto's S3 server on loopback."""
    import boto3
    import s3fs

    from ingest.source import sync

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-p", str(port), "-H", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        boto3.client(
            "s3", endpoint_url=url, aws_access_key_id="x", aws_secret_access_key="y", region_name="us-east-1"
        ).create_bucket(Bucket="lab")
        opts = {"key": "x", "secret": "y", "client_kwargs": {"endpoint_url": url}}
        s3fs.S3FileSystem(**opts).put(str(runs), "lab/runs", recursive=True)
        store_dir = tmp / "store_s3"
        shutil.rmtree(store_dir, ignore_errors=True)
        sync_s, report = timed(lambda: sync("s3://lab/runs", store_dir, opts))
        ingest_s, _, _ = ingest_with(None, report.mirror, store_dir, fresh=False)  # the mirror is in it
        again_s, again = timed(lambda: sync("s3://lab/runs", store_dir, opts))
        assert again.bytes == 0
        return sync_s, ingest_s, report.bytes, again_s
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--kinds", nargs="+", default=["jsonl"], choices=sorted(WRITERS))
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--tasks", type=int, default=1000, help="no-op tasks for the per-task overhead")
    ap.add_argument("--s3", action="store_true", help="also ingest the runs from moto's S3 server")
    ap.add_argument("--tmp", default=None)
    args = ap.parse_args()
    tmp = Path(args.tmp or tempfile.mkdtemp(prefix="many_runs_ray_"))
    runs = tmp / "runs"
    shutil.rmtree(runs, ignore_errors=True)
    make_runs(runs, args.runs, args.kinds)
    n, w = args.runs, args.workers

    from workbench.executor import LocalExecutor, make_executor

    inline = Timing(LocalExecutor(1))
    one_s, report, one_store = ingest_with(inline, runs, tmp / "store1")
    read_ms, driver_ms = 1000 * inline.seconds / n, 1000 * (one_s - inline.seconds) / n
    pool_s, _, _ = ingest_with(LocalExecutor(w), runs, tmp / "storeN")
    start_s, ray_ex = timed(lambda: make_executor("ray", workers=w))
    list(ray_ex.map(noop, list(range(4 * w))))  # workers started and warm, as on a live cluster
    ray_s, ray_report, ray_store = ingest_with(ray_ex, runs, tmp / "store_ray")
    same = rows_of(ray_store).equals(rows_of(one_store)) and ray_report.points == report.points

    items = list(range(args.tasks))
    inline_s, _ = timed(lambda: list(map(noop, items)))
    ray_ex.batch_size = 1
    per_task_s, _ = timed(lambda: list(ray_ex.map(noop, items)))
    ray_ex.batch_size = None
    batched_s, _ = timed(lambda: list(ray_ex.map(noop, items)))

    pts = report.points
    print(f"{n} runs ({'+'.join(args.kinds)}), {pts:,} points, {w} workers; Ray cluster start {start_s:.1f}s")
    for name, s in (("local x1 (peer)", one_s), (f"local x{w}", pool_s), (f"ray x{w}", ray_s)):
        print(
            f"  ingest {name:<16} {s:7.2f}s  {1000 * s / n:6.2f} ms/run  {pts / s / 1e6:5.2f}M points/s  "
            f"ratio to local x1 {s / one_s:5.2f}x"
        )
    print(f"  ray rows equal local x1: {same}")
    print(
        f"  per run in this process: {read_ms:.2f} ms in its read task (what workers share), "
        f"{driver_ms:.2f} ms on the driver (discovery, planning, staging, commit)"
    )
    overhead_ms = 1000 * (per_task_s - inline_s) / len(items)
    print(
        f"  per-task overhead: {overhead_ms:.2f} ms/task ({len(items)} no-op tasks, one item each, "
        f"{per_task_s:.2f}s vs {inline_s * 1000:.2f} ms in this process); batched as map does it: "
        f"{batched_s:.3f}s ({1000 * batched_s / len(items):.3f} ms/item)"
    )
    print(
        f"  overhead share of a run: {overhead_ms / (1000 * one_s / n):.1%} of the {1000 * one_s / n:.2f} ms "
        f"a run costs in this process"
    )
    if args.s3:
        sync_s, ingest_s, nbytes, again_s = s3_ingest(runs, tmp)
        print(
            f"  s3 (moto on loopback): sync {sync_s:.2f}s for {nbytes / 1e6:.1f} MB "
            f"({nbytes / 1e6 / sync_s:.1f} MB/s, {1000 * sync_s / n:.2f} ms/run), ingest of the mirror "
            f"{ingest_s:.2f}s; total {n / (sync_s + ingest_s):.0f} runs/s; unchanged re-sync {again_s:.2f}s "
            f"({1000 * again_s / n:.2f} ms/run, 0 bytes)"
        )
    import ray

    ray.shutdown()
    if not args.tmp:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
