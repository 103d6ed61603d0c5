"""The OLMo trainer's console (`olmo/train.py`): a header per logged step, then one indented
`name=value` line per metric:

    [2024-04-18 14:24:11] INFO     [olmo.train:729, rank=0] [step=2/739328]
        train/CrossEntropyLoss=10.88
        throughput/device/tokens_per_second=7,456

(since mid-2024: `2024-08-06 09:59:26.181 host:0  olmo.train:908  INFO    [step=1/739328,epoch=0]`).
The names are the series (`train/CrossEntropyLoss`, `optim/total_grad_norm`, ...; thousands
separators dropped), at the header's step and wall time. Metric lines count only after an
OLMo header (an indented `a=b` elsewhere is no metric), read as a block (no trigger word). A killed run ends in a traceback
(`crashes.py`).
"""

from __future__ import annotations

import math
import re

from ingest.textlog.machine import Dialect, TextParser

HEADER = re.compile(r"olmo\.train:\d+.*\[step=(?P<step>\d+)/\d+(?:,epoch=\d+)?\]\s*$")
VALUE = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d*\.?\d+)(?:[eE][-+]?\d+)?|nan|inf|-inf"
METRIC = re.compile(rf"^\s+(?P<name>[A-Za-z][\w/ ().%-]*?)=(?P<val>{VALUE})\s*$")


def values(p: TextParser, line: str) -> str | None:
    if "olmo.train" in line and (m := HEADER.search(line)):
        p.at_step(int(m["step"]))
        p.marks["olmo_wall"] = p.wall if math.isfinite(p.wall) else None  # the header's time, if any
        return "olmo_step"
    return None


def metric_line(p: TextParser, line: str) -> bool:
    """The metrics under a header, a block of their own (offered every line before any dialect)."""
    if "olmo_wall" not in p.marks or line[:1] not in " \t" or not (m := METRIC.match(line)):
        return False
    wall = p.marks["olmo_wall"]
    p.point(m["name"].strip(), float(m["val"].replace(",", "")), wall=math.nan if wall is None else wall)
    p.records += 1
    p.kinds["olmo_metric"] = p.kinds.get("olmo_metric", 0) + 1
    return True


DIALECT = Dialect("olmo", sniff=(HEADER,), triggers=("olmo\\.train",), values=values, block=metric_line)
