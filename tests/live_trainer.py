"""A real training job for the live-watch tests: the sample runs' tiny transformer
(sample_runs/model.py) trained with AdamW on CPU, logging every step as a training script does:
TensorBoard through torch's SummaryWriter, a JSONL file and a nanoGPT-style console line, each
flushed every step so a watch sees the run grow. Checkpoints every 25 steps; at the end the
hparams session-end record (TensorBoard's end-of-run marker).

    python tests/live_trainer.py RUN_DIR [--steps 160] [--seed 0] [--diverge-at STEP]
        [--kill-at STEP] [--resume-from STEP] [--step-delay 0.02] [--nan-step-delay S]

--diverge-at: from that step the learning rate grows 60 % a step and clipping is off, until the
loss is NaN; a watchdog stops the job --nan-patience (5) steps later, each taking
--nan-step-delay (default: --step-delay) seconds. --kill-at: the process half-writes that
step's JSONL line and SIGKILLs itself (no flush, no end marker). --resume-from: load that
step's checkpoint and continue with a new writer (a new event file, `resume.stdout.log`), the
JSONL appended, as a job restarted after a kill does.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from pathlib import Path

import torch
from torch.utils.tensorboard import SummaryWriter

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sample_runs"))
from model import TinyLM, layer_grad_norms, make_language, sample_sequences  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", type=Path)
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--diverge-at", type=int, default=None)
    ap.add_argument("--kill-at", type=int, default=None)
    ap.add_argument("--resume-from", type=int, default=None)
    ap.add_argument("--step-delay", type=float, default=0.02)
    ap.add_argument("--nan-patience", type=int, default=5)
    ap.add_argument("--nan-step-delay", type=float, default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    run = a.run
    (run / "checkpoints").mkdir(parents=True, exist_ok=True)
    chain = make_language(1234)
    train = sample_sequences(chain, 1024, seed=a.seed)
    evalset = sample_sequences(chain, 128, seed=999)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    start = 0
    if a.resume_from is not None:
        state = torch.load(run / "checkpoints" / f"ckpt_{a.resume_from}.pt")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = a.resume_from
    tb = SummaryWriter(str(run / "tb"), flush_secs=1)
    jsonl = open(run / "metrics.jsonl", "a")  # noqa: SIM115
    console = open(run / ("resume.stdout.log" if a.resume_from is not None else "stdout.log"), "a")  # noqa: SIM115
    if a.resume_from is not None:
        console.write(f"Loading checkpoint from {run.name}/checkpoints/ckpt_{a.resume_from}.pt\n")
    g = torch.Generator().manual_seed(a.seed * 1000 + start)
    nan_since = None
    loss = float("nan")
    for step in range(start, a.steps):
        lr = 3e-3 * min(1.0, (step + 1) / 20)
        if a.diverge_at is not None and step >= a.diverge_at:
            lr *= 1.6 ** (step - a.diverge_at)
        for grp in opt.param_groups:
            grp["lr"] = lr
        batch = train[torch.randint(0, len(train), (16,), generator=g)]
        out = model(batch[:, :-1], batch[:, 1:])
        opt.zero_grad(set_to_none=True)
        out["loss"].backward()
        clip = float("inf") if a.diverge_at is not None and step >= a.diverge_at else 1.0
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip))
        metrics = {
            "train/loss": float(out["loss"].detach()),
            "train/lr": lr,
            "train/grad_norm": grad_norm,
            **layer_grad_norms(model),
            **model.stats,
        }
        opt.step()
        if step % 20 == 0 or step == a.steps - 1:
            with torch.no_grad():
                metrics["eval/loss"] = float(model(evalset[:, :-1], evalset[:, 1:])["loss"])
        if step == a.kill_at:
            jsonl.write(json.dumps({"step": step, **metrics})[:40])  # a line half written
            jsonl.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        for k, v in metrics.items():
            tb.add_scalar(k, v, step)
        tb.flush()
        jsonl.write(json.dumps({"step": step, **metrics}) + "\n")
        jsonl.flush()
        console.write(
            f"step:{step}/{a.steps} train_loss:{metrics['train/loss']:.4f} lr:{lr:.6g} grad_norm:{grad_norm:.4g}\n"
        )
        console.flush()
        loss = metrics["train/loss"]
        if step % 25 == 0 and step > start:
            torch.save(
                {"model": model.state_dict(), "opt": opt.state_dict(), "step": step},
                run / "checkpoints" / f"ckpt_{step}.pt",
            )
        if not math.isfinite(loss) and nan_since is None:
            nan_since = step
        if nan_since is not None and step >= nan_since + a.nan_patience:
            console.write(f"watchdog: loss is NaN since step {nan_since}; stopping\n")
            break
        time.sleep(a.step_delay if nan_since is None or a.nan_step_delay is None else a.nan_step_delay)
    tb.add_hparams({"seed": a.seed}, {"hparam/final_loss": loss if math.isfinite(loss) else -1.0})
    tb.close()
    jsonl.close()
    console.close()


if __name__ == "__main__":
    main()
