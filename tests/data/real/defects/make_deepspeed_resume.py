"""A DeepSpeed run killed right after its step-150 checkpoint and resumed in the same folder
(issue #24, defect 11), written with sample_runs/generate.py's own DeepSpeed trainer.

The spec is `deepspeed_resumed_after_kill`'s (fp16, ZeRO-1, on the CPU; a checkpoint every 50
steps) with the SIGKILL moved to step 150: the first process saves `ckpt/global_step150/` and
dies before step 151; a second process (a job scheduler's restart) calls
`engine.load_checkpoint("ckpt")` and carries on from 151 to 400. Its console shows `Begin Load
checkpoint from ckpt/global_step150/...` and, unlike a kill between checkpoints, no step is
logged twice.

Run: OMP_NUM_THREADS=1 python make_deepspeed_resume.py OUT_DIR   (needs deepspeed, torch)
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

SAMPLE_RUNS = Path(__file__).resolve().parents[4] / "sample_runs"
sys.path.insert(0, str(SAMPLE_RUNS))

import generate  # noqa: E402  sample_runs/generate.py: the corpus' own trainers

NAME = "deepspeed_resumed_after_ckpt150"
SPEC = dataclasses.replace(
    next(s for s in generate.SPECS if s.name == "deepspeed_resumed_after_kill"), name=NAME, bugs={"kill_at": 150}
)


def worker(run: Path, console: str, *args: str) -> None:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "DS_ACCELERATOR": "cpu",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29561",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
    }
    with open(run / console, "w") as out:
        cmd = [sys.executable, __file__, "--worker", str(run), *args]
        subprocess.run(cmd, cwd=run, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)


def main() -> None:
    if sys.argv[1] == "--worker":
        os.chdir(sys.argv[2])
        generate.deepspeed_worker(SPEC, "--resume" in sys.argv[3:])
        return
    run = Path(sys.argv[1]) / NAME
    run.mkdir(parents=True)
    worker(run, "stdout.log")
    worker(run, "resume.stdout.log", "--resume")
    generate.drop_weights(run)


if __name__ == "__main__":
    main()
