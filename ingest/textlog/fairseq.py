"""fairseq's console (`fairseq.logging` with `--log-format simple`): `YYYY-MM-DD HH:MM:SS |
LEVEL | name | msg`, where train_inner messages carry `key=value, ...` (the step is
`num_updates`) and train/valid epoch summaries `| key value |` fields.
"""

from __future__ import annotations

import re

from ingest.lines import NUM, to_float
from ingest.textlog.machine import Dialect, TextParser

LINE = re.compile(
    r"^(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) \| (?P<level>[A-Z]+) \| (?P<name>[\w.]+) \| (?P<msg>.*)$"
)
INNER = re.compile(r"^epoch (?P<epoch>\d+):\s+(?P<i>\d+) / (?P<n>\d+) (?P<kv>.*)$")
KV = re.compile(r"(?P<key>[\w/]+)=(?P<val>[^,\s]+)")
EPOCH = re.compile(rf"\| (?P<key>[\w/]+) (?P<val>{NUM})(?= \||\s*$)")


def values(p: TextParser, line: str) -> str | None:
    if not (" | " in line and (m := LINE.match(line))):
        return None
    msg = m["msg"]
    if inner := INNER.match(msg):
        kv = {k: to_float(v) for k, v in KV.findall(inner["kv"])}
        if kv.get("num_updates") is not None:
            p.at_step(int(kv["num_updates"]))
        for k, v in kv.items():
            if k != "num_updates":
                p.point(k, v)
        return "fairseq_train_inner"
    if m["name"] in ("train", "valid") and msg.startswith("epoch"):
        for fm in EPOCH.finditer(msg):
            key = fm["key"]
            p.point(key if key.startswith(m["name"]) else f"{m['name']}/{key}", float(fm["val"]))
        return "fairseq_epoch"
    return None


DIALECT = Dialect("fairseq", sniff=(LINE,), triggers=(r" \| ",), values=values)
