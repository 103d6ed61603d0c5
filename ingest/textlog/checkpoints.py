"""Where a run continues from: checkpoint saves and loads (DeepSpeed's, Megatron's, HF's
paths, nanoGPT's `saving checkpoint to out`), and RECOVERY TRIGGERED lines of a recovery script
(`[step] RECOVERY TRIGGERED: pattern - {changes}`). The lineage is built from these events and
the run's checkpoints on disk."""

from __future__ import annotations

import ast
import re

from ingest.textlog.machine import Dialect, TextParser

RECOVERY = re.compile(r"\[(?P<step>\d+)\] RECOVERY TRIGGERED: (?P<pattern>\S+) - (?P<changes>\{.*\})\s*$")
# one per save in every DeepSpeed version ("... is ready now" is gone in 0.19)
SAVED = re.compile(r"Saving model checkpoint: (?P<path>\S+)|^saving checkpoint to (?P<folder>\S+)")  # nanoGPT
STEP_IN_PATH = re.compile(r"global_step(\d+)|checkpoint-(\d+)|iter_0*(\d+)|(?:ckpt|step)[_-]?(\d+)")
LOADED = re.compile(
    r"(?:Begin Load checkpoint from|[Ll]oading (?:model )?checkpoint(?: from)?:?)\s+(?P<path>\S+)"
)


def _step_in(path: str) -> int | None:
    gs = STEP_IN_PATH.search(path)
    return int(next(g for g in gs.groups() if g)) if gs else None


def _checkpoint_of(path: str) -> str:
    """The checkpoint a loaded file belongs to: its path up to the part that names the step
    (`ckpt/global_step150` of `ckpt/global_step150/mp_rank_00_model_states.pt`), else the path."""
    parts = path.split("/")
    at = next((i for i, part in enumerate(parts) if STEP_IN_PATH.search(part)), len(parts) - 1)
    return "/".join(parts[: at + 1])


def run_event(p: TextParser, line: str) -> str | None:
    if "RECOVERY TRIGGERED" in line and (m := RECOVERY.search(line)):
        try:
            changes = ast.literal_eval(m["changes"])
        except (ValueError, SyntaxError):
            changes = m["changes"]
        p.add_event(int(m["step"]), "recovery", line.strip(), {"pattern": m["pattern"], "changes": changes})
        return "recovery"
    if "aving " in line and (m := SAVED.search(line)):
        path = m["path"] or m["folder"]
        step = _step_in(path)
        p.add_event(p.step if step is None else step, "checkpoint", line.strip(), {"path": path})
        return "checkpoint"
    if "heckpoint" in line and (m := LOADED.search(line)):
        path = m["path"].rstrip(".")  # DeepSpeed ends it with "..."
        step, checkpoint = _step_in(path), _checkpoint_of(path)
        # one load reads several files of one checkpoint (DeepSpeed 0.19: the model states twice,
        # then the optimizer's): one resume, until a step line says training went on
        if p.last_load == [checkpoint, p.step]:
            return "checkpoint_load"
        p.last_load = [checkpoint, p.step]
        p.add_event(step, "resume", line.strip(), {"path": path, "checkpoint": checkpoint})
        p.checkpoint_loaded(step)
        return "checkpoint_load"
    return None


DIALECT = Dialect("checkpoints", sniff=(RECOVERY,), triggers=("RECOVERY", "heckpoint"), event=run_event)
