"""An evaluation corpus for detection quality, generated on demand (never committed):

    python sample_runs/generate.py --corpus OUT_DIR [--jobs 2]

About 50 short real runs (250-340 steps) of the same trainers as the committed sample runs: the
plain PyTorch loop (dense and MoE), the HF Trainer and DeepSpeed fp16 ZeRO-1, with varied seeds,
learning rates, widths, onsets and failure mechanisms. Runs go to OUT_DIR/tune/<run> and
OUT_DIR/holdout/<run> (the run id carries the split): rules are tuned on one part and scored on
the other. OUT_DIR/labels.toml holds each run's label, decided by the rules of labels.py from
the run's own logs, plus `stack`, `split` and a few evidence fields; a healthy run whose logs
show failure evidence (a NaN, a 6-sigma spike, a min-loss-scale exit, max/mean expert load
> 5, RSS > 90 % of its budget, a short log) is labelled "unknown" and the reason noted.
OUT_DIR/CORPUS.md lists every run with its split, stack, kind, label and seconds taken (a
Markdown table, so that ingest does not read it as a log).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import labels
from specs import SPEC_ENV, MoESpec, Spec
from trainers import generate_run
from training import drop_weights

N = 250  # steps of most corpus runs


def _variants() -> list[tuple[str, Spec]]:
    """(stack, spec) with a placeholder name; seeds are unique (DeepSpeed's port is 29500 + seed)."""
    out: list[tuple[str, Spec]] = []

    def loop(kind, story, seed, **kw):
        out.append(("loop", Spec("", kind, story, seed=seed, steps=kw.pop("steps", N), **kw)))

    def hf(kind, story, seed, **kw):
        out.append(("hf", Spec("", kind, story, seed=seed, steps=kw.pop("steps", N), trainer="hf", **kw)))

    def ds(kind, story, seed, **kw):
        out.append(
            (
                "deepspeed",
                Spec(
                    "",
                    kind,
                    story,
                    seed=seed,
                    steps=kw.pop("steps", N),
                    trainer="deepspeed",
                    writers=("jsonl",),
                    **kw,
                ),
            )
        )

    def moe(kind, story, seed, **kw):
        out.append(("loop_moe", MoESpec("", kind, story, seed=seed, steps=kw.pop("steps", N), **kw)))

    # --- plain PyTorch loop (dense) ---
    loop("healthy", "healthy, lr 3e-3, d=32", 101)
    loop("healthy", "healthy, lr 2e-3, d=48", 102, lr=2e-3, d_model=48, writers=("jsonl",))
    loop("healthy", "healthy, lr 4e-3, d=24", 103, lr=4e-3, d_model=24, writers=("tb", "text"))
    loop(
        "healthy",
        "healthy, lr 1.5e-3, weight decay 0.05",
        104,
        lr=1.5e-3,
        weight_decay=0.05,
        writers=("tb", "jsonl"),
    )
    loop("healthy", "healthy, d=40, clip 0.5", 105, d_model=40, clip=0.5)
    loop("healthy", "healthy, 2048 training sequences", 106, lr=2.5e-3, train_size=2048, writers=("jsonl",))
    loop(
        "divergence_nan",
        "lr grows 25 %/step from step 100 until NaN",
        111,
        clip=0.0,
        bugs={"lr_growth": (100, 1.25)},
    )
    loop(
        "divergence_nan",
        "lr grows 15 %/step from step 140 until NaN",
        112,
        clip=0.0,
        d_model=48,
        writers=("jsonl",),
        bugs={"lr_growth": (140, 1.15)},
    )
    loop("loss_spike", "lr x40 for 5 steps at step 120", 113, bugs={"lr_burst": (120, 125, 40.0)})
    loop(
        "loss_spike",
        "lr x60 for 3 steps at step 170",
        114,
        d_model=48,
        writers=("tb", "text"),
        bugs={"lr_burst": (170, 173, 60.0)},
    )
    loop("loss_spike_unrecovered", "lr x400 from step 130 on", 115, bugs={"lr_burst": (130, N, 400.0)})
    loop(
        "loss_spike_unrecovered",
        "lr x250 from step 160 on",
        116,
        writers=("jsonl",),
        bugs={"lr_burst": (160, N, 250.0)},
    )
    loop(
        "attention_collapse",
        "attention temperature 60 and the output path frozen and decaying from step 120",
        117,
        writers=("tb", "jsonl"),
        bugs={"attn_temperature": (120, 60.0), "freeze_decay": (120, "output", 0.85)},
    )
    loop(
        "attention_collapse",
        "attention temperature 40 and the output path frozen and decaying (x0.8) from step 150",
        118,
        d_model=48,
        bugs={"attn_temperature": (150, 40.0), "freeze_decay": (150, "output", 0.8)},
    )
    loop(
        "dead_ffn",
        "embeddings frozen and decaying (x0.8) from step 110",
        119,
        bugs={"freeze_decay": (110, "embeddings", 0.8)},
    )
    loop(
        "dead_ffn",
        "embeddings frozen and decaying (x0.75) from step 160",
        120,
        writers=("jsonl",),
        bugs={"freeze_decay": (160, "embeddings", 0.75)},
    )
    loop(
        "overfitting",
        "16 training sequences, no weight decay",
        121,
        steps=300,
        train_size=16,
        eval_every=10,
        weight_decay=0.0,
        writers=("tb", "jsonl"),
    )
    loop(
        "overfitting",
        "24 training sequences, no weight decay, d=48",
        122,
        steps=300,
        train_size=24,
        eval_every=10,
        weight_decay=0.0,
        d_model=48,
    )
    loop("plateau", "lr decays 4 %/step from step 30", 123, bugs={"lr_decay": (30, 0.96)})
    loop("plateau", "lr decays 7 %/step from step 40", 124, writers=("jsonl",), bugs={"lr_decay": (40, 0.93)})
    loop(
        "memory_blowup",
        "a 3.3 GB activation cache leaks at step 150 while the output path is frozen and decays",
        125,
        bugs={"leak_gb": (150, 3.3), "freeze_decay": (150, "output", 0.85)},
    )
    loop(
        "memory_blowup",
        "a 3.5 GB activation cache leaks at step 180 while the output path is frozen and decays (x0.8)",
        126,
        d_model=48,
        writers=("tb", "jsonl"),
        bugs={"leak_gb": (180, 3.5), "freeze_decay": (180, "output", 0.8)},
    )
    # --- HF Trainer ---
    hf("healthy", "healthy HF Trainer, lr 3e-3", 131)
    hf("healthy", "healthy HF Trainer, lr 2e-3, d=48", 132, lr=2e-3, d_model=48)
    hf("healthy", "healthy HF Trainer, lr 4e-3, d=24", 133, lr=4e-3, d_model=24)
    hf("healthy", "healthy HF Trainer, lr 2.5e-3, weight decay 0.05", 134, lr=2.5e-3, weight_decay=0.05)
    hf(
        "overfitting",
        "HF Trainer, 16 training sequences, no weight decay",
        135,
        steps=300,
        train_size=16,
        eval_every=10,
        weight_decay=0.0,
    )
    hf(
        "overfitting",
        "HF Trainer, 24 training sequences, no weight decay, d=48",
        136,
        steps=300,
        train_size=24,
        eval_every=10,
        weight_decay=0.0,
        d_model=48,
    )
    # --- DeepSpeed fp16 ZeRO-1 (healthy runs long enough for the loss scale to overflow and recover) ---
    ds("healthy", "healthy DeepSpeed fp16, lr 3e-3", 141, steps=340)
    ds("healthy", "healthy DeepSpeed fp16, lr 2e-3, d=48", 142, steps=340, lr=2e-3, d_model=48)
    ds("healthy", "healthy DeepSpeed fp16, lr 4e-3", 143, steps=340, lr=4e-3)
    ds("healthy", "healthy DeepSpeed fp16, d=24", 144, steps=340, d_model=24)
    ds(
        "fp16_overflow",
        "lr x1e4 from step 60 until the loss scale reaches its minimum",
        145,
        bugs={"lr_burst": (60, N, 1e4)},
    )
    ds(
        "fp16_overflow",
        "lr x3e3 from step 120 until the loss scale reaches its minimum",
        146,
        bugs={"lr_burst": (120, N, 3e3)},
    )
    ds(
        "fp16_overflow",
        "lr x1e4 from step 90, d=48, until the loss scale reaches its minimum",
        147,
        d_model=48,
        bugs={"lr_burst": (90, N, 1e4)},
    )
    ds(
        "loss_spike",
        "DeepSpeed fp16, lr x40 for 5 steps at step 150",
        148,
        bugs={"lr_burst": (150, 155, 40.0)},
    )
    ds("plateau", "DeepSpeed fp16, lr decays 4 %/step from step 40", 149, bugs={"lr_decay": (40, 0.96)})
    # --- MoE (the plain loop of moe.py) ---
    moe("healthy", "healthy MoE, 8 experts top-1, coefficient 0.01", 151, writers=("tb", "jsonl"))
    moe(
        "healthy",
        "healthy MoE, 16 experts top-2, coefficient 0.02, d=48",
        152,
        d_model=48,
        lr=2e-3,
        experts=16,
        top_k=2,
        aux_coef=0.02,
        writers=("jsonl",),
    )
    moe(
        "healthy",
        "healthy MoE, 8 experts top-1, coefficient 0.02, lr 2e-3",
        153,
        lr=2e-3,
        aux_coef=0.02,
        writers=("tb",),
    )
    moe(
        "healthy",
        "healthy MoE, 16 experts top-2, aux-loss-free bias balancing 0.001 + coefficient 0.001",
        154,
        experts=16,
        top_k=2,
        aux_coef=0.001,
        bias_rate=0.001,
        writers=("tb",),
    )
    moe(
        "router_collapse",
        "balance-loss coefficient -0.1 from step 100",
        155,
        writers=("tb",),
        bugs={"aux_coef": (100, -0.1)},
    )
    moe(
        "router_collapse",
        "balance-loss coefficient -0.06 from step 110",
        156,
        writers=("jsonl",),
        bugs={"aux_coef": (110, -0.06)},
    )
    moe(
        "router_collapse",
        "balance-loss coefficient -0.2 and router lr x10 from step 80",
        157,
        writers=("tb", "jsonl"),
        bugs={"aux_coef": (80, -0.2), "router_lr": (80, 10.0)},
    )
    moe(
        "balance_loss_dominates",
        "balance-loss coefficient 500 from step 40",
        158,
        writers=("tb",),
        bugs={"aux_coef": (40, 500.0)},
    )
    moe(
        "balance_loss_dominates",
        "balance-loss coefficient 1000 from step 60",
        159,
        writers=("jsonl",),
        bugs={"aux_coef": (60, 1000.0)},
    )
    moe(
        "balance_loss_dominates",
        "balance-loss coefficient 300 from step 30, d=48",
        160,
        d_model=48,
        writers=("tb", "jsonl"),
        bugs={"aux_coef": (30, 300.0)},
    )
    moe(
        "healthy",
        "healthy dense run logging RSS against a 1.5 GB budget (probe metric under no_grad)",
        161,
        experts=0,
        probe_seqs=64,
        memory_budget_gb=1.5,
        writers=("tb", "text"),
    )
    moe(
        "memory_leak",
        "probe metric without no_grad from step 100 (64 sequences), 1.4 GB budget, OOM-killed",
        162,
        experts=0,
        probe_seqs=64,
        memory_budget_gb=1.4,
        writers=("tb", "text"),
        bugs={"probe_leak": 100},
    )
    moe(
        "memory_leak",
        "probe metric without no_grad from step 140 (96 sequences), 1.6 GB budget, OOM-killed",
        163,
        experts=0,
        probe_seqs=96,
        memory_budget_gb=1.6,
        writers=("tb", "jsonl", "text"),
        bugs={"probe_leak": 140},
    )
    return out


def corpus_specs() -> list[tuple[str, str, Spec]]:
    """(split, stack, spec): each kind's runs alternate between tune and holdout, in order."""
    seen: dict[str, int] = {}
    specs = []
    for stack, spec in _variants():
        i = seen[spec.kind] = seen.get(spec.kind, -1) + 1
        split = "tune" if i % 2 == 0 else "holdout"
        name = f"{split}/{stack}_{spec.kind}_{spec.seed}"
        specs.append((split, stack, replace(spec, name=name)))
    return specs


# ---------------------------------------------------------------------------------------------
def _one(args: tuple[Path, Spec]) -> tuple[str, float]:
    out, spec = args
    import torch

    torch.set_num_threads(1)
    os.environ[SPEC_ENV] = json.dumps(asdict(spec))  # the DeepSpeed worker reads its spec here
    t0 = time.time()
    with open(os.devnull, "w") as quiet, _redirect(quiet):
        generate_run(spec, out)
    drop_weights(out / spec.name)
    return spec.name, time.time() - t0


class _redirect:
    """Keep the library chatter (HF, DeepSpeed warnings) of a job out of the console."""

    def __init__(self, f):
        self.f = f

    def __enter__(self):
        sys.stdout.flush()
        sys.stderr.flush()
        self.saved = os.dup(1), os.dup(2)
        os.dup2(self.f.fileno(), 1)
        os.dup2(self.f.fileno(), 2)

    def __exit__(self, *exc):
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self.saved[0], 1)
        os.dup2(self.saved[1], 2)
        os.close(self.saved[0])
        os.close(self.saved[1])


