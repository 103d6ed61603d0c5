"""Which files are logs, and which run each belongs to.

A run is a directory holding log files; its id is its path relative to the PATH given to
ingest (the PATH's own name when the PATH itself is a run). Sources that tools write into
sub-folders of a run attach to that run instead of becoming runs of their own:
- TensorBoard-only folders named like containers (`tb/`, `logs/`, `tensorboard/`, ...),
- HF Trainer's `runs/<Mon DD_HH-MM-SS_host>/` and DeepSpeed's `monitor_tb/<job>/`,
- `add_hparams` sub-folders named by a float timestamp (`1796036286.857561/`),
- TensorBoard-only folders whose parent holds other logs.
In a tree of plain TensorBoard folders (`exp1/`, `exp2/`) each folder is a run, as in
TensorBoard. A checkpoint folder (`checkpoint-N/`, `global_stepN/`, `last-checkpoint/`) is a
checkpoint of its run, not a run, and its files are not read as metrics; a lone one, whose run
left no log, is read as a run of its own (its trainer_state.json is all there is). A checkpoint
container (`checkpoints/`, `ckpt/`) is walked: it is HF's `output_dir="checkpoints"` as often as
a folder of checkpoints, so a container holding logs is a run (or part of the run above it),
while its metadata JSON and weights are left to the checkpoint scan.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ingest.base import Ingestor
from ingest.checkpoints import CONTAINERS
from ingest.lines import BOM, gz_damage, is_gz, read_head
from workbench.store.layout import MARKER

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
CHECKPOINT_DIR = re.compile(r"checkpoint-\d+|global_step\d+|last-checkpoint")  # one checkpoint each
HPARAMS_DIR = re.compile(r"\d{9,11}\.\d+")
HF_STAMP_DIR = re.compile(r"[A-Z][a-z]{2}\d{2}_\d{2}-\d{2}-\d{2}_.+")
HEAD_BYTES = 4096
LFS_SPEC = b"version https://git-lfs.github.com/spec/"  # how a Git LFS pointer file begins
LFS_POINTER_MAX = 1024  # the spec's bound on a pointer file's size

Known = dict[str, tuple[int, int, str]]  # path -> (size, mtime_ns, format) of a log already read


@dataclass
class Discovery:
    files: list[Found]
    checkpoints: list[tuple[Path, Path]]  # (checkpoint folder or container, its run folder)
    problems: list[tuple[Path, str]] = field(default_factory=list)  # folders that could not be listed


@dataclass(frozen=True)
class Found:
    path: Path
    run_dir: Path
    format: str | None  # None: not a log this workbench reads
    note: str | None = None
    problem: str | None = None  # why it was not read though it may be a log (a FIFO, unreadable)


NOT_A_LOG = "not a log format this workbench reads"
_SPECIAL = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
    (stat.S_ISSOCK, "a socket"),
)


def _sniff(path: Path, ingestors: list[Ingestor]) -> str | None:
    head = b""
    for ing in ingestors:
        if ing.needs_head and not head:
            if is_gz(path):  # a sniffer sees what the reader will: the decompressed text
                head = read_head(path, HEAD_BYTES).removeprefix(BOM)
            else:
                # O_NONBLOCK: a file swapped for a FIFO since it was looked at must not hang the ingest
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
                with os.fdopen(fd, "rb") as f:
                    head = f.read(HEAD_BYTES).removeprefix(BOM)  # a sniffer sees what the reader will
        if ing.sniff(path, head):
            return ing.name
    return None


def _lfs_pointer(path: Path, size: int) -> str | None:
    """Why a Git LFS pointer file is not read (a clone made without its LFS objects holds these
    small text files in place of the logs), or None when `path` is no pointer."""
    if size > LFS_POINTER_MAX:
        return None
    with open(path, "rb") as f:
        head = f.read(LFS_POINTER_MAX)
    if not head.startswith(LFS_SPEC):
        return None
    fields = dict(
        line.split(" ", 1) for line in head.decode("ascii", "replace").splitlines()[1:] if " " in line
    )
    size_text = f"{int(fields['size']):,} bytes" if fields.get("size", "").isdigit() else "size unknown"
    return (
        f"a Git LFS pointer ({fields.get('oid', 'no oid')}, {size_text}): the content is not "
        "present; fetch it with `git lfs pull`, then ingest again"
    )


def _look(
    path: Path, ingestors: list[Ingestor], known: Known | None = None, st: os.stat_result | None = None
) -> tuple[str | None, str | None]:
    """(format, problem) of one file (`st`: its stat, when taken): only regular files are read
    (a FIFO or a device would block or never end), and a file whose format cannot be told is a
    problem, not a crash. A file `known` as a log of the size and modification time it has now
    is not opened."""
    try:
        st = st or path.stat()  # follows a symlink to what it names
    except OSError as e:
        return None, f"unreadable: {e.strerror}"
    if known and (k := known.get(str(path))) and k[:2] == (st.st_size, st.st_mtime_ns):
        return k[2], None
    if not stat.S_ISREG(st.st_mode):
        what = next((w for test, w in _SPECIAL if test(st.st_mode)), "not a regular file")
        via = " (through a symlink)" if path.is_symlink() else ""
        return None, f"{what}{via}, not a regular file: not read"
    try:
        if why := _lfs_pointer(path, st.st_size):
            return None, why
    except OSError as e:
        return None, f"unreadable: {e.strerror}"
    if is_gz(path) and (why := gz_damage(path)):
        return None, why
    try:
        return _sniff(path, ingestors), None
    except OSError as e:
        return None, f"unreadable: {e.strerror}"
    except Exception as e:  # noqa: BLE001 - one odd file never stops discovery
        return None, f"could not tell its format ({type(e).__name__}: {e})"


def _walk(
    top: Path, ingestors: list[Ingestor], unlisted: list[tuple[Path, str]], known: Known | None = None
) -> tuple[dict[Path, list[tuple[Path, str | None, str | None]]], list[Path]]:
    """Every file under `top` with its (format, problem), by folder, and the checkpoint folders
    met on the way (not entered: their files are the checkpoint's). Files of a checkpoint
    container (`checkpoints/`, `ckpt/`) that are no log are the checkpoints' own and are left
    to the checkpoint scan; a container that holds logs (HF's `output_dir="checkpoints"`) is
    walked like any folder."""
    files: dict[Path, list[tuple[Path, str | None, str | None]]] = {}
    checkpoint_dirs: list[Path] = []

    def walk_error(e: OSError) -> None:
        unlisted.append((Path(e.filename), f"folder not read: {e.strerror}"))

    top_s = str(top)
    for dirpath, dirnames, filenames in os.walk(top, onerror=walk_error):
        d = Path(dirpath)
        if MARKER in filenames and d != top:  # a store (its parts are no logs): nothing in it is read
            dirnames[:] = []
            continue
        in_container = not CONTAINERS.isdisjoint(dirpath[len(top_s) :].split(os.sep))  # below top
        # a container's checkpoints are scanned with it (`checkpoints.scan`), not one by one
        checkpoint_dirs += [
            d / n for n in dirnames if (CHECKPOINT_DIR.fullmatch(n) or n in CONTAINERS) and not in_container
        ]
        dirnames[:] = sorted(
            n
            for n in dirnames
            if not n.startswith(".") and n != "__pycache__" and not CHECKPOINT_DIR.fullmatch(n)
        )
        for name in sorted(filenames):
            p = d / name
            try:
                st = p.stat()  # follows a symlink to what it names
            except FileNotFoundError:
                continue  # a symlink to nothing
            except OSError:
                st = None  # one that cannot be followed (EACCES, a /proc link): `_look` reports it
            fmt, problem = _look(p, ingestors, known, st)
            if in_container and problem is None and (fmt is None or (fmt == "jsonl" and _whole_json(p))):
                continue  # checkpoint metadata or weights: the checkpoint scan records them
            files.setdefault(d, []).append((p, fmt, problem))
    return files, checkpoint_dirs


def _whole_json(path: Path) -> bool:
    return path.name.lower().removesuffix(".gz").endswith(".json")


def discover(root: Path, ingestors: list[Ingestor], known: Known | None = None) -> Discovery:
    """All files under `root` (or `root` itself when it is a file), each with its run folder,
    and the checkpoint folders met on the way, each with its run folder. `known`: the format of
    files already read, by path, with the size and modification time they had (the store's
    `files`): such a file unchanged since is not opened again (a re-ingest of 10k runs that
    changed one reads one head, not 10k).

    A checkpoint folder whose run holds no log (`checkpoint-N/` copied alone, a Hub repository
    of one checkpoint) is read as a run of its own: its trainer_state.json is all there is."""
    root = root.absolute()
    if not root.is_dir():
        fmt, problem = _look(root, ingestors, known)
        return Discovery([Found(root, root.parent, fmt, None if fmt or problem else NOT_A_LOG, problem)], [])
    unlisted: list[tuple[Path, str]] = []
    files, checkpoint_dirs = _walk(root, ingestors, unlisted, known)
    owner = _Owners(root, ingestors, files)
    with_logs = {owner(d) for d in files if owner.formats.get(d)}
    alone = [c for c in checkpoint_dirs if c.name not in CONTAINERS and owner(c.parent) not in with_logs]
    for c in alone:
        more, _ = _walk(c, ingestors, unlisted, known)
        logs = {d: items for d, items in more.items() if any(fmt for _, fmt, _ in items)}
        if logs:
            files.update(logs)
            owner = _Owners(root, ingestors, files)
    found = []
    for d, items in files.items():
        run_dir = owner(d)
        for p, fmt, problem in items:
            found.append(Found(p, run_dir, fmt, None if fmt or problem else NOT_A_LOG, problem))
    checkpoints = [(c, owner(c) if c in files else owner(c.parent)) for c in sorted(checkpoint_dirs)]
    return Discovery(sorted(found, key=lambda f: str(f.path)), checkpoints, unlisted)


def _named(path: Path, ingestors: list[Ingestor]) -> str | None:
    """The format a file's name alone says (`events.out.tfevents.*`), for a file not read."""
    return next((i.name for i in ingestors if not i.needs_head and i.sniff(path, b"")), None)


class _Owners:
    """The run folder of each folder holding files (see the module docstring)."""

    def __init__(self, root: Path, ingestors: list[Ingestor], files: dict[Path, list]):
        self.root = root
        self.ingestors = ingestors
        # a file not read (a Git LFS pointer, a FIFO) belongs where its name says it would
        self.formats = {
            d: {f or (problem and _named(p, ingestors)) for p, f, problem in items} - {None, ""}
            for d, items in files.items()
        }
        self.sub_sources = {i.name for i in ingestors if i.sub_source}
        self.known: dict[Path, Path] = {}  # each folder's, worked out once

    def __call__(self, d: Path) -> Path:
        if (run := self.known.get(d)) is None:
            run = self.known[d] = self._owner(d)
        return run

    def _owner(self, d: Path) -> Path:
        root = self.root
        if d == root:
            return d
        for ing in self.ingestors:
            run = ing.run_folder(d)
            if run is not None and (run == root or root in run.parents):
                return run
        fmts = self.formats.get(d, set())
        parent = d.parent
        if d.name in CONTAINERS and (not fmts or self.formats.get(parent)):
            return self(parent)  # a checkpoint container belongs to its run, unless it is the run
        if fmts and fmts <= self.sub_sources:
            if d.name in CONTAINER_DIRS:
                return self(parent)
            if (
                parent != root
                and parent.name in STAMP_PARENTS
                and (HF_STAMP_DIR.fullmatch(d.name) or parent.name != "runs")
            ):
                return self(parent.parent)
            if HPARAMS_DIR.fullmatch(d.name) and self.formats.get(parent):
                return self(parent)
            if self.formats.get(parent, set()) - self.sub_sources:
                return self(parent)
        return d


def run_id_for(run_dir: Path, base: Path) -> str:
    """`run_dir` relative to `base` (an enclosing earlier ingest root, or the root itself)."""
    run_dir, base = run_dir.absolute(), base.absolute()
    if run_dir == base:
        return base.name
    return run_dir.relative_to(base).as_posix()
