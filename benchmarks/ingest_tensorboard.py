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
    python benchmarks/ingest_tensorboard.py --sizes 0.1 1 5 20 50   # M scalars, 5 tags: one ratio line each
    python benchmarks/ingest_tensorboard.py --sizes 0.1 1 5 20 --tags 200   # the same, wide

The sweep's files are encoded by a compiled kernel (tensorboardX takes minutes per 10 M events
without crc32c), byte for byte as tensorboardX's EventsWriter writes them: checked on the first
steps of each file against tensorboardX itself.
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

import numpy as np
from numba import njit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ingest.framing import CRC_TABLES, masked_crc32c  # noqa: E402

CPU: dict[str, float] = {}  # the last measured command's CPU seconds, by its program
OUT = Path(__file__).resolve().parent.parent / "bench-out" / "tb"
PEAK = "import resource,subprocess,sys; r=subprocess.run(sys.argv[1:]); u=resource.getrusage(resource.RUSAGE_CHILDREN); print('PEAK_KB', u.ru_maxrss, 'CPU_S', u.ru_utime + u.ru_stime, file=sys.stderr); sys.exit(r.returncode)"


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
    names = _names(tags)
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


@njit(cache=True)
def _put_varint(out, p, v):
    while v >= 0x80:
        out[p] = (v & 0x7F) | 0x80
        v >>= 7
        p += 1
    out[p] = v
    return p + 1


@njit(cache=True)
def _encode(out, names, starts, first, last, crc_tables):
    """`Event{wall_time, step, summary{value{tag, simple_value}}}` records of steps [first,
    last) in TFRecord framing, as tensorboardX serializes them (proto3: step 0 is left out)."""
    ntags = len(starts) - 1
    rec = np.empty(256, np.uint8)
    p = 0
    for step in range(first, last):
        for i in range(ntags):
            tl = starts[i + 1] - starts[i]
            value_len = 1 + 1 + tl + 1 + 4
            summary_len = 1 + 1 + value_len
            q = 0
            rec[q] = 0x09
            wall = np.array([1.7e9 + step * 0.1], np.float64).view(np.uint8)
            rec[q + 1 : q + 9] = wall
            q += 9
            if step:
                rec[q] = 0x10
                q = _put_varint(rec, q + 1, step)
            rec[q] = 0x2A
            rec[q + 1] = summary_len
            rec[q + 2] = 0x0A
            rec[q + 3] = value_len
            rec[q + 4] = 0x0A
            rec[q + 5] = tl
            q += 6
            rec[q : q + tl] = names[starts[i] : starts[i + 1]]
            q += tl
            rec[q] = 0x15
            v = np.array([1.0 / (1 + step + i)], np.float32).view(np.uint8)
            rec[q + 1 : q + 5] = v
            q += 5
            out[p : p + 8] = np.array([q], np.uint64).view(np.uint8)
            out[p + 8 : p + 12] = np.array([masked_crc32c(out, p, 8, crc_tables)], np.uint32).view(np.uint8)
            out[p + 12 : p + 12 + q] = rec[:q]
            c = masked_crc32c(out, p + 12, q, crc_tables)
            out[p + 12 + q : p + 16 + q] = np.array([c], np.uint32).view(np.uint8)
            p += 16 + q
    return p


def write_fast(folder: Path, tags: int, steps: int) -> int:
    """`write_dataset`'s file, encoded by a kernel; its first steps checked against tensorboardX."""
    marker = folder / ".complete"
    if marker.exists():
        return tags * steps
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    names = _names(tags)
    blob = np.frombuffer("".join(names).encode(), np.uint8)
    starts = np.cumsum([0] + [len(n) for n in names]).astype(np.int64)
    want = _tensorboardx_bytes(folder.parent / (folder.name + ".check"), tags, min(steps, 300))
    header = want[: 16 + int.from_bytes(want[:8], "little")]  # its file_version record
    with open(folder / "events.out.tfevents.bench", "wb") as f:
        f.write(header)
        block = 100_000
        out = np.empty(block * tags * 64, np.uint8)
        for first in range(0, steps, block):
            n = _encode(out, blob, starts, first, min(steps, first + block), CRC_TABLES)
            f.write(out[:n].tobytes())
    got = (folder / "events.out.tfevents.bench").read_bytes()[: len(want)]
    assert got == want, "the kernel's records differ from tensorboardX's"
    marker.touch()
    return tags * steps


