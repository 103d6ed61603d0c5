"""torchtitan's console: `[rank0]:[titan] 2025-03-12 11:10:21,511 - root - INFO - step: 22
loss:  6.2250  grad_norm: 1.23  memory:  1.41GiB(1.79%)  tps: 193,831  tflops: 18.36  mfu: 1.86%`
(`grad_norm` since 2025). Series: `loss`, `grad_norm`, `memory_gib` and `memory_pct` (the
accelerator memory torchtitan reports), `tps` (tokens per second per device), `tflops`, `mfu`.

Every rank may print the same step (without a `[rankN]:` filter, each of them): the copies
land on the same step and the last one is current; the others stay in `scalars_all`.
"""

from __future__ import annotations

import re

from ingest.textlog.machine import Dialect, TextParser, line_time

VALUE = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d*\.?\d+)(?:[eE][-+]?\d+)?|nan|inf|-inf"
LINE = re.compile(
    r"^(?:\[rank\d+\]:)?\[titan\] (?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2},\d{3}) - \S+ - [A-Z]+ - "
    r"step:\s*(?P<step>\d+)\s+(?P<rest>loss:.*)$"
)
FIELD = re.compile(rf"(?P<key>[a-z_]+):\s*(?P<val>{VALUE})(?P<unit>GiB\((?P<pct>{VALUE})%\)|%)?")


def values(p: TextParser, line: str) -> str | None:
    if "[titan]" not in line or not (m := LINE.match(line)):
        return None
    p.line_wall(line_time(m["ts"]))
    p.at_step(int(m["step"]))
    for f in FIELD.finditer(m["rest"]):
        key = f["key"]
        if f["unit"] and f["unit"].startswith("GiB"):
            p.point(f"{key}_gib", _number(f["val"]))
            p.point(f"{key}_pct", _number(f["pct"]))
        else:
            p.point(key, _number(f["val"]))
    return "torchtitan_step"


def _number(text: str) -> float:
    return float(text.replace(",", ""))


DIALECT = Dialect("torchtitan", sniff=(LINE,), triggers=(r"\[titan\]",), values=values)
