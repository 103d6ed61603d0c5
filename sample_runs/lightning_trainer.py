"""Lightning runs of the diverse corpus: the same models and data through `lightning.Trainer`
on the CPU, logged by Lightning's own CSVLogger (`lightning_logs/version_0/metrics.csv`) or
TensorBoardLogger (writers "csv" / "tb"), its LearningRateMonitor (`lr-<Optimizer>`) and
`gradient_clip_val`; precision "32-true" or "bf16-mixed". The spec's bugs act at their steps
(training.apply_bugs); a watchdog stops the run 20 steps after the first non-finite loss.
"""

from __future__ import annotations

import math
from pathlib import Path

from specs import Spec
from training import apply_bugs, lr_at, make_optimizer, tag_name


def run_lightning(spec: Spec, run: Path) -> None:
    import lightning as L
    import torch
    from data import sequences, vocab_size
    from lightning.pytorch.callbacks import LearningRateMonitor
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
    from lightning.pytorch.utilities import grad_norm
    from model import SEQ, build_model

    L.seed_everything(spec.seed, verbose=False)
    train, evalset = sequences(spec.dataset, spec.train_size, spec.seed)
    lm = build_model(spec.arch, spec.d_model, spec.layers, spec.heads, vocab_size(spec.dataset), SEQ)

    def name(tag: str) -> str:
        return tag_name(spec.tags, tag)

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.lm = lm
            self.frozen: list = []
            self.leak: list = []
            self.nan_since: int | None = None

        def training_step(self, batch, i):
            (seqs,) = batch
            loss = self.lm(seqs[:, :-1], seqs[:, 1:])["loss"]
            self.log(name("train/loss"), loss)
            for k, v in self.lm.stats.items():
                self.log(k, v)
            return loss

        def on_train_batch_start(self, batch, i):
            self.frozen = apply_bugs(spec, self.lm, self.global_step, self.frozen, self.leak)

        def on_before_optimizer_step(self, optimizer):  # before Lightning clips
            self.log(name("train/grad_norm"), grad_norm(self.lm, norm_type=2)["grad_2.0_norm_total"])

        def on_train_batch_end(self, outputs, batch, i):
            with torch.no_grad():
                for p in self.frozen:
                    p.mul_(spec.bugs["freeze_decay"][2])
            if not math.isfinite(float(outputs["loss"])) and self.nan_since is None:
                self.nan_since = self.global_step
            if self.nan_since is not None and self.global_step >= self.nan_since + 20:
                print(f"watchdog: loss is NaN since step {self.nan_since}; stopping", flush=True)
                self.trainer.should_stop = True

        def validation_step(self, batch, i):
            (seqs,) = batch
            self.log(name("eval/loss"), self.lm(seqs[:, :-1], seqs[:, 1:])["loss"])

        def configure_optimizers(self):
            opt = make_optimizer(spec, self.parameters())
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(spec, s) / spec.lr)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    sampler = torch.utils.data.RandomSampler(train, replacement=True, num_samples=spec.steps * spec.batch)
    logger = (
        TensorBoardLogger(str(run), name="lightning_logs", version=0)
        if "tb" in spec.writers
        else CSVLogger(str(run), name="lightning_logs", version=0)
    )
    trainer = L.Trainer(
        max_steps=spec.steps,
        accelerator="cpu",
        devices=1,
        logger=logger,
        callbacks=[LearningRateMonitor(logging_interval="step")],
        log_every_n_steps=spec.log_every,
        val_check_interval=spec.eval_every,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        gradient_clip_val=spec.clip or None,
        precision="bf16-mixed" if spec.precision == "bf16" else "32-true",
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(run),
    )
    data = torch.utils.data.TensorDataset
    trainer.fit(
        Module(),
        torch.utils.data.DataLoader(data(train), batch_size=spec.batch, sampler=sampler),
        torch.utils.data.DataLoader(data(evalset), batch_size=256),
    )
