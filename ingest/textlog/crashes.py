"""How a run died, in any dialect's log: a Python traceback (its exception line names the
crash), CUDA out of memory, an NCCL watchdog timeout."""

from __future__ import annotations

import re

from ingest.textlog.machine import Dialect, TextParser

OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|\bout of memory\b")
NCCL_TIMEOUT = re.compile(r"Watchdog caught collective operation timeout|NCCL.*(?:[Tt]imeout|timed out)")
TRACEBACK = "Traceback (most recent call last):"


def run_event(p: TextParser, line: str) -> str | None:
    if line.startswith(TRACEBACK):
        p.place_pending_at_end()
        p.last_crash = p.add_event(p.step, "crash", "Traceback")
        return "crash"
    if ("memory" in line or "Memory" in line or "ALLOC" in line) and OOM.search(line):
        p.add_event(p.step, "oom", line.strip()[:500])
        return "oom"
    if ("imeout" in line or "timed out" in line) and NCCL_TIMEOUT.search(line):
        p.add_event(p.step, "text", line.strip()[:500], {"reason": "nccl_timeout"})
        return "nccl_timeout"
    return None


def traceback_line(p: TextParser, line: str) -> bool:
    """The first unindented line after a traceback is the exception: it names the crash.
    Returns True when the line was that exception (it is then no record of its own)."""
    if p.last_crash is None:
        return False
    if line.startswith((" ", "\t", TRACEBACK)):
        return line.startswith((" ", "\t"))
    p.last_crash["message"] = line.strip()[:500]
    if OOM.search(line):
        p.last_crash["kind"] = "oom"
    p.last_crash = None
    return True


DIALECT = Dialect(
    "crashes",
    triggers=("Traceback", "emory", "ALLOC", "imeout", "timed out"),
    event=run_event,
    block=traceback_line,
)
