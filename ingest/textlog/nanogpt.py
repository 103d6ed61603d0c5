"""nanoGPT consoles.

- modded-nanogpt's `step:` lines: `step:125/1750 val_loss:4.2 train_time:1234ms step_avg:9.87ms`;
  the unit glued to a value (`ms`, `%`) is dropped, the key names the series.
- karpathy/nanoGPT's `train.py`: `iter 70: loss 3.0928, time 343.78ms[, mfu 0.05%]` every
  log_interval (`loss`, `time_ms`, `mfu`; the `mfu -100.00%` of the first iterations says it is
  not measured yet and is no point), and its evaluation `step 80: train loss 2.95, val loss
  2.99`: `val/loss` as nanoGPT names it in W&B, and the train split's loss estimated at the
  evaluation as `train/loss_estimate` (W&B's `train/loss`): it is no second value of the
  training loss beside the iteration's `loss` at the same step. llama2.c's `train.py` prints the
  same evaluation line.
"""

from __future__ import annotations

import re

from ingest.lines import NUM
from ingest.textlog.machine import Dialect, TextParser

STEP = re.compile(r"^step:(?P<step>\d+)/(?P<total>\d+)(?P<kv>(?: [A-Za-z_]+:\S+)+)\s*$")
KV = re.compile(rf" (?P<key>[A-Za-z_]+):(?P<val>{NUM})(?P<unit>[A-Za-z%]*)")
ITER = re.compile(
    rf"^iter (?P<step>\d+): loss (?P<loss>{NUM}), time (?P<ms>{NUM})ms(?:, mfu (?P<mfu>{NUM})%)?\s*$"
)
EVAL = re.compile(rf"^step (?P<step>\d+): train loss (?P<train>{NUM}), val loss (?P<val>{NUM})\s*$")
MFU_UNKNOWN = -100.0  # nanoGPT's running MFU before its first estimate (-1.0, printed as a percent)


def mfu(text: str | None) -> float | None:
    value = None if text is None else float(text)
    return None if value == MFU_UNKNOWN else value


def values(p: TextParser, line: str) -> str | None:
    if line.startswith("step:") and (m := STEP.match(line)):
        p.at_step(int(m["step"]))
        for kv in KV.finditer(m["kv"]):
            p.point(kv["key"], float(kv["val"]))
        return "nanogpt_step"
    if line.startswith("iter ") and (m := ITER.match(line)):
        p.at_step(int(m["step"]))
        p.point("loss", float(m["loss"]))
        p.point("time_ms", float(m["ms"]))
        p.point("mfu", mfu(m["mfu"]))
        return "nanogpt_iter"
    if line.startswith("step ") and (m := EVAL.match(line)):
        p.at_step(int(m["step"]))
        p.point("train/loss_estimate", float(m["train"]))
        p.point("val/loss", float(m["val"]))
        return "nanogpt_eval"
    return None


DIALECT = Dialect("nanogpt", sniff=(STEP, ITER, EVAL), triggers=("step", "iter"), values=values)
