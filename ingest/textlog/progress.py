"""The fallback for progress lines custom training loops print, when no other dialect reads a
line: `key value` pairs separated by `|`, `,`, `;` or spaces, written `key value`, `key: value`
or `key=value`, one of them a step:

    step 120 | loss 2.3141 | lr 3.0e-04 | gnorm 0.88
    step: 120 loss: 2.3141 lr: 3.0e-04 grad_norm: 0.88
    [12:00:01] train.py:88 - step=120, loss=2.3141, lr=3.0e-04

The pairs run to the end of the line (what comes before them, a timestamp or a logger's name, is
no value); a unit glued to a value (`12.5ms`, `43%`) is dropped and `120/1000` is step 120. A
line whose pairs hold no step, or nothing but the step, is not a progress line. It goes last
in DIALECTS: every other dialect's lines are theirs.
"""

from __future__ import annotations

import re

from ingest.lines import NUM
from ingest.textlog.machine import Dialect, TextParser

STEP_KEYS = ("step", "global_step", "iteration", "iter", "batch", "update", "num_updates")
SEP = r"(?:\s*[:=]\s*|\s+)"
PAIR = re.compile(
    rf"(?<![\w/.-])(?P<key>[A-Za-z_][\w./-]*?){SEP}(?P<val>{NUM})(?P<unit>[A-Za-z%]*)(?:\s*/\s*\d+)?"
)
GAP = re.compile(r"[\s|,;]*")  # what may stand between two pairs, and after the last
STEP_PAIR = rf"(?<![\w/.-])(?:{'|'.join(STEP_KEYS)}){SEP}\d+(?:\s*/\s*\d+)?"
SNIFF = re.compile(rf"{STEP_PAIR}[\s|,;]+[A-Za-z_][\w./-]*{SEP}{NUM}")  # a step, then a value
HAS_STEP = re.compile(r"(?:step|iter|batch|update)[a-z_]*[\s:=]+\d")  # wider than STEP_PAIR, and fast


def pairs(line: str) -> list[re.Match]:
    """The pairs that run without a gap to the end of the line."""
    found = list(PAIR.finditer(line))
    run: list[re.Match] = []
    end = len(line)
    for m in reversed(found):
        if not GAP.fullmatch(line, m.end(), end):
            break
        run.append(m)
        end = m.start()
    return run[::-1]


def values(p: TextParser, line: str) -> str | None:
    if not HAS_STEP.search(line):
        return None
    run = pairs(line)
    steps = [m for m in run if m["key"] in STEP_KEYS and m["val"].isdigit()]
    if not steps or len(run) < 2:
        return None
    step = steps[0]
    p.at_step(int(step["val"]))
    for m in run:
        if m is not step:
            p.point(m["key"], float(m["val"]))
    return "progress_line"


# words, not a pattern: every line is searched for the triggers of all dialects at once
DIALECT = Dialect("progress", sniff=(SNIFF,), triggers=("step", "iter", "batch", "update"), values=values)
