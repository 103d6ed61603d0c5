"""Megatron(-DeepSpeed, -LM) iteration and validation lines:
` iteration      100/  500000 | consumed samples: ... | lm loss: 2.1E+00 | ...` and
`validation loss at iteration 100 | lm loss value: ... | lm loss PPL: ... |`.

Fragments never produce values: a field needs `iteration N/ M |` before it; an iteration line
cut mid-field keeps its complete fields and is reported.
"""

from __future__ import annotations

import re

from ingest.base import Problem
from ingest.lines import NUM
from ingest.textlog.machine import Dialect, TextParser

ITERATION = re.compile(
    r"^\s*(?:\[default\d+\]:\s*)?(?:\[(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)?)\]\s*)?"
    r"iteration\s+(?P<iter>\d+)/\s*(?P<train_iters>\d+) \|(?P<rest>.*)$"
)
FIELD = re.compile(rf"\s*(?P<key>[^|:]+?):\s+(?P<val>{NUM})\s*\|")
VALIDATION = re.compile(r"validation loss at (?P<where>.*?) \| (?P<rest>.*)$")
VALIDATION_FIELD = re.compile(rf"(?P<key>[^|]+?) (?P<kind>value|PPL): (?P<val>{NUM})\s*\|")


def values(p: TextParser, line: str) -> str | None:
    if "iteration" not in line:
        return None
    if m := ITERATION.match(line):
        return _iteration(p, m)
    if m := VALIDATION.search(line):
        return _validation(p, m)
    return None


def _iteration(p: TextParser, m: re.Match) -> str:
    it = int(m["iter"])
    p.at_step(it)
    rest, fields = m["rest"], {}
    pos = 0
    while fm := FIELD.match(rest, pos):
        fields[fm["key"].strip()] = float(fm["val"])
        pos = fm.end()
    tail = rest[pos:].strip()
    for k, v in fields.items():
        p.point(k, v, it)
    if tail:
        p.problems.append(
            Problem(
                p.line,
                "truncated_line",
                f"line {p.line}: iteration {it} ends mid-field ({tail!r}); kept {len(fields)} complete fields",
            )
        )
    elif "lm loss" not in fields:
        p.add_event(
            it,
            "nan_window",
            f"iteration {it}: no lm loss (every iteration in the window skipped or NaN)",
            {"fields": fields},
        )
    return "megatron_iteration"


def _validation(p: TextParser, m: re.Match) -> str:
    where = re.search(r"iteration (\d+)", m["where"])
    step = int(where[1]) if where else p.step
    for fm in VALIDATION_FIELD.finditer(m["rest"] + "|" if not m["rest"].endswith("|") else m["rest"]):
        key = fm["key"].strip().lstrip("| ").strip()
        p.point(f"validation/{key}" + (" PPL" if fm["kind"] == "PPL" else ""), float(fm["val"]), step)
    return "megatron_validation"


DIALECT = Dialect("megatron", sniff=(ITERATION,), triggers=("iteration",), values=values)