def healthy_problems(run: Path, spec: Spec) -> list[str]:
    """Failure evidence in a run meant to be healthy (then it is labelled unknown)."""
    problems = []
    steps, loss = labels.loss_series(run)
    if not len(loss) or not (loss == loss).all() or abs(loss).max() == float("inf"):
        problems.append("non-finite or missing loss")
    elif labels.onset_for("loss_spike", run) is not None:
        problems.append(f"6-sigma loss spike at step {labels.onset_for('loss_spike', run)}")
    elif steps[-1] < 0.95 * spec.steps - 5:
        problems.append(f"log ends early (step {steps[-1]} of {spec.steps})")
    lines = labels.console_lines(run)
    if any("loss scale already at minimum" in line for line in lines):
        problems.append("DeepSpeed minimum-loss-scale exit")
    if any("out of memory" in line for line in lines):
        problems.append("OOM kill")
    if getattr(spec, "experts", 0):
        for layer in range(2):
            _, ratio, _ = labels.load_ratio(run, layer)
            if len(ratio) and ratio.max() > 5:
                problems.append(f"layer {layer} max/mean expert load {ratio.max():.1f} > 5")
    if getattr(spec, "memory_budget_gb", 0):
        _, pct = labels.loss_series(run, "memory/rss_pct_of_budget")
        if len(pct) and pct.max() >= 90:
            problems.append(f"RSS {pct.max():.0f} % of the budget")
    return problems


