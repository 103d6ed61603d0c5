"""Trainers that log through loguru: `YYYY-MM-DD HH:MM:SS.mmm | LEVEL | module:fn:line - Loss: 2.31`
(optionally `[Rank N] ` before `Loss:`)."""

from __future__ import annotations

import re

from ingest.lines import NUM
from ingest.textlog.machine import Dialect, TextParser

LINE = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{3} \| [A-Z]+\s*\| \S+ - (?P<msg>.*)$")
LOSS = re.compile(rf"(?:\[Rank -?\d+\] )?Loss: (?P<loss>{NUM})\s*$")
LOSS_LINE = re.compile(LINE.pattern[:-1].replace("(?P<msg>.*)", rf"(?:\[Rank -?\d+\] )?Loss: {NUM}\s*") + "$")


def values(p: TextParser, line: str) -> str | None:
    if " - " in line and (m := LINE.match(line)) and (lm := LOSS.search(m["msg"])):
        p.point("loss", float(lm["loss"]))
        return "loguru_loss"
    return None


DIALECT = Dialect("loguru", sniff=(LOSS_LINE,), triggers=(" - ",), values=values)
