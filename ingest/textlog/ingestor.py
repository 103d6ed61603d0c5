"""The text-log reader: console and text logs in every dialect of `DIALECTS`, one line parser
for all of them, because real logs mix them (a Megatron-DeepSpeed run prints iteration lines
*and* DeepSpeed OVERFLOW notices; an HF run with DeepSpeed prints both kinds of progress)."""

from __future__ import annotations

from pathlib import Path

from ingest.lines import LineIngestor, read_head, strip_line
from ingest.textlog import (
    alerts,
    checkpoints,
    crashes,
    deepspeed,
    fairseq,
    hf_console,
    llama2c,
    llmc,
    loguru,
    megatron,
    nanogpt,
    olmo,
    progress,
    torchtitan,
)
from ingest.textlog.machine import Dialect, TextParser, logging_steps

SNIFF_BYTES = 1 << 20  # the script dump at the top of a nanoGPT log can be long
TEXT_SUFFIXES = (".log", ".txt", ".out", ".err", ".stdout", ".stderr")

# every dialect the reader knows, one line each; a line is offered to them in this order (the
# first that reads a line's values, notice or event takes it; see ingest/textlog/machine.py)
DIALECTS: tuple[Dialect, ...] = (
    checkpoints.DIALECT,
    alerts.DIALECT,
    deepspeed.DIALECT,
    megatron.DIALECT,
    nanogpt.DIALECT,
    llama2c.DIALECT,
    llmc.DIALECT,
    torchtitan.DIALECT,
    olmo.DIALECT,
    fairseq.DIALECT,
    hf_console.DIALECT,
    loguru.DIALECT,
    crashes.DIALECT,
    progress.DIALECT,  # the fallback for generic progress lines: last
)
SNIFF = tuple(p for d in DIALECTS for p in d.sniff)


class TextLogParser(TextParser):
    dialects = DIALECTS


class TextLogIngestor(LineIngestor):
    name = "text_log"
    precedence = 90
    parser = TextLogParser

    def config_used(self, run_config: dict, state: dict) -> str | None:
        return f"logging_steps {logging_steps(run_config)}" if state.get("counted") else None

    def sniff(self, path: Path, head: bytes) -> bool:
        name = path.name.lower().removesuffix(".gz")
        if not (name.endswith(TEXT_SUFFIXES) or "stdout" in name or "stderr" in name):
            return False
        text = read_head(path, SNIFF_BYTES).decode("utf-8", errors="replace")
        lines = [strip_line(line) for line in text.splitlines()]
        return any(p.search(line) for p in SNIFF for line in lines)
