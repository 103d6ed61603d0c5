"""The trainers of the committed runs and of the corpus: the plain PyTorch loop, the HF Trainer,
TRL's SFTTrainer, Keras 3 and DeepSpeed (those in their own process: `python trainers.py
--worker NAME`), and `generate_run`, which picks the one a spec names."""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from lightning_trainer import run_lightning
from moe import run_moe
from specs import RECOVERY, SPEC_ENV, SPECS, Spec
from training import Loggers, apply_bugs, first_step, lr_at, make_optimizer, rss_gb, save_checkpoint


def train_loop(
    spec: Spec,
    run: Path,
    resume: tuple[Path, int] | None = None,
    text_name: str = "stdout.log",
    parent: dict | None = None,
) -> None:
    """Plain PyTorch training with the guides' instrumentation, in the spec's model, optimizer,
    precision, batch size, logging interval and tag names."""
    import torch
    from data import sequences, vocab_size
    from model import SEQ, build_model, layer_grad_norms

    torch.manual_seed(spec.seed)
    train, evalset = sequences(spec.dataset, spec.train_size, spec.seed)
    model = build_model(spec.arch, spec.d_model, spec.layers, spec.heads, vocab_size(spec.dataset), SEQ)
    opt = make_optimizer(spec, model.parameters())
    # Megatron-style large initial scale: the first steps overflow until the scale settles
    scaler = (
        torch.amp.GradScaler("cpu", init_scale=2.0**24, growth_interval=100)
        if spec.precision == "fp16"
        else None
    )
    start = 0
    logs = Loggers(run, spec.writers, text_name, spec.tags)
    if resume:
        state = torch.load(resume[0])
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = resume[1]
        logs.say(f"Loading checkpoint from {resume[0].relative_to(run.parent)}")
    g = torch.Generator().manual_seed(spec.seed * 1000 + start)
    leak: list = []
    frozen: list = []
    nan_seen = None
    losses: list[float] = []
    b = spec.bugs
    for step in range(start, spec.steps):
        if b.get("kill_at") == step and not resume:
            logs.close()
            return  # the process is gone: no final save, no summary
        frozen = apply_bugs(spec, model, step, frozen, leak)
        for grp in opt.param_groups:
            grp["lr"] = lr_at(spec, step)
        t0 = time.perf_counter()
        batch = train[torch.randint(0, len(train), (spec.batch,), generator=g)]
        if b.get("bad_batch") == step:  # one corrupt batch (uniform random tokens): a one-step spike
            batch = torch.randint(0, vocab_size(spec.dataset), batch.shape, generator=g)
        grad_norm, loss = loop_step(spec, model, opt, scaler, batch)
        layer_norms = layer_grad_norms(model)
        with torch.no_grad():
            for p in frozen:
                p.mul_(b["freeze_decay"][2])
        dt = time.perf_counter() - t0
        losses.append(loss)
        last = step == spec.steps - 1
        is_eval = step % spec.eval_every == 0 or last
        if not math.isfinite(loss) and nan_seen is None:
            nan_seen = step  # a watchdog stops the job 20 steps after the first NaN (fp16: the scale's floor)
        stop_nan = nan_seen is not None and step >= nan_seen + 20 and scaler is None
        stop_scale = scaler is not None and scaler.get_scale() < MIN_LOSS_SCALE
        if step % spec.log_every == 0 or is_eval or stop_nan or stop_scale:  # the step it stops at too
            metrics = {
                "train/loss": sum(losses) / len(losses),
                "train/lr": lr_at(spec, step),
                "train/grad_norm": grad_norm,
                **layer_norms,
                **model.stats,
                "throughput/tokens_per_sec": batch[:, :-1].numel() / dt,
                "memory/rss_gb": rss_gb(),
            }
            if scaler is not None:
                metrics["train/loss_scale"] = scaler.get_scale()
            if is_eval:
                with torch.no_grad(), autocast(spec):
                    metrics["eval/loss"] = float(model(evalset[:, :-1], evalset[:, 1:])["loss"])
            logs.log(step, spec.steps, metrics)
            losses = []
        if step % 50 == 0 and step > start:
            save_checkpoint(model, opt, run, spec, step, parent)
        if stop_nan:
            logs.say(f"watchdog: loss is NaN since step {nan_seen}; stopping")
            break
        if stop_scale:
            logs.say(
                f"step {step}: loss scale {scaler.get_scale():g} fell below its minimum {MIN_LOSS_SCALE:g}; stopping"
            )
            break
    logs.close()


