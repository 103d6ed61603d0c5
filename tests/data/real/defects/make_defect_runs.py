"""Writes the real runs behind issue #24's defect reproducers by running the real tools (CPU,
tiny models, fixed seeds; nothing downloaded).

- `d01_checkpoints_output_dir/`: HF `Trainer` with `output_dir="checkpoints"` (and TensorBoard)
  inside the run's folder, as TRL SFT examples and OLMo `save_folder`s do.
- `d06_checkpoint_alone/checkpoint-40/`: that run's `checkpoint-40/` published on its own (the
  weights dropped): a Hub repository whose root is a checkpoint.
- `d08_final_entry/only_final_train_loss/`: HF `Trainer` with `logging_steps` past `max_steps`:
  the only loss in `log_history` is the final summary's `train_loss`.
- `d08_final_entry/trl_sft_last_entry/`: TRL `SFTTrainer` for 23 steps with `logging_steps=5`:
  the last three steps' `entropy`, `mean_token_accuracy`, `num_tokens` arrive only in the final
  summary entry.
- `d09_lfs_pointer/`: d01's output pushed to a git repository whose `.gitattributes` sends
  `*tfevents*` to Git LFS (the Hub default), then cloned with `GIT_LFS_SKIP_SMUDGE=1` (a clone
  without git-lfs): `runs/<stamp>/events.out.tfevents.*` are LFS pointer files.
- `d16_checkpoint_sha_mismatch/`: a torch loop saving `checkpoints/ckpt_<step>.pt` with a
  metadata JSON (step, sha256, size) and a `.tar.zst` archive copy of each; at step 150 it
  saves again under the step-100 name (a "save latest" that reused the wrong path), so the local
  `ckpt_100.pt` no longer matches its metadata or its archive.

Run: OMP_NUM_THREADS=1 python make_defect_runs.py OUT_DIR   (needs torch, transformers, trl,
datasets, tensorboard; git and git-lfs; zstd)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

VOCAB = 48


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sequences(n: int, seed: int, length: int = 24) -> torch.Tensor:
    """A seeded toy language: each token is the previous one plus a small random stride."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, VOCAB, (n, 1), generator=g)
    strides = torch.randint(1, 4, (n, length - 1), generator=g)
    return torch.cat([start, start + strides.cumsum(1)], 1) % VOCAB


class Seqs(torch.utils.data.Dataset):
    def __init__(self, data: torch.Tensor):
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.data[i], "labels": self.data[i]}


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=2))


def hf_run(output_dir: Path, max_steps: int, logging_steps: int, save_steps: int, tensorboard: bool) -> None:
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=str(output_dir),
        max_steps=max_steps,
        per_device_train_batch_size=16,
        learning_rate=3e-3,
        warmup_steps=5,
        logging_steps=logging_steps,
        eval_strategy="steps",
        eval_steps=20,
        save_steps=save_steps,
        report_to=["tensorboard"] if tensorboard else [],
        seed=0,
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=tiny_gpt2(), args=args, train_dataset=Seqs(sequences(2048, 0)), eval_dataset=Seqs(sequences(64, 1))
    )
    trainer.train()
    trainer.save_state()
    trainer.save_metrics("train", trainer.state.log_history[-1])


def drop_weights(folder: Path) -> None:
    """Checkpoint weights and optimizer state are not needed to reproduce anything: metadata only."""
    for p in folder.rglob("*"):
        if p.suffix in (".safetensors", ".bin", ".pt", ".pth") and p.is_file():
            p.unlink()


def d01(out: Path) -> Path:
    run = out / "d01_checkpoints_output_dir"
    hf_run(run / "checkpoints", max_steps=60, logging_steps=5, save_steps=20, tensorboard=True)
    drop_weights(run)
    return run


def d06(out: Path, d01_run: Path) -> None:
    dst = out / "d06_checkpoint_alone" / "checkpoint-40"
    shutil.copytree(d01_run / "checkpoints" / "checkpoint-40", dst)