def _tensorboardx_bytes(folder: Path, tags: int, steps: int) -> bytes:
    """What tensorboardX's EventsWriter writes for the first `steps` steps (its header first)."""
    shutil.rmtree(folder, ignore_errors=True)
    write_dataset(folder, tags, steps)
    data = next(folder.glob("events*")).read_bytes()
    shutil.rmtree(folder)
    return data


def _names(tags: int) -> list[str]:
    return [
        f"layer_{i:03d}/grad_norm"
        if tags > 5
        else ["loss", "lr", "grad_norm", "loss_scale", "tokens_per_s"][i]
        for i in range(tags)
    ]


def measure(
    cmd: list[str], until: str | None = None, env: dict | None = None, cwd: Path | None = None
) -> tuple[float, int, str]:
    """Wall seconds, peak RSS (KiB) and stderr of a command (or until a line appears); its CPU
    seconds (user + system, of its threads and child processes) go to CPU[cmd[0]]: on a shared
    machine they move less than wall time."""
    t0 = time.perf_counter()
    if until is None:
        p = subprocess.run(
            [sys.executable, "-c", PEAK, *cmd], capture_output=True, text=True, env=env, cwd=cwd
        )
        dt = time.perf_counter() - t0
        if p.returncode:
            raise SystemExit(f"{cmd[0]} failed:\n{p.stderr[-2000:]}")
        m = re.search(r"PEAK_KB (\d+) CPU_S ([\d.]+)", p.stderr)
        CPU[cmd[0]] = float(m.group(2))
        return dt, int(m.group(1)), p.stderr
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    log = []
    for line in p.stderr:
        log.append(line)
        if until in line:
            break
    dt = time.perf_counter() - t0
    status = Path(f"/proc/{p.pid}/status").read_text()
    peak = int(re.search(r"VmHWM:\s+(\d+)", status).group(1))
    ticks = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()[11:13]  # utime, stime
    CPU[cmd[0]] = sum(map(int, ticks)) / os.sysconf("SC_CLK_TCK")
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


def workbench(folder: Path, checkout: Path | None = None) -> tuple[float, int, float]:
    """Seconds end to end, peak RSS (KiB) and the ingest's own seconds (its summary line) of
    `workbench ingest` (of another `checkout` of the workbench)."""
    store = Path(tempfile.mkdtemp()) / "store"
    root = checkout or Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONPYCACHEPREFIX": str(OUT.parent / "pycache")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode cached, as in any install
    cmd = [sys.executable, "-m", "workbench", "ingest", str(folder), "--store", str(store)]
    t, rss, err = measure(cmd, env=env, cwd=root)  # `-m` reads the working folder first
    shutil.rmtree(store.parent)
    return t, rss, float(re.search(r"in ([\d.]+)s", err).group(1))


def readers(folder: Path, n: int, tbparse: bool = True) -> dict[str, tuple[float, int]]:
    """Seconds and peak RSS (KiB) of each reader on `folder`, and the workbench's own ingest
    seconds (its summary line) under "workbench ingest"."""
    out = {}
    t_wb, rss_wb, inner = workbench(folder)
    out["workbench"] = (t_wb, rss_wb)
    out["workbench ingest"] = (inner, rss_wb)
    out["workbench CPU"] = (CPU[sys.executable], rss_wb)
    if tbparse:
        tbp = "import sys,time; from tbparse import SummaryReader; t=time.perf_counter(); df=SummaryReader(sys.argv[1]).scalars; print('ROWS', len(df), 'T', time.perf_counter()-t, file=sys.stderr)"
        t_tbp, rss_tbp, err = measure([sys.executable, "-c", tbp, str(folder)])
        rows = int(re.search(r"ROWS (\d+)", err).group(1))
        assert rows == n, f"tbparse read {rows} rows, expected {n}"
        out["tbparse"] = (t_tbp, rss_tbp)
    if rb := rustboard():
        cmd = [rb, "--logdir", str(folder), "--reload", "once", "--samples-per-plugin", "scalars=all"]
        cmd += ["--checksum", "--port", "0", "-v"]
        out["RustBoard"] = measure(cmd, until="Finished load cycle")[:2]
        out["RustBoard CPU"] = (CPU[rb], out["RustBoard"][1])
    return out


