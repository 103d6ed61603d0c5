"""Text-log ingest: a >= 500 MB DeepSpeed console log streams with bounded memory.

The log repeats the real HelloDeepSpeed capture (tests/data/real_logs/deepspeed/) with its
steps advanced each cycle, so every line is one DeepSpeed really prints (progress, throughput,
OVERFLOW, checkpoints, loguru losses, config dumps). Cached under bench-out/.

Peer, in the same run: a plain Python loop over the lines applying three FORMATS.md regexes
(DS_STEP, OVERFLOW, TIMER) with no state and no store: the floor of any line-by-line reader.
Prints MB/s, lines/s, peak RSS and the ratio. Run by hand:

    python benchmarks/ingest_text.py [--mb 500]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests/data/real_logs/deepspeed/hellodeepspeed_bert_zero1_fp16_console.log"
OUT = ROOT / "bench-out" / "text"
PEAK = "import resource,subprocess,sys; r=subprocess.run(sys.argv[1:]); print('PEAK_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(r.returncode)"
STEP_RE = re.compile(r"(step=|global_step=|global_step|step )(\d+)")


def write_log(mb: int) -> Path:
    run = OUT / f"ds_{mb}mb"
    log = run / "stdout.log"
    if log.exists() and log.stat().st_size >= mb * 1e6:
        return run
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    template = SOURCE.read_text().splitlines(keepends=True)
    with open(log, "w") as f:
        cycle = 0
        while f.tell() < mb * 1e6:
            offset = cycle * 50
            f.writelines(
                STEP_RE.sub(lambda m, off=offset: f"{m[1]}{int(m[2]) + off}", line) for line in template
            )
            cycle += 1
    return run


def peer(log: Path) -> tuple[float, int]:
    from ingest.lines import NUM

    pats = [
        re.compile(
            r"\bstep=(?P<step>\d+), skipped=(?P<skipped>\d+), lr=\[(?P<lr>[^\]]*)\], mom=(?P<mom>\[.*\])\s*$"
        ),
        re.compile(
            rf"\[(?P<tag>deepspeed|deepscale)\] OVERFLOW! (?:Rank (?P<rank>\d+) )?Skipping step\.(?: Attempted loss scal\s*e: (?P<scale>{NUM}))?"
        ),
        re.compile(rf"(?:^|\s|\] )(?:rank=(?P<rank>\d+) )?time \(ms\)(?P<body>(?: \| [^|:]+: {NUM})*)\s*$"),
    ]
    t0 = time.perf_counter()
    n = hits = 0
    with open(log, encoding="utf-8", errors="replace") as f:
        for line in f:
            n += 1
            for p in pats:
                if p.search(line):
                    hits += 1
    return time.perf_counter() - t0, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=500)
    args = ap.parse_args()
    run = write_log(args.mb)
    log = run / "stdout.log"
    size = log.stat().st_size
    with open(log, "rb") as f:
        lines = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 24), b""))
    store = Path(tempfile.mkdtemp()) / "store"
    t0 = time.perf_counter()
    p = subprocess.run(
        [
            sys.executable,
            "-c",
            PEAK,
            sys.executable,
            "-m",
            "workbench",
            "ingest",
            str(run),
            "--store",
            str(store),
        ],
        capture_output=True,
        text=True,
    )
    t = time.perf_counter() - t0
    if p.returncode:
        raise SystemExit(p.stderr[-3000:])
    rss = int(re.search(r"PEAK_KB (\d+)", p.stderr).group(1)) / 1024
    summary = [line for line in p.stderr.splitlines() if line.startswith("ingested") or "points" in line]
    shutil.rmtree(store.parent)
    t_peer, n_peer = peer(log)
    print(f"log: {size / 1e6:,.0f} MB, {lines:,} lines")
    print(
        f"workbench ingest : {size / 1e6 / t:7.1f} MB/s  {lines / t:>10,.0f} lines/s  ({t:.1f}s, peak RSS {rss:,.0f} MB)"
    )
    print(
        f"regex loop (peer): {size / 1e6 / t_peer:7.1f} MB/s  {n_peer / t_peer:>10,.0f} lines/s  ({t_peer:.1f}s)"
    )
    print(f"ratio workbench / regex loop = {t_peer / t:.2f}x")
    print(" ".join(summary))


if __name__ == "__main__":
    main()