def d08(out: Path) -> None:
    hf_run(out / "d08_final_entry" / "only_final_train_loss", max_steps=30, logging_steps=1000, save_steps=1000, tensorboard=False)
    drop_weights(out / "d08_final_entry" / "only_final_train_loss")
    from datasets import Dataset
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from trl import SFTConfig, SFTTrainer

    words = ["<pad>", "<eos>", "<unk>"] + [f"t{i}" for i in range(VOCAB)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")

    def texts(n: int, seed: int) -> Dataset:
        rows = sequences(n, seed).tolist()
        return Dataset.from_dict({"text": [" ".join(f"t{t}" for t in row) for row in rows]})

    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=len(words), n_positions=64, n_embd=32, n_layer=2, n_head=2, bos_token_id=1, eos_token_id=1)
    )
    run = out / "d08_final_entry" / "trl_sft_last_entry"
    trainer = SFTTrainer(
        model=model,
        args=SFTConfig(
            output_dir=str(run),
            max_steps=23,
            per_device_train_batch_size=16,
            learning_rate=3e-3,
            logging_steps=5,
            save_steps=1000,
            report_to=[],
            seed=0,
            use_cpu=True,
            dataloader_num_workers=0,
            disable_tqdm=True,
        ),
        train_dataset=texts(512, 0),
        processing_class=tokenizer,
    )
    trainer.train()
    trainer.save_state()
    drop_weights(run)


def git(*args: str, cwd: Path, env: dict | None = None) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, env={**os.environ, **(env or {})}, capture_output=True)


def d09(out: Path, d01_run: Path) -> None:
    """A Hub-style repository of d01's output folder, cloned without git-lfs."""
    work = out / "_lfs_work"
    shutil.copytree(d01_run / "checkpoints", work, ignore=shutil.ignore_patterns("checkpoint-*"))
    ident = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    git("init", "-q", "-b", "main", cwd=work)
    git("lfs", "install", "--local", cwd=work)
    (work / ".gitattributes").write_text("*tfevents* filter=lfs diff=lfs merge=lfs -text\n")
    git("add", "-A", cwd=work)
    git("commit", "-qm", "upload", cwd=work, env=ident)
    clone = out / "d09_lfs_pointer"
    git("clone", "-q", str(work), str(clone), cwd=out, env={"GIT_LFS_SKIP_SMUDGE": "1"})
    shutil.rmtree(clone / ".git")
    shutil.rmtree(work)


def d16(out: Path) -> None:
    run = out / "d16_checkpoint_sha_mismatch"
    folder = run / "checkpoints"
    folder.mkdir(parents=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(0)
    with open(run / "metrics.jsonl", "w") as log:
        for step in range(1, 201):
            x = torch.randn(32, 8, generator=g)
            loss = ((model(x).squeeze(1) - x.sum(1).sin()) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 10 == 0:
                log.write(json.dumps({"step": step, "loss": round(float(loss), 6)}) + "\n")
            if step in (100, 200):
                path = folder / f"ckpt_{step}.pt"
                torch.save({"model": model.state_dict(), "step": step}, path)
                meta = {"step": step, "sha256": sha256(path), "size": path.stat().st_size, "saved_at": time.time()}
                (folder / f"ckpt_{step}.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
                subprocess.run(["tar", "--zstd", "-cf", f"ckpt_{step}.tar.zst", path.name], cwd=folder, check=True)
            if step == 150:  # the bug: "save latest" writes to the last checkpoint's name
                torch.save({"model": model.state_dict(), "step": step}, folder / "ckpt_100.pt")


def main(out: Path, only: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    run = out / "d01_checkpoints_output_dir"
    steps = {"d01": lambda: d01(out), "d06": lambda: d06(out, run), "d09": lambda: d09(out, run), "d08": lambda: d08(out), "d16": lambda: d16(out)}
    for name, make in steps.items():
        if not only or name in only:
            make()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
