"""karpathy/llm.c's `main.log` (llmc/logger.h): `s:N trl:X lr:Y norm:Z` after each step (older
versions `s:N trl:X` alone), `s:N tel:X` at each validation, `s:N eval:X` for HellaSwag. The
keys stay the series' names: `trl` is the training loss, `tel` the validation loss and `norm`
the gradient norm (the metric table maps them so).
"""

from __future__ import annotations

import re

from ingest.lines import NUM
from ingest.textlog.machine import Dialect, TextParser

LINE = re.compile(
    rf"^s:(?P<step>\d+) (?P<key>trl|tel|eval):(?P<val>{NUM})(?: lr:(?P<lr>{NUM}) norm:(?P<norm>{NUM}))?\s*$"
)


def values(p: TextParser, line: str) -> str | None:
    if not (line.startswith("s:") and (m := LINE.match(line))):
        return None
    p.at_step(int(m["step"]))
    p.point(m["key"], float(m["val"]))
    if m["lr"] is not None:
        p.point("lr", float(m["lr"]))
        p.point("norm", float(m["norm"]))
    return f"llmc_{m['key']}"


DIALECT = Dialect("llmc", sniff=(LINE,), triggers=(" trl:", " tel:", " eval:"), values=values)
