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


def scheduled_lr(spec: Spec, step: int) -> float:
    """The run's lr schedule (spec.schedule) after its linear warm-up (spec.warmup steps):
    cosine10 (the committed runs'): cosine over the whole run to 10 % of the peak;
    constant; warmup_cosine: cosine from the end of warm-up to 0 (HF's `cosine`);
    cosine_restarts: cosine to 5 % restarted every third of the run (SGDR warm restarts);
    step: x0.3 at each third of the run."""
    n, w = spec.steps, spec.warmup
    peak = spec.lr * (min(1.0, (step + 1) / w) if w else 1.0)
    if spec.schedule == "constant":
        return peak
    if spec.schedule == "warmup_cosine":
        return peak * 0.5 * (1 + math.cos(math.pi * max(0, step - w) / max(1, n - w)))
    if spec.schedule == "cosine_restarts":
        period = max(1, n // 3)
        return peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * (step % period) / period)))
    if spec.schedule == "step":
        return peak * 0.3 ** (step // max(1, n // 3))
    return peak * (0.55 + 0.45 * math.cos(math.pi * step / n))


def lr_at(spec: Spec, step: int) -> float:
    """The scheduled lr, then the run's schedule bugs."""
    base = scheduled_lr(spec, step)
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


def make_optimizer(spec: Spec, params):
    """The run's optimizer (spec.optimizer) over parameters or parameter groups."""
    import torch

    kind, lr, wd = spec.optimizer, spec.lr, spec.weight_decay
    if kind == "adam":
        return torch.optim.Adam(params, lr=lr)
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=wd)
    if kind == "rmsprop":
        return torch.optim.RMSprop(params, lr=lr, alpha=0.99, weight_decay=wd)
    if kind == "adafactor":
        return torch.optim.Adafactor(params, lr=lr, weight_decay=wd)
    return torch.optim.AdamW(params, lr=lr, weight_decay=wd)


# Tag naming schemes: the name each metric is logged under (the trainers build metrics under the
# "slash" names). "pascal" is the torch tutorials' `Loss/train`; "short" is the old scripts'.
TAG_SCHEMES: dict[str, dict[str, str]] = {
    "slash": {},
    "plain": {
        "train/loss": "loss",
        "train/grad_norm": "grad_norm",
        "train/lr": "lr",
        "eval/loss": "eval_loss",
        "train/loss_scale": "loss_scale",
    },
    "pascal": {
        "train/loss": "Loss/train",
        "train/grad_norm": "Grad/total_norm",
        "train/lr": "LR",
        "eval/loss": "Loss/eval",
        "train/loss_scale": "Scaler/scale",
    },
    "short": {
        "train/loss": "train_loss",
        "train/grad_norm": "gnorm",
        "train/lr": "learning_rate",
        "eval/loss": "val_loss",
        "train/loss_scale": "loss_scale",
    },
    # Lightning's: `grad_norm()`'s total (its LearningRateMonitor logs `lr-<Optimizer>`)
    "lightning": {
        "train/loss": "train_loss",
        "train/grad_norm": "grad_2.0_norm_total",
        "eval/loss": "val_loss",
    },
}
# the keys of the console's `step:N/T key:value` lines (letters and _ only), per scheme
CONSOLE_KEYS: dict[str, dict[str, str]] = {
    "slash": {"train/loss": "train_loss", "train/lr": "lr", "train/grad_norm": "grad_norm"},
    "plain": {"train/loss": "loss", "train/lr": "lr", "train/grad_norm": "grad_norm"},
    "short": {"train/loss": "train_loss", "train/lr": "learning_rate", "train/grad_norm": "gnorm"},
}
CONSOLE_KEYS["pascal"] = CONSOLE_KEYS["lightning"] = CONSOLE_KEYS["slash"]


def tag_name(scheme: str, tag: str) -> str:
    """The name `tag` (a "slash" name) is logged under in `scheme`."""
    return TAG_SCHEMES[scheme].get(tag, tag)


def apply_bugs(spec: Spec, model, step: int, frozen: list, leak: list) -> list:
    """The config changes a bug makes at its step; returns the parameters frozen and decaying."""
    import torch

    b = spec.bugs
    if "attn_temperature" in b and step == b["attn_temperature"][0]:
        for blk in model.blocks:
            blk.attn_temperature = b["attn_temperature"][1]
    if "freeze_decay" in b and step == b["freeze_decay"][0]:
        group = b["freeze_decay"][1]
        frozen = model.output_params() if group == "output" else model.embedding_params()
        for p in frozen:
            p.requires_grad_(False)
    if "leak_gb" in b and step == b["leak_gb"][0]:
        leak.append(torch.ones(int(b["leak_gb"][1] * 1e9 / 4)))
    return frozen


class Loggers:
    """The writers a run uses: torch SummaryWriter, a JSONL file, a key:value stdout log; metrics
    are named by the tag scheme (TAG_SCHEMES)."""

    def __init__(
        self, run: Path, writers: tuple[str, ...], text_name: str = "stdout.log", scheme: str = "slash"
    ):
        self.scheme = scheme
        self.tb = self.jsonl = self.text = None
        if "tb" in writers:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(run / "tb"))
        if "jsonl" in writers:
            self.jsonl = open(run / "metrics.jsonl", "a")  # noqa: SIM115
        if "text" in writers:
            self.text = open(run / text_name, "a")  # noqa: SIM115

    def log(self, step: int, total: int, metrics: dict[str, float]) -> None:
        named = {tag_name(self.scheme, k): v for k, v in metrics.items()}
        if self.tb:
            for k, v in named.items():
                self.tb.add_scalar(k, v, step)
        if self.jsonl:
            self.jsonl.write(json.dumps({"step": step, **named}) + "\n")
        if self.text and "train/loss" in metrics:
            keys = CONSOLE_KEYS[self.scheme]
            self.text.write(
                f"step:{step}/{total} {keys['train/loss']}:{metrics['train/loss']:.4f} "
                f"{keys['train/lr']}:{metrics['train/lr']:.6g} "
                f"{keys['train/grad_norm']}:{metrics['train/grad_norm']:.4g}\n"
            )
        if self.text and "eval/loss" in metrics and self.scheme != "slash":  # not in the committed runs
            self.text.write(f"step:{step}/{total} val_loss:{metrics['eval/loss']:.4f}\n")

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
        if (
            p.is_file()
            and p.suffix in (".pt", ".pth", ".safetensors", ".bin", ".ckpt")
            and "tb" not in p.parts
        ):
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
