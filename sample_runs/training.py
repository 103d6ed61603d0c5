"""What every trainer here shares: the lr schedule with its bugs, the writers, checkpoints, RSS."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import time
from pathlib import Path

from specs import Spec


def lr_at(spec: Spec, step: int) -> float:
    """Warm-up 20 steps, cosine to 10 %, then the run's schedule bugs."""
    base = spec.lr * min(1.0, (step + 1) / 20) * (0.55 + 0.45 * math.cos(math.pi * step / spec.steps))
    b = spec.bugs
    if "lr_growth" in b and step >= b["lr_growth"][0]:
        base *= b["lr_growth"][1] ** (step - b["lr_growth"][0])
    if "lr_burst" in b and b["lr_burst"][0] <= step < b["lr_burst"][1]:
        base *= b["lr_burst"][2]
    if "lr_decay" in b and step >= b["lr_decay"][0]:
        base *= b["lr_decay"][1] ** (step - b["lr_decay"][0])
    return base


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def rss_gb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9


class Loggers:
    """The writers a run uses: torch SummaryWriter, a JSONL file, a key:value stdout log."""

    def __init__(self, run: Path, writers: tuple[str, ...], text_name: str = "stdout.log"):
        self.tb = self.jsonl = self.text = None
        if "tb" in writers:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(run / "tb"))
        if "jsonl" in writers:
            self.jsonl = open(run / "metrics.jsonl", "a")  # noqa: SIM115
        if "text" in writers:
            self.text = open(run / text_name, "a")  # noqa: SIM115

    def log(self, step: int, total: int, metrics: dict[str, float]) -> None:
        if self.tb:
            for k, v in metrics.items():
                self.tb.add_scalar(k, v, step)
        if self.jsonl:
            self.jsonl.write(json.dumps({"step": step, **metrics}) + "\n")
        if self.text and "train/loss" in metrics:
            self.text.write(
                f"step:{step}/{total} train_loss:{metrics['train/loss']:.4f} lr:{metrics['train/lr']:.6g} "
                f"grad_norm:{metrics['train/grad_norm']:.4g}\n"
            )

    def say(self, line: str) -> None:
        if self.text:
            self.text.write(line + "\n")
            self.text.flush()

    def close(self, clean: bool = True) -> None:
        for w in (self.tb, self.jsonl, self.text):
            if w is not None:
                w.flush()
                w.close()


def save_checkpoint(model, opt, run: Path, spec: Spec, step: int, parent: dict | None = None) -> Path:
    import torch

    folder = run / "checkpoints"
    folder.mkdir(exist_ok=True)
    path = folder / f"ckpt_{step}.pt"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, path)
    meta = {
        "step": step,
        "run": spec.name,
        "sha256": sha256(path),
        "size": path.stat().st_size,
        "saved_at": time.time(),
        **(parent or {}),
    }
    (folder / f"ckpt_{step}.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
    return path


def first_step(jsonl: Path, pred) -> int | None:
    for line in jsonl.read_text().splitlines():
        rec = json.loads(line)
        with contextlib.suppress(TypeError, KeyError):
            if pred(rec):
                return rec["step"]
    return None


def drop_weights(run: Path) -> None:
    """Keep the corpus small: weights go, their metadata (with sha256) stays."""
    for p in list(run.rglob("*")):
        if p.is_file() and p.suffix in (".pt", ".pth", ".safetensors", ".bin") and "tb" not in p.parts:
            meta = (
                p.with_name(p.name + ".meta.json")
                if p.suffix != ".pt" or p.parent.name != "checkpoints"
                else None
            )
            if meta is not None:
                meta.write_text(
                    json.dumps(
                        {"file": p.name, "sha256": sha256(p), "size": p.stat().st_size}, sort_keys=True
                    )
                )
            p.unlink()
