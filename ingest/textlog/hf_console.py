"""HF Trainer / TRL console dicts: `{'loss': '1.156', 'grad_norm': ..., 'epoch': '0.84'}`.

They carry no step: with no step line in the file, the k-th training dict is step k x
`logging_steps` (from the run's trainer_state.json, read again once it is known), evaluation
dicts take the step of the last training dict, and the note says the steps were counted. The
Trainer's final summary (`train_loss`, no `loss`) says the run finished.
"""

from __future__ import annotations

import ast
import re

from ingest.lines import to_float
from ingest.textlog.machine import Dialect, TextParser

# anchored (config dumps are dicts too), after at most a logger's prefix (LLaMA-Factory:
# `[INFO|2024-11-26 22:09:01] logging.py:157 >> {'loss': ...}`)
DICT = re.compile(r"^\s*(?:\[[^\]]{1,60}\]\s*[\w.]+:\d+\s*>>\s*)?(?P<d>\{'[A-Za-z_/]+': .*\})\s*$")


def values(p: TextParser, line: str) -> str | None:
    if not ("{'" in line and (m := DICT.match(line))):
        return None
    # bare nan/inf are not Python literals: quote them, to_float reads them back
    text = re.sub(r"(?<![\w'])(-?(?:nan|inf))(?![\w'])", r"'\1'", m["d"])
    try:
        d = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None
    return _console_dict(p, d, line) if isinstance(d, dict) else None


def _console_dict(p: TextParser, d: dict, line: str) -> str:
    """Its step: its own, else the file's step, else counted."""
    if "train_loss" in d and "loss" not in d:  # the Trainer's final summary, printed once
        p.config["console_summary"] = {k: to_float(v) for k, v in d.items()}
        p.add_event(p.step, "finished", line.strip()[:500])
        return "hf_summary"
    step = to_float(d.get("step"))
    if step is not None:
        step = int(step)
    elif not p.explicit and "loss" in d:  # a training log: the k-th is step k x logging_steps
        p.counted += 1
        p.step = step = p.counted * (p.logging_steps or 1)
    for k, v in d.items():
        if k != "step":
            p.point(k, to_float(v), step)
    return "hf_dict"


DIALECT = Dialect("hf_console", sniff=(DICT,), triggers=(r"\{'",), values=values)
