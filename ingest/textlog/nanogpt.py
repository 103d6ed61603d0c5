"""modded-nanogpt's `step:` lines: `step:125/1750 val_loss:4.2 train_time:1234ms step_avg:9.87ms`.

The unit glued to a value (`ms`, `%`) is dropped; the key names the series.
"""

from __future__ import annotations

import re

from ingest.lines import NUM
from ingest.textlog.machine import Dialect, TextParser

STEP = re.compile(r"^step:(?P<step>\d+)/(?P<total>\d+)(?P<kv>(?: [A-Za-z_]+:\S+)+)\s*$")
KV = re.compile(rf" (?P<key>[A-Za-z_]+):(?P<val>{NUM})(?P<unit>[A-Za-z%]*)")


def values(p: TextParser, line: str) -> str | None:
    if not (line.startswith("step:") and (m := STEP.match(line))):
        return None
    p.at_step(int(m["step"]))
    for kv in KV.finditer(m["kv"]):
        p.point(kv["key"], float(kv["val"]))
    return "nanogpt_step"


DIALECT = Dialect("nanogpt", sniff=(STEP,), triggers=("step",), values=values)
