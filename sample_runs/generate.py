"""Regenerate sample_runs/: real training runs of a tiny transformer, with real writers.

    pip install -r sample_runs/requirements.txt     # torch 2.13 CPU, transformers, deepspeed
    python sample_runs/generate.py                  # all runs, then labels.toml and README.md
    python sample_runs/generate.py --only overfit   # one run
    python sample_runs/labels.py                    # labels.toml and README.md from the runs as they are
    python sample_runs/generate.py --corpus DIR     # the ~50-run evaluation corpus (corpus.py)
    python sample_runs/generate.py --diverse DIR    # the labelled corpus diverse by construction (diverse.py)

Every failure is produced by a training-time mechanism (a schedule bug, a config change, a
frozen-and-decaying parameter group, a leak), never painted onto the curves. Labels are then
decided from each run's own logged evidence by labels.py (its rules head that file).
Seeds are fixed; one thread per run. Checkpoint weights are dropped after each run, their
metadata (step, sha256, size, parent) is kept beside where they were.

The runs are listed in specs.py, trained by trainers.py (and moe.py for the MoE and
memory-budget runs) with what training.py shares; this file only drives them.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import diverse
from corpus import build
from labels import write_labels_and_readme
from specs import RECOVERY, SPECS
from trainers import generate_run, run_recovery
from training import drop_weights

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--only",
        nargs="*",
        help="run names to regenerate (default: all); with --diverse: kinds or family values",
    )
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--corpus", type=Path, help="write the evaluation corpus there instead (corpus.py)")
    ap.add_argument("--diverse", type=Path, help="write the diverse labelled corpus there (diverse.py)")
    ap.add_argument("--limit", type=int, help="--diverse: train at most this many new runs")
    ap.add_argument(
        "--jobs", type=int, help="runs at a time for --corpus (default 2) or --diverse (default 1)"
    )
    args = ap.parse_args()
    if args.corpus:
        build(args.corpus, args.jobs or 2)
        return
    if args.diverse:
        diverse.build(args.diverse, args.jobs or 1, args.only, args.limit)
        return
    import torch

    torch.set_num_threads(1)
    t0 = time.time()
    names = set(args.only or [s.name for s in SPECS] + [RECOVERY.name])
    for spec in SPECS:
        if spec.name in names:
            generate_run(spec, args.out)
    if RECOVERY.name in names:
        run = args.out / RECOVERY.name
        shutil.rmtree(run, ignore_errors=True)
        run.mkdir(parents=True)
        run_recovery(args.out / "attention_collapse", run)
    for spec in [*SPECS, RECOVERY]:
        if (args.out / spec.name).exists():
            drop_weights(args.out / spec.name)
    write_labels_and_readme(args.out, [*SPECS, RECOVERY])
    print(f"done in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
