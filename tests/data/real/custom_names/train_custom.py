"""A small custom training loop (torch, CPU) that logs the way hand-written scripts do.

Trains a 2-layer MLP language model on a seeded synthetic next-token task for 300 steps and
writes, for the same run:

- `jsonl_<key>/metrics.jsonl`: one JSON record per logged step, the step under `<key>`
  (`it`, `iter`, `iteration`, `global_step`, `_step`, `trainer/global_step`, `batch`);
- `tb_tutorial_names/`: a torch `SummaryWriter` with the names of PyTorch's SummaryWriter
  tutorial and of common templates (`Loss/train`, `Loss/val`, `Grad/total_norm`,
  `training/loss_step`, `LR/group0`);
- `console_pipes/stdout.log`, `console_colon/stdout.log`, `console_equals/stdout.log`: the
  progress lines custom loops print (`step 120 | loss 2.3141 | lr 3.0e-04 | gnorm 0.88`,
  `step: 120 loss: 2.3141 ...`, `step=120 loss=2.3141 ...`).

Run: OMP_NUM_THREADS=1 python train_custom.py OUT_DIR   (a few seconds on one core)
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.tensorboard import SummaryWriter

STEP_KEYS = ("it", "iter", "iteration", "global_step", "_step", "trainer/global_step", "batch")
STEPS = 300
LOG_EVERY = 5
EVAL_EVERY = 50
VOCAB, CONTEXT = 32, 4


def make_data(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Next token = (sum of the context) mod VOCAB, with 10% of targets replaced by noise."""
    x = torch.randint(0, VOCAB, (n, CONTEXT), generator=gen)
    y = x.sum(dim=1) % VOCAB
    noise = torch.rand(n, generator=gen) < 0.1
    y[noise] = torch.randint(0, VOCAB, (int(noise.sum()),), generator=gen)
    return x, y


def main(out: Path) -> None:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    train_x, train_y = make_data(8192, gen)
    val_x, val_y = make_data(1024, gen)
    model = nn.Sequential(
        nn.Embedding(VOCAB, 16), nn.Flatten(), nn.Linear(16 * CONTEXT, 64), nn.GELU(), nn.Linear(64, VOCAB)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / STEPS)))
    loss_fn = nn.CrossEntropyLoss()

    jsonl = {}
    for key in STEP_KEYS:
        folder = out / f"jsonl_{key.replace('/', '_')}"
        folder.mkdir(parents=True, exist_ok=True)
        jsonl[key] = open(folder / "metrics.jsonl", "w")
    tb = SummaryWriter(str(out / "tb_tutorial_names"))
    consoles = {}
    for style in ("pipes", "colon", "equals"):
        folder = out / f"console_{style}"
        folder.mkdir(parents=True, exist_ok=True)
        consoles[style] = open(folder / "stdout.log", "w")
    for f in consoles.values():
        f.write(f"training a {sum(p.numel() for p in model.parameters())}-parameter MLP for {STEPS} steps\n")

    for step in range(1, STEPS + 1):
        idx = torch.randint(0, len(train_x), (64,), generator=gen)
        loss = loss_fn(model(train_x[idx]), train_y[idx])
        opt.zero_grad()
        loss.backward()
        gnorm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        lr = opt.param_groups[0]["lr"]
        opt.step()
        sched.step()
        val = None
        if step % EVAL_EVERY == 0:
            with torch.no_grad():
                val = float(loss_fn(model(val_x), val_y))
        if step % LOG_EVERY:
            continue
        lossf = float(loss)
        record = {"loss": round(lossf, 6), "lr": lr, "grad_norm": round(gnorm, 6)}
        if val is not None:
            record["val_loss"] = round(val, 6)
        for key, f in jsonl.items():
            f.write(json.dumps({key: step, **record}) + "\n")
        tb.add_scalar("Loss/train", lossf, step)
        tb.add_scalar("training/loss_step", lossf, step)
        tb.add_scalar("Grad/total_norm", gnorm, step)
        tb.add_scalar("LR/group0", lr, step)
        if val is not None:
            tb.add_scalar("Loss/val", val, step)
        consoles["pipes"].write(f"step {step} | loss {lossf:.4f} | lr {lr:.1e} | gnorm {gnorm:.2f}\n")
        consoles["colon"].write(f"step: {step} loss: {lossf:.4f} lr: {lr:.3e} grad_norm: {gnorm:.3f}\n")
        consoles["equals"].write(f"step={step} loss={lossf:.4f} lr={lr:.3e} grad_norm={gnorm:.3f}\n")
        if val is not None:
            consoles["pipes"].write(f"step {step} | val_loss {val:.4f}\n")
            consoles["colon"].write(f"step: {step} val_loss: {val:.4f}\n")
            consoles["equals"].write(f"step={step} val_loss={val:.4f}\n")
    for f in [*jsonl.values(), *consoles.values()]:
        f.close()
    tb.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
