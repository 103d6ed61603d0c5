"""fairseq's console.

- Since 2020 (`fairseq.logging`, `--log-format simple`): `YYYY-MM-DD HH:MM:SS | LEVEL | name |
  msg`, where train_inner messages carry `key=value, ...` (the step is `num_updates`) and
  train/valid epoch summaries `| key value |` fields.
- Before 2020 (fairseq-py's progress bar): `| epoch 009:   1000 / 2737 loss=6.220, ...,
  num_updates=22897, ...` inside an epoch, `| epoch 009 | loss 6.233 | ... | num_updates 24633`
  at its end, `| epoch 009 | valid on 'valid' subset | valid_loss 6.37 | ...` after it; 2018's
  lines have no num_updates (`| epoch 005  1000 / 8223 loss=2.17 (3.20), ...`, `train loss 2.92`).
  The step is num_updates; without it, an inner line's is the batches trained so far ((epoch -
  1) x batches per epoch + batch) and a summary's the step of the line before it.

Names: inner lines' keys as they are; an epoch summary's `train/<key>` and a validation's
`valid/<key>`, but for keys that name their split already: 2018's `train loss`, `valid loss`,
and validation's `valid_loss` (`train_wall`, the training time, is `train/train_wall`: inner
lines log a `train_wall` of their own).
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
OLD_INNER = re.compile(r"^\| epoch (?P<epoch>\d+):?\s+(?P<i>\d+) / (?P<n>\d+) (?P<kv>.*)$")
OLD_VALID = re.compile(r"^\| epoch \d+ \| valid on '(?P<subset>[^']+)' subset \| (?P<cells>.*)$")
OLD_EPOCH = re.compile(r"^\| epoch \d+ \| (?P<cells>(?!valid on ).*)$")


def values(p: TextParser, line: str) -> str | None:
    if line.startswith("| epoch "):
        return _progress_bar(p, line)
    if not (" | " in line and (m := LINE.match(line))):
        return None
    msg = m["msg"]
    if inner := INNER.match(msg):
        kv = {k: to_float(v) for k, v in KV.findall(inner["kv"])}
        if (updates := kv.get("num_updates")) is not None:
            p.at_step(int(updates))
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


def _progress_bar(p: TextParser, line: str) -> str | None:
    """fairseq-py's lines before 2020."""
    if m := OLD_INNER.match(line):
        kv = {k: to_float(v) for k, v in KV.findall(m["kv"])}
        updates = kv.pop("num_updates", None)
        batches = (int(m["epoch"]) - 1) * int(m["n"]) + int(m["i"])
        p.at_step(batches if updates is None else int(updates))
        for k, v in kv.items():
            p.point(k, v)
        return "fairseq_inner"
    if m := OLD_VALID.match(line):
        _cells(p, m["cells"], m["subset"])
        return "fairseq_valid"
    if m := OLD_EPOCH.match(line):
        _cells(p, m["cells"], "train")
        return "fairseq_epoch"
    return None


def _cells(p: TextParser, cells: str, split: str) -> None:
    """`key value | key value | ...` (keys may hold spaces), num_updates as the step."""
    kv = {}
    for cell in cells.split("|"):
        key, _, value = cell.strip().rpartition(" ")
        if key and (v := to_float(value)) is not None:
            kv[key.strip()] = v
    if (updates := kv.pop("num_updates", None)) is not None:
        p.at_step(int(updates))
    for key, v in kv.items():
        named = key.startswith(f"{split} ") or (split != "train" and key.startswith(f"{split}_"))
        p.point(key if named else f"{split}/{key}", v)


DIALECT = Dialect(
    "fairseq",
    sniff=(LINE, OLD_INNER, OLD_EPOCH),
    triggers=(r" \| ", r"\| epoch "),
    values=values,
)