MIN_LOSS_SCALE = 1.0  # the plain loop stops there, as DeepSpeed's min_loss_scale does


def autocast(spec: Spec):
    """bf16 / fp16 autocast on the CPU for the spec's precision (a no-op context for fp32)."""
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(spec.precision)
    return torch.autocast("cpu", dtype=dtype, enabled=dtype is not None)


def loop_step(spec: Spec, model, opt, scaler, batch) -> tuple[float, float]:
    """One optimizer step: (grad norm before clipping, loss). With fp16 the GradScaler skips a
    step whose gradients overflow (its grad norm is then Inf) and halves the scale."""
    import torch

    with autocast(spec):
        out = model(batch[:, :-1], batch[:, 1:])
    opt.zero_grad(set_to_none=True)
    if scaler is None:
        out["loss"].backward()
    else:
        scaler.scale(out["loss"]).backward()
        scaler.unscale_(opt)
    params = [p for p in model.parameters() if p.grad is not None]
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, spec.clip if spec.clip > 0 else float("inf")))
    if scaler is None:
        opt.step()
    else:
        scaler.step(opt)
        scaler.update()
    return grad_norm, float(out["loss"].detach())


def run_resumed_after_kill(spec: Spec, run: Path) -> None:
    """Killed at bugs["kill_at"], resumed in the same folder from the checkpoint before it."""
    train_loop(spec, run)
    time.sleep(1.1)  # a new writer: a later file name and wall time, as after a real restart
    ckpt = spec.bugs["kill_at"] // 50 * 50
    train_loop(spec, run, resume=(run / f"checkpoints/ckpt_{ckpt}.pt", ckpt), text_name="resume.stdout.log")


def run_recovery(parent_run: Path, run: Path) -> None:
    """The guides' auto-recovery: roll back to the last checkpoint before the alarm, change hparams."""
    src = parent_run / "checkpoints/ckpt_100.pt"
    changes = {
        "lr": RECOVERY.lr,
        "warmup": 0.01,
        "weight_decay": RECOVERY.weight_decay,
        "clip": RECOVERY.clip,
    }
    alarm_step = first_step(parent_run / "metrics.jsonl", lambda r: r.get("attn_entropy", 9) < 0.3)
    (run / "recovery.log").write_text(f"[{alarm_step}] RECOVERY TRIGGERED: P1 - {changes}\n")
    train_loop(
        RECOVERY,
        run,
        resume=(src, 100),
        parent={
            "parent_run": parent_run.name,
            "parent_step": 100,
            "parent_sha256": json.loads(src.with_suffix(".json").read_text())["sha256"],
        },
    )


