"""Which files are logs, and which run each belongs to.

A run is a directory holding log files; its id is its path relative to the PATH given to
ingest (the PATH's own name when the PATH itself is a run). Sources that tools write into
sub-folders of a run attach to that run instead of becoming runs of their own:
- TensorBoard-only folders named like containers (`tb/`, `logs/`, `tensorboard/`, ...),
- HF Trainer's `runs/<Mon DD_HH-MM-SS_host>/` and DeepSpeed's `monitor_tb/<job>/`,
- `add_hparams` sub-folders named by a float timestamp (`1796036286.857561/`),
- TensorBoard-only folders whose parent holds other logs.
In a tree of plain TensorBoard folders (`exp1/`, `exp2/`) each folder is a run, as in
TensorBoard. Checkpoint folders (`checkpoint-N/`, `global_stepN/`, `checkpoints/`) are not runs.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ingest.base import Ingestor
from workbench.store.layout import is_store

CONTAINER_DIRS = {
    "tb",
    "tensorboard",
    "tb_logs",
    "tensorboard_logs",
    "logs",
    "log",
    "monitor_tb",
    "monitor_csv",
}
STAMP_PARENTS = {"runs", "monitor_tb", "monitor_csv"}  # their sub-folders are one run's sources
CHECKPOINT_DIR = re.compile(r"checkpoint-\d+|global_step\d+|checkpoints?|last-checkpoint|ckpts?")
HPARAMS_DIR = re.compile(r"\d{9,11}\.\d+")
HF_STAMP_DIR = re.compile(r"[A-Z][a-z]{2}\d{2}_\d{2}-\d{2}-\d{2}_.+")
HEAD_BYTES = 4096


@dataclass
class Discovery:
    files: list[Found]
    checkpoints: list[tuple[Path, Path]]  # (checkpoint folder or container, its run folder)


@dataclass(frozen=True)
class Found:
    path: Path
    run_dir: Path
    format: str | None  # None: not a log this workbench reads
    note: str | None = None


def _sniff(path: Path, ingestors: list[Ingestor]) -> str | None:
    head = b""
    for ing in ingestors:
        if ing.needs_head and not head:
            with open(path, "rb") as f:
                head = f.read(HEAD_BYTES)
        if ing.sniff(path, head):
            return ing.name
    return None


def discover(root: Path, ingestors: list[Ingestor]) -> Discovery:
    """All files under `root` (or `root` itself when it is a file), each with its run folder,
    and the checkpoint folders met on the way."""
    root = root.absolute()
    if root.is_file():
        fmt = _sniff(root, ingestors)
        return Discovery(
            [Found(root, root.parent, fmt, None if fmt else "not a log format this workbench reads")], []
        )
    files: dict[Path, list[tuple[Path, str | None]]] = {}
    checkpoint_dirs: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        checkpoint_dirs += [d / n for n in dirnames if CHECKPOINT_DIR.fullmatch(n)]
        dirnames[:] = sorted(
            n
            for n in dirnames
            if not n.startswith(".")
            and n != "__pycache__"
            and not CHECKPOINT_DIR.fullmatch(n)
            and not is_store(d / n)
        )
        for name in sorted(filenames):
            p = d / name
            if p.is_symlink() and not p.exists():
                continue
            try:
                fmt = _sniff(p, ingestors)
            except OSError as e:
                files.setdefault(d, []).append((p, f"unreadable: {e.strerror}"))
                continue
            files.setdefault(d, []).append((p, fmt))
    formats = {d: {f for _, f in items if f and not f.startswith("unreadable")} for d, items in files.items()}
    sub_sources = {i.name for i in ingestors if i.sub_source}

    def owner(d: Path) -> Path:
        if d == root:
            return d
        for ing in ingestors:
            run = ing.run_folder(d)
            if run is not None and (run == root or root in run.parents):
                return run
        fmts = formats.get(d, set())
        parent = d.parent
        if fmts and fmts <= sub_sources:
            if d.name in CONTAINER_DIRS:
                return owner(parent)
            if (
                parent != root
                and parent.name in STAMP_PARENTS
                and (HF_STAMP_DIR.fullmatch(d.name) or parent.name != "runs")
            ):
                return owner(parent.parent)
            if HPARAMS_DIR.fullmatch(d.name) and formats.get(parent):
                return owner(parent)
            if formats.get(parent, set()) - sub_sources:
                return owner(parent)
        return d

    found = []
    for d, items in files.items():
        run_dir = owner(d)
        for p, fmt in items:
            if fmt and fmt.startswith("unreadable"):
                found.append(Found(p, run_dir, None, fmt))
            else:
                found.append(Found(p, run_dir, fmt, None if fmt else "not a log format this workbench reads"))
    checkpoints = [(c, owner(c.parent)) for c in sorted(checkpoint_dirs)]
    return Discovery(sorted(found, key=lambda f: str(f.path)), checkpoints)


def run_id_for(run_dir: Path, root: Path, base: Path) -> str:
    """`run_dir` relative to `base` (an enclosing earlier ingest root, or `root` itself)."""
    run_dir, root, base = run_dir.absolute(), root.absolute(), base.absolute()
    if root.is_file():
        root = root.parent
    if run_dir == base:
        return base.name
    return run_dir.relative_to(base).as_posix()