def overflow_count(run: Path) -> int:
    return sum("OVERFLOW!" in line for line in labels.console_lines(run))


def write_labels(out: Path, specs: list[tuple[str, str, Spec]], seconds: dict[str, float]) -> list[dict]:
    import numpy as np

    finals = []
    for _, _, spec in specs:
        if spec.kind == "healthy":
            v = labels.loss_series(out / spec.name)[1]
            if len(v) and np.isfinite(v[-1]):
                finals.append(float(v[-1]))
    healthy_final = float(np.median(finals)) if finals else 1.0
    rows, lines = (
        [],
        [
            "# Written by sample_runs/corpus.py from each run's own evidence; rules in sample_runs/labels.py.",
            f"# healthy runs' median final loss (the plateau and balance-loss rules use it): {healthy_final:.4f}",
            "",
        ],
    )
    for split, stack, spec in specs:
        run = out / spec.name
        if not run.exists():
            continue
        onset, why = None, ""
        if spec.kind == "healthy":
            problems = healthy_problems(run, spec)
            outcome = "unknown" if problems else "healthy"
            why = "; ".join(problems)
        else:
            onset = labels.onset_for(spec.kind, run, healthy_final)
            outcome = "failed" if onset is not None else "unknown"
            why = "" if onset is not None else "its rule found no onset in the logs"
        row = {
            "run": spec.name,
            "split": split,
            "stack": stack,
            "kind": spec.kind,
            "outcome": outcome,
            "onset": onset,
            "seconds": round(seconds.get(spec.name, 0.0), 1),
        }
        if stack == "deepspeed":
            row["overflows"] = overflow_count(run)
        rows.append(row)
        lines += labels.label_entry(spec, outcome, onset)
        lines.append(f'stack = "{stack}"')
        lines.append(f'split = "{split}"')
        if "overflows" in row:
            lines.append(f"overflows = {row['overflows']}")
        note = spec.story + (f" (unknown: {why})" if why else "")
        lines.append(f"note = {json.dumps(note)}")
        lines.append("")
    (out / "labels.toml").write_text("\n".join(lines))
    cols = ["run", "split", "stack", "kind", "outcome", "onset", "seconds", "overflows"]
    table = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    table += ["| " + " | ".join("" if r.get(c) is None else str(r[c]) for c in cols) + " |" for r in rows]
    (out / "CORPUS.md").write_text("\n".join(table) + "\n")
    return rows