# ---------------------------------------------------------------------------------------------
def run_hf(spec: Spec, run: Path) -> None:
    """The HF Trainer on the same model: trainer_state.json, checkpoint-N/, runs/<stamp>/. A run
    of the diverse corpus (spec.family) brings its own model, data, optimizer and schedule; its
    bugs act through a callback."""
    import torch
    from data import sequences, vocab_size
    from model import SEQ, build_model
    from transformers import Trainer, TrainerCallback, TrainingArguments

    torch.manual_seed(spec.seed)

    class Seqs(torch.utils.data.Dataset):
        def __init__(self, data):
            self.data = data

        def __len__(self):
            return len(self.data)

        def __getitem__(self, i):
            return {"input_ids": self.data[i, :-1], "labels": self.data[i, 1:]}

    class Bugs(TrainerCallback):
        """The spec's bugs at their steps (the loop's apply_bugs), frozen parameters decaying."""

        frozen: list = []
        leak: list = []

        def on_step_begin(self, args, state, control, **kw):
            self.frozen = apply_bugs(spec, model, state.global_step, self.frozen, self.leak)

        def on_step_end(self, args, state, control, **kw):
            with torch.no_grad():
                for p in self.frozen:
                    p.mul_(spec.bugs["freeze_decay"][2])

    model = build_model(spec.arch, spec.d_model, spec.layers, spec.heads, vocab_size(spec.dataset), SEQ)
    optimizers = (None, None)
    if spec.bugs or spec.family:  # the run's own optimizer and schedule (with its bug), a LambdaLR
        opt = make_optimizer(spec, model.parameters())
        optimizers = (opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(spec, s) / spec.lr))
    args = TrainingArguments(
        **{
            "output_dir": str(run),
            "max_steps": spec.steps,
            "per_device_train_batch_size": spec.batch,
            "learning_rate": spec.lr,
            "weight_decay": spec.weight_decay,
            "warmup_steps": 20,
            "lr_scheduler_type": "cosine",
            "logging_steps": 5,
            "eval_strategy": "steps",
            "eval_steps": spec.eval_every,
            "save_steps": 100,
            "save_total_limit": 2,
            "report_to": ["tensorboard"],
            "seed": spec.seed,
            "use_cpu": True,
            "dataloader_num_workers": 0,
            "max_grad_norm": spec.clip,
            "disable_tqdm": True,
            **spec.hf_args,
        }
    )
    train, evaldata = sequences(spec.dataset, spec.train_size, spec.seed)
    evalset = Seqs(evaldata)
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=Seqs(train),
        eval_dataset=evalset,
        optimizers=optimizers,
        callbacks=[Bugs()] if spec.bugs else [],
    )
    trainer.train()
    trainer.save_state()
    splits = [("train", trainer.state.log_history[-1])]
    if spec.console:  # the example scripts' closing steps: final eval and predict, printed and saved
        predict = trainer.predict(evalset, metric_key_prefix="predict")
        splits += [("eval", trainer.evaluate()), ("predict", predict.metrics)]
    for split, metrics in splits:
        if spec.console:
            trainer.log_metrics(split, metrics)
        trainer.save_metrics(split, metrics)


