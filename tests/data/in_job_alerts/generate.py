"""Two tiny real training runs whose job carries the guides' in-job detectors, and their labels.

    python tests/data/in_job_alerts/generate.py        # rewrites the runs and labels.toml here

Each run trains a 2-layer MLP (torch, CPU, one thread, seed 0) to regress a fixed random
linear map from noisy inputs, 300 SGD steps, and logs with torch's `SummaryWriter` (tb/):
`train/loss`, `train/grad_norm`. Its in-job detectors are the guides': after 100 steps, a loss
above the mean + 3 std of the last 100 losses prints `[step] LOSS ANOMALY: ...` to the console
(`train.log`) and writes a text summary `ALERT/loss_spike`; a gradient norm above 10 x the
median of the last 100 prints `grad_anomaly_step=<step>`.
- `lr_spike` (failed, kind loss_spike): the lr is multiplied by 60 for steps 150-154 (the
  injected cause); onset: the first step after 100 whose loss exceeds the mean + 6 std of the 20
  steps before it (the physical criterion of sample_runs/labels.py for spikes).
- `noisy_healthy` (healthy): batch size 2 and input noise 1.0; nothing is injected, so every
  alert it raises is a false alarm of the in-job detector.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import torch
from torch.utils.tensorboard import SummaryWriter

HERE = Path(__file__).resolve().parent
STEPS = 300


def train(name: str, batch: int, noise: float, spike: tuple[int, int] | None) -> list[float]:
    out = HERE / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    torch.manual_seed(0)
    target = torch.randn(8, 1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    writer = SummaryWriter(str(out / "tb"))
    losses: list[float] = []
    norms: list[float] = []
    with open(out / "train.log", "w") as console:
        for step in range(STEPS):
            x = torch.randn(batch, 8)
            y = x @ target + noise * torch.randn(batch, 1)
            lr = 0.05 * (60 if spike and spike[0] <= step <= spike[1] else 1)
            for g in opt.param_groups:
                g["lr"] = lr
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")))
            opt.step()
            value = loss.item()
            writer.add_scalar("train/loss", value, step)
            writer.add_scalar("train/grad_norm", norm, step)
            if len(losses) >= 100:
                window = np.array(losses[-100:])
                if value > window.mean() + 3 * window.std():
                    text = f"loss {value:.4f} > mean {window.mean():.4f} + 3 std {window.std():.4f}"
                    print(f"[{step}] LOSS ANOMALY: {text}", file=console)
                    writer.add_text("ALERT/loss_spike", f"step {step}: {text}", step)
                if norm > 10 * float(np.median(norms[-100:])):
                    print(f"grad_anomaly_step={step} grad_norm={norm:.4f}", file=console)
            losses.append(value)
            norms.append(norm)
        print("training finished", file=console)
    writer.close()
    return losses


def spike_onset(losses: list[float]) -> int | None:
    for i in range(100, len(losses)):
        w = np.array(losses[i - 20 : i])
        if losses[i] > w.mean() + 6 * w.std():
            return i
    return None


def main() -> None:
    torch.set_num_threads(1)
    failed = train("lr_spike", batch=32, noise=0.1, spike=(150, 154))
    train("noisy_healthy", batch=2, noise=1.0, spike=None)
    onset = spike_onset(failed)
    (HERE / "labels.toml").write_text(
        "# Written by generate.py: the injected cause and the spike criterion of its docstring.\n\n"
        f'[runs."lr_spike"]\noutcome = "failed"\nonset = {onset}\nkind = "loss_spike"\n'
        'trainer = "torch"\nbatch = "32"\n\n'
        '[runs."noisy_healthy"]\noutcome = "healthy"\ntrainer = "torch"\nbatch = "2"\n'
    )


if __name__ == "__main__":
    main()
