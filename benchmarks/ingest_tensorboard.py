"""TensorBoard ingest speed and memory: `workbench ingest` vs tbparse vs TensorBoard's Rust reader.

Event files are written by tensorboardX's EventsWriter (real TFRecord framing and CRCs), cached
under bench-out/. Each reader runs in its own process, on the same files, in this one run:
- workbench: `workbench ingest DIR --store S` (CRC checks on, the default);
- tbparse: `SummaryReader(DIR).scalars`;
- RustBoard: `server --logdir DIR --reload once --samples-per-plugin scalars=all --checksum`,
  timed until it logs "Finished load cycle".
Prints scalars/s, the ratios, and peak RSS. Run by hand (minutes):

    pip install crc32c   # makes tensorboardX write faster; optional
    python benchmarks/ingest_tensorboard.py            # 5 tags x 1M steps; 200 tags x 20k steps
    python benchmarks/ingest_tensorboard.py --scale 0.1
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "bench-out" / "tb"
PEAK = "import resource,subprocess,sys; r=subprocess.run(sys.argv[1:]); print('PEAK_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(r.returncode)"


def write_dataset(folder: Path, tags: int, steps: int) -> int:
    """One event file with `tags` scalar series of `steps` points; returns the scalar count."""
    marker = folder / ".complete"
    if marker.exists():
        return tags * steps
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    from tensorboardX.event_file_writer import EventsWriter
    from tensorboardX.proto import event_pb2, summary_pb2

    w = EventsWriter(str(folder / "events"))
    ev = event_pb2.Event(
        summary=summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag="x", simple_value=0.0)])
    )
    names = [
        f"layer_{i:03d}/grad_norm"
        if tags > 5
        else ["loss", "lr", "grad_norm", "loss_scale", "tokens_per_s"][i]
        for i in range(tags)
    ]
    t0 = time.time()
    val = ev.summary.value[0]
    for step in range(steps):
        ev.step = step
        ev.wall_time = 1.7e9 + step * 0.1
        for i, name in enumerate(names):
            val.tag = name
            val.simple_value = 1.0 / (1 + step + i)
            w.write_event(ev)
        if step % 100_000 == 0 and step:
            print(f"  writing {folder.name}: {step}/{steps} steps ({time.time() - t0:.0f}s)", file=sys.stderr)
    w.close()
    marker.touch()
    return tags * steps


def measure(cmd: list[str], until: str | None = None) -> tuple[float, int, str]:
    """Wall seconds, peak RSS (KiB) and stderr of a command (or until a line appears)."""
    t0 = time.perf_counter()
    if until is None:
        p = subprocess.run([sys.executable, "-c", PEAK, *cmd], capture_output=True, text=True)
        dt = time.perf_counter() - t0
        if p.returncode:
            raise SystemExit(f"{cmd[0]} failed:\n{p.stderr[-2000:]}")
        peak = int(re.search(r"PEAK_KB (\d+)", p.stderr).group(1))
        return dt, peak, p.stderr
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    log = []
    for line in p.stderr:
        log.append(line)
        if until in line:
            break
    dt = time.perf_counter() - t0
    status = Path(f"/proc/{p.pid}/status").read_text()
    peak = int(re.search(r"VmHWM:\s+(\d+)", status).group(1))
    p.kill()
    p.wait()
    return dt, peak, "".join(log)


def rustboard() -> str | None:
    try:
        import tensorboard_data_server
    except ImportError:
        return None
    path = tensorboard_data_server.server_binary()
    return path if path and os.path.exists(path) else None


def run(name: str, folder: Path, n: int) -> None:
    print(f"\n== {name}: {n:,} scalars, {sum(f.stat().st_size for f in folder.glob('events*')) / 1e6:.0f} MB")
    store = Path(tempfile.mkdtemp()) / "store"
    wb_cmd = [sys.executable, "-m", "workbench", "ingest", str(folder), "--store", str(store)]
    t_wb, rss_wb, err = measure(wb_cmd)
    inner = float(re.search(r"in ([\d.]+)s", err).group(1))
    shutil.rmtree(store.parent)
    tbp = "import sys,time; from tbparse import SummaryReader; t=time.perf_counter(); df=SummaryReader(sys.argv[1]).scalars; print('ROWS', len(df), 'T', time.perf_counter()-t, file=sys.stderr)"
    t_tbp, rss_tbp, err = measure([sys.executable, "-c", tbp, str(folder)])
    rows = int(re.search(r"ROWS (\d+)", err).group(1))
    assert rows == n, f"tbparse read {rows} rows, expected {n}"
    print(
        f"workbench ingest : {n / t_wb:>12,.0f} scalars/s  ({t_wb:.1f}s end to end, {inner:.1f}s ingest; peak RSS {rss_wb / 1024:,.0f} MB)"
    )
    print(
        f"tbparse          : {n / t_tbp:>12,.0f} scalars/s  ({t_tbp:.1f}s; peak RSS {rss_tbp / 1024:,.0f} MB)"
    )
    rb = rustboard()
    if rb:
        cmd = [
            rb,
            "--logdir",
            str(folder),
            "--reload",
            "once",
            "--samples-per-plugin",
            "scalars=all",
            "--checksum",
            "--port",
            "0",
            "-v",
        ]
        t_rb, rss_rb, _ = measure(cmd, until="Finished load cycle")
        print(
            f"RustBoard server : {n / t_rb:>12,.0f} scalars/s  ({t_rb:.1f}s; peak RSS {rss_rb / 1024:,.0f} MB)"
        )
    print(f"ratio workbench / tbparse   = {t_tbp / t_wb:.1f}x")
    if rb:
        print(f"ratio workbench / RustBoard = {t_rb / t_wb:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0, help="shrink the step counts (e.g. 0.1)")
    args = ap.parse_args()
    s = args.scale
    a = OUT / f"5x{int(1_000_000 * s)}"
    b = OUT / f"200x{int(20_000 * s)}"
    na = write_dataset(a, 5, int(1_000_000 * s))
    nb = write_dataset(b, 200, int(20_000 * s))
    run("5 tags x 1M steps", a, na)
    run("200 tags x 20k steps", b, nb)


if __name__ == "__main__":
    main()