def build(out: Path, jobs: int = 2) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for split in ("tune", "holdout"):
        shutil.rmtree(out / split, ignore_errors=True)
    specs = corpus_specs()
    # longest first, so that the last jobs to start are short ones
    order = {"deepspeed": 0, "hf": 1, "loop_moe": 2, "loop": 3}
    todo = [s for _, _, s in sorted(specs, key=lambda x: (order[x[1]], -x[2].steps))]
    t0 = time.time()
    seconds: dict[str, float] = {}
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(jobs, maxtasksperchild=1) as pool:
        for i, (name, secs) in enumerate(pool.imap_unordered(_one, [(out, s) for s in todo]), 1):
            seconds[name] = secs
            print(f"[{i}/{len(todo)}] {name}: {secs:.0f}s ({time.time() - t0:.0f}s elapsed)", flush=True)
    rows = write_labels(out, specs, seconds)
    size = subprocess.run(["du", "-sh", str(out)], capture_output=True, text=True).stdout.split()[0]
    print(f"corpus: {len(rows)} runs in {time.time() - t0:.0f}s, {size} at {out}")
    table: dict[tuple[str, str, str], int] = {}
    for r in rows:
        key = (r["kind"] if r["outcome"] != "unknown" else f"{r['kind']} (unknown)", r["stack"], r["split"])
        table[key] = table.get(key, 0) + 1
    for (kind, stack, split), n in sorted(table.items()):
        print(f"  {kind:32s} {stack:10s} {split:8s} {n}")