def run_trl(spec: Spec, run: Path) -> None:
    """TRL's SFTTrainer on the same language: a tiny GPT-2 built from its config and a word-level
    tokenizer built in memory (nothing downloaded); its console prints the log dicts, no step."""
    import torch
    from datasets import Dataset
    from model import VOCAB, make_language, sample_sequences
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
    from trl import SFTConfig, SFTTrainer

    torch.manual_seed(spec.seed)
    words = ["<pad>", "<eos>", "<unk>"] + [f"t{i}" for i in range(VOCAB)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    chain = make_language(1234)

    def texts(n: int, seed: int) -> Dataset:
        return Dataset.from_dict(
            {"text": [" ".join(f"t{t}" for t in row) for row in sample_sequences(chain, n, seed).tolist()]}
        )

    config = GPT2Config(
        vocab_size=len(words),
        n_positions=64,
        n_embd=spec.d_model,
        n_layer=2,
        n_head=2,
        bos_token_id=1,
        eos_token_id=1,
    )
    trainer = SFTTrainer(
        model=GPT2LMHeadModel(config),
        args=SFTConfig(
            output_dir=str(run),
            num_train_epochs=2,
            per_device_train_batch_size=16,
            learning_rate=spec.lr,
            weight_decay=spec.weight_decay,
            warmup_steps=10,
            logging_steps=5,
            eval_strategy="steps",
            eval_steps=spec.eval_every,
            save_steps=50,
            report_to=["tensorboard"],
            seed=spec.seed,
            use_cpu=True,
            dataloader_num_workers=0,
            disable_tqdm=True,
        ),
        train_dataset=texts(spec.train_size, spec.seed),
        eval_dataset=texts(64, 999),
        processing_class=tokenizer,
    )
    trainer.train()
    trainer.save_state()


def run_keras(spec: Spec, run: Path) -> None:
    """Keras 3 (torch backend) on the same language, next-token classification, fitted three times
    (as in a notebook) into one CSVLogger file with append=True: its epoch column restarts at 0."""
    os.environ["KERAS_BACKEND"] = "torch"
    import keras
    from model import VOCAB, make_language, sample_sequences

    keras.utils.set_random_seed(spec.seed)
    chain = make_language(1234)
    train = sample_sequences(chain, spec.train_size, spec.seed).numpy()
    evalset = sample_sequences(chain, 256, 999).numpy()
    model = keras.Sequential(
        [
            keras.Input((None,), dtype="int32"),
            keras.layers.Embedding(VOCAB, spec.d_model),
            keras.layers.Dense(VOCAB),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.AdamW(spec.lr, weight_decay=spec.weight_decay),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    for _ in range(3):
        model.fit(
            train[:, :-1],
            train[:, 1:],
            batch_size=64,
            epochs=spec.steps,
            validation_data=(evalset[:, :-1], evalset[:, 1:]),
            callbacks=[  # the lr callback puts learning_rate into the logs the CSVLogger writes
                keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.3, patience=1, min_delta=1e-3),
                keras.callbacks.CSVLogger(str(run / "training.log"), append=True),
            ],
            verbose=0,
        )


# ---------------------------------------------------------------------------------------------
DS_CONFIG = {
    "train_batch_size": 16,
    "train_micro_batch_size_per_gpu": 16,
    "steps_per_print": 10,
    "gradient_clipping": 1.0,
    "fp16": {
        "enabled": True,
        "initial_scale_power": 16,
        "loss_scale_window": 50,
        "hysteresis": 2,
        "min_loss_scale": 1,
    },
    "zero_optimization": {"stage": 1},
    "csv_monitor": {"enabled": True, "output_path": "monitor_csv", "job_name": "job"},
    "tensorboard": {"enabled": True, "output_path": "monitor_tb", "job_name": "job"},
    "log_level": "info",
}


def run_worker(spec: Spec, run: Path, console: str, *args: str) -> None:
    """The trainer in its own process (trainers.py --worker), its console output is the log."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if spec.trainer == "deepspeed":  # single-process on the CPU
        env |= {
            "DS_ACCELERATOR": "cpu",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(29500 + spec.seed),
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
        }
    with open(run / console, "w") as out:
        subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--worker", spec.name, *args],
            cwd=run,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )


def run_deepspeed(spec: Spec, run: Path) -> None:
    run_worker(spec, run, "stdout.log")
    if "kill_at" in spec.bugs:  # a new process, as a job scheduler restarts it
        run_worker(spec, run, "resume.stdout.log", "--resume")


def deepspeed_worker(spec: Spec, resume: bool) -> None:
    import deepspeed
    import torch
    from data import sequences, vocab_size
    from deepspeed.accelerator import get_accelerator
    from model import SEQ, build_model

    # the CPU accelerator reports fp16 unsupported; its kernels run fp16 fine for this model
    get_accelerator().is_fp16_supported = lambda: True
    torch.manual_seed(spec.seed)
    config = {k: v for k, v in {**ds_config_for(spec), **spec.ds_config}.items() if v is not None}
    Path("ds_config.json").write_text(json.dumps(config, indent=2))

    class LossOnly(torch.nn.Module):
        """DeepSpeed's monitor records the forward's return value when it is the loss tensor."""

        def __init__(self, lm):
            super().__init__()
            self.lm = lm

        def forward(self, x, y):
            return self.lm(x, y)["loss"]

    lm = build_model(spec.arch, spec.d_model, spec.layers, spec.heads, vocab_size(spec.dataset), SEQ)
    opt = make_optimizer(spec, lm.parameters())
    engine, opt, _, _ = deepspeed.initialize(model=LossOnly(lm), optimizer=opt, config=config)
    start = 0
    if resume:
        engine.load_checkpoint("ckpt")  # the 'latest' tag
        start = engine.global_steps
    train = sequences(spec.dataset, spec.train_size, spec.seed)[0]
    g = torch.Generator().manual_seed(spec.seed + 1000 * start)  # a resumed process reseeds its data order
    logs = Loggers(Path("."), tuple(w for w in spec.writers if w == "jsonl"), scheme=spec.tags)
    losses: list[float] = []
    for step in range(start, spec.steps):
        if spec.bugs.get("kill_at") == step and not resume:
            os.kill(os.getpid(), signal.SIGKILL)  # no clean exit: buffers are lost, as on a node failure
        for grp in opt.param_groups:
            grp["lr"] = lr_at(spec, step)
        for _ in range(engine.gradient_accumulation_steps()):
            batch = train[torch.randint(0, len(train), (spec.batch,), generator=g)]
            loss = engine(batch[:, :-1], batch[:, 1:])
            engine.backward(loss)
            engine.step()
            losses.append(float(loss.detach().float()))
        last_loss = losses[-1]
        diverged = not math.isfinite(last_loss) and "fp16" not in config  # fp16 stops at its minimum scale
        if engine.global_steps % spec.log_every == 0 or step == spec.steps - 1 or diverged:
            grad_norm = engine.get_global_grad_norm()
            metrics = {  # DeepSpeed's own step numbering (1-based)
                "train/loss": sum(losses) / len(losses),
                "train/lr": lr_at(spec, step),
                "train/grad_norm": float(grad_norm) if grad_norm is not None else float("nan"),
                **lm.stats,
                "memory/rss_gb": rss_gb(),
            }
            if "fp16" in config:
                metrics["train/loss_scale"] = float(
                    getattr(opt, "cur_scale", getattr(opt, "loss_scale", float("nan")))
                )
            logs.log(engine.global_steps, spec.steps, metrics)
            losses = []
            if logs.jsonl:
                logs.jsonl.flush()
        if engine.global_steps % 50 == 0 and engine.global_steps > 0:
            engine.save_checkpoint("ckpt")
        if diverged:  # the watchdog logs the step it stops at
            print(f"watchdog: loss is not finite at step {engine.global_steps}; stopping", flush=True)
            break


def ds_config_for(spec: Spec) -> dict:
    """DS_CONFIG in the spec's batch size, clipping and precision (fp16 / bf16 / fp32)."""
    config = {
        **DS_CONFIG,
        "train_batch_size": spec.batch,
        "train_micro_batch_size_per_gpu": spec.batch,
        "steps_per_print": max(10, spec.log_every),
        "gradient_clipping": spec.clip,
    }
    if spec.optimizer not in ("adam", "adamw"):  # ZeRO refuses other client optimizers without it
        config["zero_allow_untested_optimizer"] = True
    if spec.precision != "fp16":
        del config["fp16"]
    if spec.precision == "bf16":
        config["bf16"] = {"enabled": True}
    return config


def generate_run(spec: Spec, out: Path) -> None:
    """Train one run into out/<name> with the trainer its spec names."""
    run = out / spec.name
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    t0 = time.time()
    if spec.console:
        run_worker(spec, run, spec.console)
    elif spec.trainer == "hf":
        run_hf(spec, run)
    elif spec.trainer == "keras":
        run_keras(spec, run)
    elif spec.trainer == "deepspeed":
        run_deepspeed(spec, run)
    elif spec.trainer == "loop" and "kill_at" in spec.bugs:
        run_resumed_after_kill(spec, run)
    elif spec.trainer == "moe":
        run_moe(spec, run)
    elif spec.trainer == "lightning":
        run_lightning(spec, run)
    else:
        train_loop(spec, run)
    print(f"{spec.name}: {time.time() - t0:.0f}s", flush=True)


def _worker() -> None:
    """A trainer in its own process (run_worker): its console output is the run's log."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", required=True, help="the run's name")
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args()
    spec = next((s for s in SPECS if s.name == args.worker), None)
    if spec is None:  # a corpus run (corpus.py) passes its spec along
        spec = Spec(**json.loads(os.environ[SPEC_ENV]))
    if spec.trainer == "deepspeed":
        deepspeed_worker(spec, args.resume)
    elif spec.trainer == "trl":
        run_trl(spec, Path.cwd())
    else:
        run_hf(spec, Path.cwd())


if __name__ == "__main__":
    _worker()
