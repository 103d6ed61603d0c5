"""A tiny numpy training loop logged with W&B in offline mode (what `WANDB_MODE=offline` writes).

Fits a 2-layer MLP by SGD on a seeded regression task and logs, every step, `train/loss`,
`train/grad_norm` and `lr` (plus `val/loss` every 25 steps) with `wandb.log`; prints a progress
line every 10 steps (W&B captures it into `files/output.log`). Beside the run folder it writes
`<run-dir-name>.logged.jsonl`: what the loop passed to `wandb.log`, step by step, so that the
history can be counted without W&B. `--crash-at N` raises an error at step N (exit code 1).

Run: WANDB_MODE=offline python train_wandb.py OUT_DIR [--steps 120] [--crash-at N]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import wandb


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--crash-at", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    x = rng.normal(size=(512, 8))
    y = np.sin(x @ rng.normal(size=8)) + 0.1 * rng.normal(size=512)
    xv = rng.normal(size=(128, 8))
    yv = np.sin(xv @ rng.normal(size=8))
    w1, w2 = rng.normal(size=(8, 16)) * 0.3, rng.normal(size=16) * 0.3
    config = {"lr": 0.05, "hidden": 16, "steps": args.steps, "seed": args.seed}
    run = wandb.init(project="reallogs", dir=str(args.out), config=config, mode="offline")
    logged = []
    for step in range(args.steps):
        idx = rng.integers(0, len(x), 64)
        h = np.tanh(x[idx] @ w1)
        err = h @ w2 - y[idx]
        loss = float(np.mean(err**2))
        g2 = 2 * h.T @ err / len(idx)
        g1 = x[idx].T @ ((2 * err[:, None] * w2[None, :] / len(idx)) * (1 - h**2))
        gnorm = float(np.sqrt((g1**2).sum() + (g2**2).sum()))
        lr = config["lr"] * (1 - step / args.steps)
        w1 -= lr * g1
        w2 -= lr * g2
        metrics = {"train/loss": loss, "train/grad_norm": gnorm, "lr": lr}
        if step % 25 == 0:
            metrics["val/loss"] = float(np.mean((np.tanh(xv @ w1) @ w2 - yv) ** 2))
        if args.crash_at is not None and step == args.crash_at:
            raise RuntimeError(f"simulated data-loader failure at step {step}")
        wandb.log(metrics, step=step)
        logged.append({"step": step, **metrics})
        if step % 10 == 0:
            print(f"step {step} loss {loss:.4f} grad_norm {gnorm:.3f} lr {lr:.4f}", flush=True)
        run_dir = Path(run.dir).parent
        with open(args.out / f"{run_dir.name}.logged.jsonl", "a" if step else "w") as f:
            f.write(json.dumps(logged[-1]) + "\n")
    wandb.finish()


if __name__ == "__main__":
    sys.exit(main())
