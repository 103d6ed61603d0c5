"""A training job's own alert lines, as the guides' in-job detectors print them: a `LOSS ANOMALY`
line (the step it names, `step 120` or `[120]`, else the step in progress) and a
`grad_anomaly_step` line (`grad_anomaly_step=120`, `grad_anomaly_step: 120`). Each becomes an
`in_job_alert` event, which the backtest scores as the in-job detector beside the replayed
rules (TensorBoard `ALERT/...` text summaries become the same events, ingest/tensorboard.py)."""

from __future__ import annotations

import re

from ingest.textlog.machine import Dialect, TextParser

IN_JOB_ALERT = "in_job_alert"
LOSS_ANOMALY = re.compile(r"LOSS ANOMALY")
GRAD_ANOMALY = re.compile(r"\bgrad_anomaly_step\b\s*[=:]?\s*(?P<step>\d+)")
STEP_NAMED = re.compile(r"^\s*\[(?P<bracket>\d+)\]|\bstep\s*[=:]?\s*(?P<word>\d+)", re.IGNORECASE)


def run_event(p: TextParser, line: str) -> str | None:
    if "LOSS ANOMALY" in line:
        m = STEP_NAMED.search(line)
        step = int(m["bracket"] or m["word"]) if m else p.step
        p.add_event(step, IN_JOB_ALERT, line.strip()[:500], {"alert": "loss_anomaly"})
        return IN_JOB_ALERT
    if "grad_anomaly_step" in line and (m := GRAD_ANOMALY.search(line)):
        p.add_event(int(m["step"]), IN_JOB_ALERT, line.strip()[:500], {"alert": "grad_anomaly"})
        return IN_JOB_ALERT
    return None


DIALECT = Dialect(
    "alerts",
    sniff=(LOSS_ANOMALY, GRAD_ANOMALY),
    triggers=("LOSS ANOMALY", "grad_anomaly_step"),
    event=run_event,
)
