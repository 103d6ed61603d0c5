"""Labels from each run's own evidence, read without the workbench (tbparse, json, csv).

Rules (the onset is the step where the failure starts):
- divergence_nan: the first step whose train loss is NaN/Inf.
- divergence_nan_filtered: the first logged step whose grad_norm or eval_loss is NaN/Inf in
  trainer_state.json (the HF Trainer's NaN filter keeps the logged train loss finite).
- loss_spike, loss_spike_unrecovered: the first step after step 50 whose loss exceeds the mean
  of the 20 logged values before it (at least 8) by more than 6 of their standard deviations.
- attention_collapse, dead_ffn: the divergence point: the first step after step 50 from which
  the EMA of the loss (alpha 0.1 per step, whatever the logging interval) stays above 1.1 x its
  minimum so far until the end.
- memory_blowup: the first step whose RSS is more than 3 GB above the step before.
- overfitting: the step of the lowest eval loss, in a run whose last eval loss is at least 5 %
  above that minimum.
- plateau: the first step after which the EMA loss improves by less than 0.5 % over the next
  100 steps (to the first value logged 100 steps later), while still above 1.2 x the median
  final loss of the healthy runs (of the same data).
- fp16_overflow: the first skipped step of the final overflow storm: the last unbroken fall of
  the logged loss scale (DeepSpeed's monitor CSV, x = samples / train_batch_size = DeepSpeed's
  global step, or the plain loop's GradScaler scale), plus the hysteresis skip before it that
  keeps the scale; it must end at the minimum scale (1).
- router_collapse: the busiest expert of MoE layer 0 takes at least half the routed tokens
  (max/mean load >= E/2, E experts) for 20 consecutive steps; the onset is the last step before
  that stretch at which the max/mean load was still at or below its median since step 50.
- balance_loss_dominates: the first step from which the logged balance loss stays above 10 x its
  median over the first 20 steps until the end, in a run whose LM loss (EMA) ends above 1.2 x
  the median final loss of the healthy runs (the main loss stalled).
- memory_leak: a run that ends OOM-killed (an `out of memory` line in its console) with its last
  logged RSS at 90 % of its budget or more; the onset is the first step whose RSS is more than
  5 % above the median of the RSS logged before it and stays so until the end.
A run labelled healthy must show none of the above.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
from training import CONSOLE_KEYS, tag_name


def loss_series(
    run: Path, tag: str = "train/loss", scheme: str = "slash", batch: int = 16
) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of a tag (a "slash" name, logged under its name in the run's tag `scheme`),
    newest write of each step (as TensorBoard's loader keeps it), from the first of the run's
    writers found: TensorBoard under tb/, the HF Trainer's trainer_state.json, DeepSpeed's monitor
    CSV (x = samples / `batch`), metrics.jsonl, Lightning's logs, the console's `step:` lines."""
    named = tag_name(scheme, tag)
    if (run / "tb").exists():
        return _tb_series(run / "tb", named)
    state = run / "trainer_state.json"
    if state.exists():
        key = {"train/loss": "loss", "eval/loss": "eval_loss", "train/grad_norm": "grad_norm"}[tag]
        hist = [e for e in json.loads(state.read_text())["log_history"] if key in e]
        return np.array([e["step"] for e in hist]), np.array([e[key] for e in hist], dtype=float)
    csvs = list(run.glob(f"monitor_csv/*/Train_Samples_{tag.split('/')[-1]}.csv"))
    if tag == "train/loss":
        csvs = list(run.glob("monitor_csv/*/Train_Samples_train_loss.csv"))
    if csvs:
        rows = [r for r in csv.reader(csvs[0].read_text().splitlines()) if r and r[0] != "step"]
        return np.array([int(r[0]) // batch for r in rows]), np.array([float(r[1]) for r in rows])
    jsonl = run / "metrics.jsonl"
    if jsonl.exists():
        last = {}
        for line in jsonl.read_text().splitlines():
            rec = json.loads(line) if line.strip() else {}
            if named in rec:
                last[rec["step"]] = float(rec[named])
        return _arrays(last)
    lightning = run / "lightning_logs/version_0"
    if (lightning / "metrics.csv").exists():
        last = {}
        with open(lightning / "metrics.csv") as f:
            for r in csv.DictReader(f):
                if r.get(named):
                    last[int(r["step"])] = float(r[named])
        return _arrays(last)
    if lightning.exists():
        return _tb_series(lightning, named)
    return _console_series(run, tag, scheme)


def _tb_series(folder: Path, tag: str) -> tuple[np.ndarray, np.ndarray]:
    from tbparse import SummaryReader

    df = SummaryReader(str(folder), extra_columns={"wall_time"}).scalars
    if df.empty:
        return np.array([]), np.array([])
    df = (
        df[df["tag"] == tag].sort_values("wall_time").drop_duplicates("step", keep="last").sort_values("step")
    )
    return df["step"].to_numpy(), df["value"].to_numpy()


def _console_series(run: Path, tag: str, scheme: str) -> tuple[np.ndarray, np.ndarray]:
    """The console's `step:N/T key:value` lines (training.Loggers), the last of each step."""
    key = "val_loss" if tag == "eval/loss" else CONSOLE_KEYS[scheme].get(tag, "")
    last = {}
    pattern = re.compile(rf"^step:(\d+)/\d+ .*\b{key}:(\S+)")
    for line in console_lines(run):
        if key and (m := pattern.match(line)):
            last[int(m[1])] = float(m[2])
    return _arrays(last)


def _arrays(by_step: dict[int, float]) -> tuple[np.ndarray, np.ndarray]:
    steps = sorted(by_step)
    return np.array(steps, dtype=int), np.array([by_step[k] for k in steps], dtype=float)


def tag_names(run: Path) -> set[str]:
    """The scalar tags a run logged (TensorBoard under tb/, else its metrics.jsonl)."""
    from tbparse import SummaryReader

    if (run / "tb").exists():
        return set(SummaryReader(str(run / "tb")).scalars["tag"].unique())
    jsonl = run / "metrics.jsonl"
    if jsonl.exists():
        keys = {k for line in jsonl.read_text().splitlines() if line.strip() for k in json.loads(line)}
        return keys - {"step"}
    return set()


def load_ratio(run: Path, layer: int = 0, scheme: str = "slash") -> tuple[np.ndarray, np.ndarray, int]:
    """(steps, max/mean expert load, number of experts) of one MoE layer."""
    s, mx = loss_series(run, f"moe/layer_{layer}/max_load", scheme)
    s2, mean = loss_series(run, f"moe/layer_{layer}/mean_load", scheme)
    experts = sum(t.startswith(f"moe/layer_{layer}/expert_load/") for t in tag_names(run)) if len(s) else 0
    if not len(s) or not np.array_equal(s, s2):
        return np.array([]), np.array([]), experts
    return s, mx / mean, experts


def console_lines(run: Path) -> list[str]:
    return [line for f in sorted(run.glob("*.log")) for line in f.read_text(errors="replace").splitlines()]


def ema(values: np.ndarray, alpha: float = 0.1, steps: np.ndarray | None = None) -> np.ndarray:
    """The EMA of `alpha` per step: with `steps`, a value logged k steps after the one before it
    weighs 1 - (1 - alpha)^k (a run that logs every 10 steps is smoothed as one that logs each)."""
    gaps = np.diff(steps, prepend=steps[0] - 1) if steps is not None else np.ones(len(values))
    out, last = np.empty_like(values), values[0]
    for i, v in enumerate(values):
        a = 1 - (1 - alpha) ** max(1, gaps[i])
        last = a * v + (1 - a) * last
        out[i] = last
    return out


def onset_for(
    kind: str, run: Path, healthy_final: float = 1.0, scheme: str = "slash", batch: int = 16
) -> int | None:
    """The onset of a failure of `kind` by its rule (module docstring), None if the logs show none;
    `scheme` and `batch` say how the run named its tags and counted DeepSpeed's samples."""

    def series(tag: str) -> tuple[np.ndarray, np.ndarray]:
        return loss_series(run, tag, scheme, batch)

    steps, loss = series("train/loss")
    if kind == "divergence_nan":
        bad = np.flatnonzero(~np.isfinite(loss))
        return int(steps[bad[0]]) if len(bad) else None
    if kind == "divergence_nan_filtered":
        hist = json.loads((run / "trainer_state.json").read_text())["log_history"]
        bad = [
            e["step"]
            for e in hist
            if not all(np.isfinite(e[k]) for k in ("grad_norm", "eval_loss") if k in e)
        ]
        return bad[0] if bad else None
    if kind in ("loss_spike", "loss_spike_unrecovered"):
        for i in range(max(8, int(np.searchsorted(steps, 50))), len(loss)):
            w = loss[max(0, i - 20) : i]
            if loss[i] > w.mean() + 6 * w.std():
                return int(steps[i])
        return None
    if kind in ("attention_collapse", "dead_ffn"):
        e = ema(loss, steps=steps)
        best = np.minimum.accumulate(e)
        above = e > 1.1 * best
        for i in range(int(np.searchsorted(steps, 50)), len(e)):
            if above[i:].all():
                return int(steps[i])
        return None
    if kind == "memory_blowup":
        s, rss = series("memory/rss_gb")
        jump = np.flatnonzero(np.diff(rss) > 3.0)
        return int(s[jump[0] + 1]) if len(jump) else None
    if kind == "overfitting":
        s, ev = series("eval/loss")
        if len(ev) < 3 or not np.isfinite(ev).all() or ev[-1] < 1.05 * ev.min():
            return None  # the eval loss must end at least 5 % above its minimum
        return int(s[int(np.argmin(ev))])
    if kind == "plateau":
        e = ema(loss, steps=steps)
        ahead = np.searchsorted(steps, steps + 100)  # the first logged point 100 steps later
        for i in range(len(e)):
            j = ahead[i]
            if j < len(e) and (e[i] - e[j]) / e[i] < 0.005 and e[i] > 1.2 * healthy_final:
                return int(steps[i])
        return None
    if kind == "router_collapse":
        s, ratio, experts = load_ratio(run, 0, scheme)
        run_len = 0
        for i, high in enumerate(ratio >= experts / 2 if experts else []):
            run_len = run_len + 1 if high else 0
            if run_len == 20:
                start = i - 19
                since = ratio[int(np.searchsorted(s, 50)) : start]
                normal = np.median(since) if len(since) else ratio[:start].min()
                back = np.flatnonzero(ratio[:start] <= normal)
                return int(s[back[-1]]) if len(back) else int(s[start])
        return None
    if kind == "balance_loss_dominates":
        s, bal = series("moe/balance_loss")
        if len(bal) < 40 or ema(loss, steps=steps)[-1] <= 1.2 * healthy_final:
            return None
        high = bal > 10 * np.median(bal[:20])
        for i in range(20, len(bal)):
            if high[i:].all():
                return int(s[i])
        return None
    if kind == "memory_leak":
        s, rss = series("memory/rss_gb")
        _, pct = series("memory/rss_pct_of_budget")
        killed = any("out of memory" in line for line in console_lines(run))
        if not killed or not len(pct) or pct[-1] < 90:
            return None
        for i in range(1, len(rss)):
            above = rss[i:] > 1.05 * np.median(rss[:i])
            if above.all():
                return int(s[i])
        return None
    if kind == "fp16_overflow":
        st, sc = series("train/loss_scale")
        if not len(sc) or sc[-1] > 1.0:  # the storm must end at the minimum scale (1)
            return None
        i = len(sc) - 1
        while i > 0 and sc[i - 1] > sc[i]:
            i -= 1
        if i > 0 and sc[i - 1] == sc[i]:  # the storm's first skip only spends hysteresis
            i -= 1
        return int(st[i])
    return None


def label_entry(spec, outcome: str, onset: int | None) -> list[str]:
    """A run's table in labels.toml: outcome, onset and kind, and the attributes of its spec that
    make its family (trainer, clipping), what leave-one-family-out scores hold out (the caller
    adds what else it knows)."""
    lines = [f'[runs."{spec.name}"]', f'outcome = "{outcome}"']
    if onset is not None:
        lines.append(f"onset = {onset}")
    if spec.kind != "healthy":
        lines.append(f'kind = "{spec.kind}"')
    lines.append(f'trainer = "{spec.trainer}"')
    return lines


def write_labels_and_readme(out: Path, specs) -> None:
    lines = [
        "# Written by sample_runs/generate.py from each run's own evidence; rules in sample_runs/labels.py.",
        "",
    ]
    table = []
    finals = [
        v[-1]
        for v in (
            loss_series(out / s.name)[1] for s in specs if s.kind == "healthy" and (out / s.name).exists()
        )
        if len(v)
    ]
    healthy_final = float(np.median([f for f in finals if np.isfinite(f)])) if finals else 1.0
    for spec in specs:
        run = out / spec.name
        if not run.exists():
            continue
        if spec.kind == "healthy":
            outcome, onset = "healthy", None
        else:
            onset = onset_for(spec.kind, run, healthy_final)
            outcome = "failed" if onset is not None else "unknown"
        lines += label_entry(spec, outcome, onset)
        lines.append(f"note = {json.dumps(spec.story)}")
        lines.append("")
        table.append((spec, outcome, onset))
    (out / "labels.toml").write_text("\n".join(lines))
    fire = {
        "healthy": "nothing (false alarms are counted here)",
        "divergence_nan": "non_finite; loss spike rules before the NaN",
        "divergence_nan_filtered": "non_finite on grad_norm / eval_loss (the logged loss stays finite, then 0.0)",
        "loss_spike": "loss spike (mean + 3 sigma, llm-foundry, OLMo); the run recovers",
        "loss_spike_unrecovered": "loss spike rules, then plateau",
        "attention_collapse": "P1 (grad_norm < 1e-5 and attn_entropy < 0.3 for 5 steps); gradient-flow decay",
        "dead_ffn": "P2 (ffn_input_std < 0.005 and ln_input_std < 0.05 for 5 steps)",
        "overfitting": "P3 / overfitting (eval worsens while train improves)",
        "fp16_overflow": "loss-scale collapse / overflow storm (DeepSpeed OVERFLOW lines)",
        "plateau": "plateau (ReduceLROnPlateau semantics); the slope predictor",
        "memory_blowup": "P4 (memory jump > 3 GB while grad_norm -> 0)",
        "router_collapse": "MoE imbalance (max/mean expert load > 5)",
        "balance_loss_dominates": "balance loss > 30 % of the total loss; plateau of the LM loss",
        "memory_leak": "memory pressure (RSS > 90 % of the budget) before the OOM kill",
    }
    readme = [
        "# Sample runs",
        "",
        "Real training runs of a tiny decoder-only transformer (2 layers, d=32) on a seeded synthetic",
        "language, logged by real writers: torch `SummaryWriter`, JSON Lines, the HF `Trainer`, the",
        "DeepSpeed engine (fp16, ZeRO-1, on the CPU), TRL's `SFTTrainer` (a tiny GPT-2) and Keras 3's",
        "`CSVLogger` (a next-token model); the console runs keep their console output. Labels in",
        "`labels.toml` come from each run's own evidence (rules: `labels.py`). Regenerate everything with",
        "",
        "    pip install -r sample_runs/requirements.txt && python sample_runs/generate.py",
        "",
        "(about 6 minutes on 2 CPU cores; fixed seeds; each run uses one thread). The tests and the",
        "README quickstart use the committed files and never need torch.",
        "",
        "| run | outcome | onset | what happened | what should fire |",
        "|---|---|---|---|---|",
    ]
    for spec, outcome, onset in table:
        readme.append(
            f"| `{spec.name}` | {outcome} | {'' if onset is None else onset} | {spec.story} | "
            f"{fire.get(spec.kind, '')} |"
        )
    readme += [
        "",
        "Checkpoint weights were dropped to keep the corpus small; each checkpoint keeps its metadata",
        "(step, sha256, size, parent run and step for restarts) beside where it was.",
        "",
        "The MoE runs (`moe.py`, `moe_model.py`) replace each FFN by routed experts with the Switch",
        "balance loss and log `train/loss` (LM loss), `moe/balance_loss` (coefficient x aux loss, the term",
        "added), `moe/total_loss`, `moe/aux_loss_coef`, and per layer L `moe/layer_L/expert_load/E` (tokens",
        "routed to expert E), `moe/layer_L/max_load`, `moe/layer_L/mean_load`, `moe/layer_L/router_entropy`.",
        "The memory-budget runs log `memory/rss_gb`, `memory/budget_gb` and `memory/rss_pct_of_budget`",
        "(`memory_budget_gb` in the TensorBoard hparams); a supervisor standing in for a cgroup memory limit",
        "kills the job with SIGKILL when its RSS passes the budget and writes the kernel OOM killer's line",
        "(with the child's real numbers) to its `stdout.log`.",
        "",
        "An evaluation corpus (not committed) comes from `python sample_runs/generate.py --corpus DIR",
        "[--jobs 2]`: varied seeds, learning rates, widths, onsets and mechanisms over the plain loop, the",
        "HF Trainer, DeepSpeed fp16 and the MoE trainer, in `DIR/tune/` and `DIR/holdout/`, labelled by",
        "the same rules in `DIR/labels.toml` (see `corpus.py`).",
        "",
        "A labelled corpus diverse by construction (not committed; its manifest is",
        "`diverse_manifest.tsv`) comes from `python sample_runs/generate.py --diverse DIR [--jobs N]",
        "[--only KIND_OR_FAMILY_VALUE ...] [--limit N]`: about 180 runs of the plain loop, the HF Trainer,",
        "DeepSpeed, Lightning and the MoE loop with their model (transformer sizes, LSTM, MLP), optimizer,",
        "clipping, lr schedule, batch size, logging interval, tag names, writers, precision and dataset",
        "(text shipped with Python or Debian) cycled within each failure kind, and healthy hard negatives",
        "(heavy clipping, warm restarts, small batches, fp16 overflow skips, resumed runs, a recovered",
        "spike). `DIR/labels.toml` holds each run's label (the injected cause confirmed by the rules of",
        "`labels.py` on its own logs) and its family attributes; `DIR/MANIFEST.tsv` every file's size and",
        "sha256; `DIR/STATUS.md` the breakdown (see `diverse.py`).",
        "",
    ]
    (out / "README.md").write_text("\n".join(readme))


if __name__ == "__main__":  # relabel the committed runs without training them again
    from specs import RECOVERY, SPECS

    write_labels_and_readme(Path(__file__).resolve().parent, [*SPECS, RECOVERY])
