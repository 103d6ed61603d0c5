"""The diverse corpus's labels.toml, MANIFEST.tsv and STATUS.md (diverse.py says the criteria;
the failure rules are labels.py's, read in each run's own tag names)."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import labels
import numpy as np
from specs import Spec


def _series(run: Path, spec: Spec, tag: str) -> tuple[np.ndarray, np.ndarray]:
    return labels.loss_series(run, tag, spec.tags, spec.batch)


def healthy_finals(out: Path, specs: list[Spec]) -> dict[str, float]:
    """Per dataset, the median final loss EMA of the runs meant to be healthy that ended finite."""
    finals: dict[str, list[float]] = {}
    for spec in specs:
        if spec.kind == "healthy":
            st, v = _series(out / spec.name, spec, "train/loss")
            if len(v) and np.isfinite(v).all():
                finals.setdefault(spec.dataset, []).append(float(labels.ema(v, steps=st)[-1]))
    return {k: float(np.median(v)) for k, v in finals.items()}


def healthy_problems(run: Path, spec: Spec) -> list[str]:
    """Failure evidence in a run meant to be healthy (then it is labelled unknown)."""
    problems = []
    steps, loss = _series(run, spec, "train/loss")
    if not len(loss):
        return ["no loss logged"]
    bad = np.flatnonzero(~np.isfinite(loss))
    if len(bad):
        problems.append(f"non-finite loss at step {steps[bad[0]]}")
    elif (last := labels.ema(loss, steps=steps)[-1]) > 0.8 * loss[0]:
        problems.append(f"did not learn (loss EMA {last:.3f} from {loss[0]:.3f})")
    if steps[-1] < 0.95 * spec.steps - spec.log_every - 1:
        problems.append(f"log ends early (step {steps[-1]} of {spec.steps})")
    for line in labels.console_lines(run):
        for sign in ("watchdog", "already at minimum", "fell below its minimum", "out of memory"):
            if sign in line:
                problems.append(line.strip()[:120])
    if getattr(spec, "experts", 0) and labels.onset_for("router_collapse", run, scheme=spec.tags) is not None:
        problems.append("max/mean expert load >= E/2 for 20 steps")
    if getattr(spec, "memory_budget_gb", 0):
        _, pct = _series(run, spec, "memory/rss_pct_of_budget")
        if len(pct) and pct.max() >= 90:
            problems.append(f"RSS {pct.max():.0f} % of the budget")
    return problems


def evidence(run: Path, spec: Spec) -> dict:
    """What the logs show beside the label: loss-scale falls (fp16 skips), a 6-sigma spike."""
    out: dict = {}
    if spec.precision == "fp16":
        sc = _series(run, spec, "train/loss_scale")[1]
        out["loss_scale_falls"] = int((np.diff(sc) < 0).sum()) if len(sc) else 0
    if spec.kind == "healthy":
        spike = labels.onset_for("loss_spike", run, scheme=spec.tags, batch=spec.batch)
        if spike is not None:
            out["spike_step"] = spike
    return out


def label(out: Path, spec: Spec, finals: dict[str, float]) -> tuple[str, int | None, str]:
    """(outcome, onset, why unknown) of one run."""
    run = out / spec.name
    if spec.kind == "healthy":
        problems = healthy_problems(run, spec)
        return ("unknown" if problems else "healthy"), None, "; ".join(problems)
    final = finals.get(spec.dataset)
    if final is None and spec.kind in ("plateau", "balance_loss_dominates"):
        return "unknown", None, f"no healthy run on {spec.dataset} yet to compare the final loss with"
    onset = labels.onset_for(spec.kind, run, final or 1.0, spec.tags, spec.batch)
    return (
        ("failed", onset, "")
        if onset is not None
        else ("unknown", None, "its rule found no onset in the logs")
    )


def write_labels(out: Path, specs: list[Spec], seconds: dict[str, float]) -> list[dict]:
    from data import text_sha256

    finals = healthy_finals(out, specs)
    lines = [
        "# Written by sample_runs/diverse.py: the injected cause confirmed on each run's own logs",
        "# (criteria: sample_runs/labels.py and diverse.py); family attributes beside each label.",
        f"# healthy runs' median final loss EMA per dataset (plateau, balance loss): {json.dumps(finals)}",
        "",
    ]
    rows = []
    sha = {d: text_sha256(d) for d in {s.dataset for s in specs}}
    for spec in specs:
        outcome, onset, why = label(out, spec, finals)
        lines += labels.label_entry(spec, outcome, onset)
        note = spec.story + (f" (unknown: {why})" if why else "")
        lines.append(f"note = {json.dumps(note)}")
        extra = {**spec.family, "dataset_sha256": sha[spec.dataset], "seconds": round(seconds[spec.name], 1)}
        extra |= evidence(out / spec.name, spec)
        extra.pop("trainer", None)  # label_entry wrote it (a TOML key once per table)
        lines += [f"{k} = {json.dumps(v)}" for k, v in extra.items()]
        lines.append("")
        rows.append(
            {"run": spec.name, "kind": spec.kind, "outcome": outcome, "trainer": spec.trainer, **extra}
        )
    (out / "labels.toml").write_text("\n".join(lines))
    return rows


def write_manifest(out: Path, specs: list[Spec], seconds: dict[str, float]) -> None:
    """DIR/MANIFEST.tsv: every file of every run with its size and sha256, and the run's seconds."""
    rows = ["path\tbytes\tsha256\trun\trun_seconds"]
    for spec in sorted(specs, key=lambda s: s.name):
        for f in sorted(p for p in (out / spec.name).rglob("*") if p.is_file()):
            digest = hashlib.sha256(f.read_bytes()).hexdigest()
            rel = f.relative_to(out)
            rows.append(f"{rel}\t{f.stat().st_size}\t{digest}\t{spec.name}\t{seconds[spec.name]:.1f}")
    (out / "MANIFEST.tsv").write_text("\n".join(rows) + "\n")


