"""CLI start-up: the read-only commands against a bare `python -c "import duckdb"`.

A user runs `workbench runs` dozens of times a day, so a read must cost little more than
starting Python with DuckDB. Each command and the bare import run as fresh processes in
interleaved pairs (A B A B ...), so a shared machine's load falls on both alike; prints the
median wall and CPU (user + system) time of each and its ratio to the bare import's. The store
is the sample runs' (ingested once into bench-out/ when missing). Run by hand:

    python benchmarks/cli_startup.py            # 15 pairs per command
    python benchmarks/cli_startup.py --pairs 31
    python benchmarks/cli_startup.py --baseline ../main   # another checkout in the same rounds
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STORE = ROOT / "bench-out" / "cli_store"
BARE = [sys.executable, "-c", "import duckdb"]
COMMANDS = {
    "--help": ["--help"],
    "sql": ["sql", "select 1"],
    "sql csv": ["sql", "select 1", "--format", "csv"],
    "runs": ["runs", "--format", "csv"],
    "tags": ["tags", "healthy_seed0", "--format", "csv"],
}


def timed(cmd: list[str], env: dict) -> tuple[float, float]:
    """Wall and CPU seconds of one process (CPU: the children's rusage difference), started in
    the checkout it runs (`python -m` puts the working folder first on the path)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(
        cmd, env=env, cwd=env["PYTHONPATH"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--baseline", type=Path, help="a checkout of another version, timed in the same rounds")
    args = ap.parse_args()
    env = {**os.environ, "WORKBENCH_STORE": str(STORE), "PYTHONPATH": str(ROOT)}
    # bytecode cached as in any install (under bench-out/, so no checkout is written to)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(ROOT / "bench-out" / "pycache")
    base_env = {**env, "PYTHONPATH": str(args.baseline.resolve())} if args.baseline else None
    if not (STORE / "CURRENT").exists():
        subprocess.run(
            [sys.executable, "-m", "workbench", "ingest", str(ROOT / "sample_runs")],
            env=env,
            check=True,
            stderr=subprocess.DEVNULL,
        )
    print(
        f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} on {os.cpu_count()} CPUs; {args.pairs} pairs each"
    )
    head = f"{'command':<8} {'wall s':>8} {'bare s':>8} {'ratio':>6}   {'CPU s':>6} {'bare':>6} {'ratio':>6}"
    print(head + (f"   {'baseline CPU s':>14} {'ratio':>6}" if base_env else ""))
    for name, cli in COMMANDS.items():
        cmd = [sys.executable, "-m", "workbench", *cli]
        timed(cmd, env), timed(BARE, env)  # warm the page cache
        mine, bare, base = [], [], []
        for _ in range(args.pairs):
            mine.append(timed(cmd, env))
            bare.append(timed(BARE, env))
            if base_env:
                base.append(timed(cmd, base_env))
        w, c = (statistics.median(x) for x in zip(*mine, strict=True))
        bw, bc = (statistics.median(x) for x in zip(*bare, strict=True))
        line = f"{name:<8} {w:8.3f} {bw:8.3f} {w / bw:6.2f}   {c:6.3f} {bc:6.3f} {c / bc:6.2f}"
        if base:
            oc = statistics.median(x[1] for x in base)
            line += f"   {oc:14.3f} {oc / bc:6.2f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
