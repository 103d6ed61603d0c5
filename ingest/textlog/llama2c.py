"""karpathy/llama2.c `train.py`: `40 | loss 4.3918 | lr 1.000000e-03 | 434.01ms | mfu 0.05%`
every log_interval (`loss`, `lr`, `time_ms`, `mfu`; `mfu -100.00%` is not measured yet and no
point). Its evaluation line (`step 40: train loss X, val loss Y`) is nanoGPT's (`nanogpt.py`).
"""

from __future__ import annotations

import re

from ingest.lines import NUM
from ingest.textlog.machine import Dialect, TextParser
from ingest.textlog.nanogpt import mfu

ITER = re.compile(
    rf"^(?P<step>\d+) \| loss (?P<loss>{NUM}) \| lr (?P<lr>{NUM}) \| (?P<ms>{NUM})ms \| mfu (?P<mfu>{NUM})%\s*$"
)


def values(p: TextParser, line: str) -> str | None:
    if not (line[:1].isdigit() and (m := ITER.match(line))):
        return None
    p.at_step(int(m["step"]))
    p.point("loss", float(m["loss"]))
    p.point("lr", float(m["lr"]))
    p.point("time_ms", float(m["ms"]))
    p.point("mfu", mfu(m["mfu"]))
    return "llama2c_iter"


DIALECT = Dialect("llama2c", sniff=(ITER,), triggers=(r" \| ",), values=values)