def write_status(out: Path, rows: list[dict], planned: int) -> None:
    """DIR/STATUS.md: runs done of planned, outcome per kind x trainer, counts per family axis."""
    trainers = sorted({r["trainer"] for r in rows})
    table = [
        "| kind | " + " | ".join(trainers) + " | failed/healthy | unknown |",
        "|---" * (len(trainers) + 3) + "|",
    ]
    for kind in sorted({r["kind"] for r in rows}):
        rs = [r for r in rows if r["kind"] == kind]
        cells = [str(sum(r["trainer"] == t for r in rs)) for t in trainers]
        good = sum(r["outcome"] != "unknown" for r in rs)
        table.append(f"| {kind} | " + " | ".join(cells) + f" | {good} | {len(rs) - good} |")
    axes = []
    for axis in ("optimizer", "size", "arch", "clip", "schedule", "precision", "dataset", "tags", "writers"):
        counts = Counter(str(r[axis]) for r in rows)
        axes.append(f"- {axis}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    hard = Counter(r["hard_negative"] for r in rows if r["kind"] == "healthy" and r["hard_negative"])
    cpu = sum(r["seconds"] for r in rows)
    text = [
        "# Diverse corpus status",
        "",
        f"{len(rows)} of {planned} runs done, {cpu / 60:.0f} CPU-minutes; outcomes: "
        + ", ".join(f"{k} {v}" for k, v in sorted(Counter(r["outcome"] for r in rows).items())),
        "",
        "Runs per kind and trainer (failed/healthy: the label confirmed the cause; unknown: it did not):",
        "",
        *table,
        "",
        "Runs per family attribute:",
        "",
        *axes,
        "- healthy hard negatives: " + ", ".join(f"{k} {v}" for k, v in sorted(hard.items())),
        "",
    ]
    (out / "STATUS.md").write_text("\n".join(text))