def run(name: str, folder: Path, n: int) -> None:
    print(f"\n== {name}: {n:,} scalars, {sum(f.stat().st_size for f in folder.glob('events*')) / 1e6:.0f} MB")
    r = readers(folder, n)
    (t_wb, rss_wb), inner = r["workbench"], r["workbench ingest"][0]
    print(
        f"workbench ingest : {n / t_wb:>12,.0f} scalars/s  ({t_wb:.1f}s end to end, {inner:.1f}s ingest; peak RSS {rss_wb / 1024:,.0f} MB)"
    )
    t_tbp, rss_tbp = r["tbparse"]
    print(
        f"tbparse          : {n / t_tbp:>12,.0f} scalars/s  ({t_tbp:.1f}s; peak RSS {rss_tbp / 1024:,.0f} MB)"
    )
    if "RustBoard" in r:
        t_rb, rss_rb = r["RustBoard"]
        print(
            f"RustBoard server : {n / t_rb:>12,.0f} scalars/s  ({t_rb:.1f}s; peak RSS {rss_rb / 1024:,.0f} MB)"
        )
    print(f"ratio workbench / tbparse   = {t_tbp / t_wb:.1f}x")
    if "RustBoard" in r:
        print(f"ratio workbench / RustBoard = {t_rb / t_wb:.2f}x")


def sweep(sizes: list[float], tags: int, tbparse_max: float, baseline: Path | None) -> None:
    """One line per size (M scalars of `tags` tags): each reader's seconds, and the workbench's
    speed as a multiple of each peer's (> 1: the workbench is faster), with peak memory; with
    `baseline`, that checkout's ingest too, run right after RustBoard's."""
    print(f"load: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs; {tags} tags")
    print(
        f"{'scalars':>11} {'wb s':>7} {'ingest s':>8} {'RustBoard s':>11} {'tbparse s':>9}"
        f" {'x RustBoard':>11} {'x tbparse':>9} {'wb MB':>7} {'RB MB':>7}"
        + f" {'wb CPU s':>8} {'RB CPU s':>8} {'x RB CPU':>8}"
        + (f" {'baseline s':>10} {'x RustBoard':>11} {'base CPU s':>10} {'x RB CPU':>8}" if baseline else "")
    )
    folders = {size: OUT / f"sweep_{tags}x{round(size * 1e6) // tags}" for size in sizes}
    for size, folder in folders.items():
        write_fast(folder, tags, round(size * 1e6) // tags)
    # one ingest first, untimed: compiled kernels cached, files in the page cache, for every row alike
    for checkout in (None, baseline) if baseline else (None,):
        workbench(folders[min(sizes)], checkout)
    for size, folder in folders.items():
        n = round(size * 1e6) // tags * tags
        r = readers(folder, n, tbparse=size <= tbparse_max)
        cpu_wb, cpu_rb = r["workbench CPU"][0], r.get("RustBoard CPU", (float("nan"),))[0]
        (t_wb, rss_wb), inner = r["workbench"], r["workbench ingest"][0]
        t_rb, rss_rb = r.get("RustBoard", (float("nan"), 0))
        t_tbp = r.get("tbparse", (float("nan"), 0))[0]
        line = (
            f"{n:>11,} {t_wb:7.2f} {inner:8.2f} {t_rb:11.2f} {t_tbp:9.2f}"
            f" {t_rb / t_wb:11.2f} {t_tbp / t_wb:9.2f} {rss_wb / 1024:7.0f} {rss_rb / 1024:7.0f}"
            f" {cpu_wb:8.2f} {cpu_rb:8.2f} {cpu_rb / cpu_wb:8.2f}"
        )
        if baseline:
            t_base = workbench(folder, baseline)[0]
            cpu_base = CPU[sys.executable]
            line += f" {t_base:10.2f} {t_rb / t_base:11.2f} {cpu_base:10.2f} {cpu_rb / cpu_base:8.2f}"
        print(line, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0, help="shrink the step counts (e.g. 0.1)")
    ap.add_argument("--sizes", type=float, nargs="+", help="sweep these sizes (M scalars) instead")
    ap.add_argument("--tags", type=int, default=5, help="with --sizes: tags per file (200: a wide run)")
    ap.add_argument("--tbparse-max", type=float, default=5, help="largest size tbparse reads (M scalars)")
    ap.add_argument("--baseline", type=Path, help="with --sizes: another checkout's ingest, timed beside")
    args = ap.parse_args()
    if args.sizes:
        sweep(args.sizes, args.tags, args.tbparse_max, args.baseline and args.baseline.resolve())
        return
    s = args.scale
    a = OUT / f"5x{int(1_000_000 * s)}"
    b = OUT / f"200x{int(20_000 * s)}"
    na = write_dataset(a, 5, int(1_000_000 * s))
    nb = write_dataset(b, 200, int(20_000 * s))
    run("5 tags x 1M steps", a, na)
    run("200 tags x 20k steps", b, nb)


if __name__ == "__main__":
    main()
