"""Checkpoints found beside the logs: HF `checkpoint-N/`, DeepSpeed `global_stepN/` (+ `latest`),
torch files with a metadata JSON beside them (step, sha256, parent) in `checkpoints/` or `ckpt/`.

The copies of one torch checkpoint are one row: the weights file, its metadata JSON and an
archive of it (`ckpt_100.pt`, `ckpt_100.json`, `ckpt_100.tar.zst`: the guides' triple write)
share a name; the row is the weights file (else the archive), with the other copies in
`copies`. Only size, mtime and the small metadata files are read here: weights are never
opened (`ingest/checkpoint_integrity.py` hashes them, with `ingest --hash`).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from ingest.lines import JsonError, read_json_file, to_step

HF_DIR = re.compile(r"checkpoint-(\d+)")
DS_DIR = re.compile(r"global_step(\d+)")
CONTAINERS = {"checkpoints", "checkpoint", "ckpt", "ckpts"}
WEIGHTS = (".pt", ".pth", ".ckpt", ".safetensors", ".bin")
ARCHIVES = (".tar.zst", ".tar.gz", ".tgz", ".tar")
STEP_IN_NAME = re.compile(r"(?:step|iter|ckpt|checkpoint|epoch)[_-]?(\d+)", re.IGNORECASE)


def _tree_size(path: Path) -> tuple[int, int, float]:
    """(bytes, files, newest mtime) of a file or folder."""
    if path.is_file():
        st = path.stat()
        return st.st_size, 1, st.st_mtime
    size = files = 0
    newest = path.stat().st_mtime
    for dirpath, _, names in os.walk(path):
        for n in names:
            st = os.stat(os.path.join(dirpath, n))
            size, files, newest = size + st.st_size, files + 1, max(newest, st.st_mtime)
    return size, files, newest


def _json(path: Path) -> dict:
    try:
        data = read_json_file(path)
    except (OSError, JsonError):
        return {}
    return data if isinstance(data, dict) else {}


def _step(v) -> int | None:
    """A checkpoint's step, or None when its metadata gives none that fits (NaN, 1e30, text)."""
    try:
        return to_step(v)
    except ValueError:
        return None


def _row(path: Path, step: int | None, kind: str, metadata: dict) -> dict:
    size, files, mtime = _tree_size(path)
    return {
        "path": str(path),
        "step": step,
        "kind": kind,
        "wall_time": mtime,
        "size": size,
        "files": files,
        "metadata": json.dumps(metadata, sort_keys=True, default=str),
        "sha256": None,
        "copies": None,
        "verified": None,
    }


def scan(folder: Path, logs: frozenset[Path] = frozenset()) -> list[dict]:
    """Checkpoint rows for one checkpoint folder (or a container of checkpoints); `logs`: files
    read as logs (a container that is also HF's output_dir holds `*_results.json` with a step)."""
    return _scan(folder, logs)


def changes(old: dict, new: dict) -> str | None:
    """Why a checkpoint seen before no longer looks the same (its file, or a copy), or None."""
    why = []
    if old["size"] != new["size"]:
        why.append(f"size {old['size']} -> {new['size']} bytes")
    if old["wall_time"] != new["wall_time"]:
        why.append("modified since it was recorded")
    if old.get("sha256") and new.get("sha256") and old["sha256"] != new["sha256"]:
        why.append("sha256 differs")
    if old.get("metadata") != new.get("metadata") or _files_of(old.get("copies")) != _files_of(
        new.get("copies")
    ):
        why.append("its metadata or another copy changed")
    return "; ".join(why) or None


def _files_of(copies: str | None) -> list[tuple]:
    """The copies as files on disk (what a later scan sees again; not what was learnt of them)."""
    return sorted((c["kind"], c["path"], c["size"], c["mtime"]) for c in json.loads(copies or "[]"))


def _scan(folder: Path, logs: frozenset[Path] = frozenset()) -> list[dict]:
    name = folder.name
    if m := HF_DIR.fullmatch(name):
        state = _json(folder / "trainer_state.json")
        meta = {
            k: state[k]
            for k in ("global_step", "best_metric", "best_model_checkpoint", "max_steps")
            if k in state
        }
        return [_row(folder, _step(m[1]), "hf", meta)]
    if name == "last-checkpoint":
        state = _json(folder / "trainer_state.json")
        return [
            _row(
                folder,
                _step(state.get("global_step")),
                "hf",
                {"global_step": state.get("global_step"), "last_checkpoint": True},
            )
        ]
    if m := DS_DIR.fullmatch(name):
        latest = folder.parent / "latest"
        is_latest = latest.is_file() and latest.read_text().strip() == name
        return [_row(folder, _step(m[1]), "deepspeed", {"latest": is_latest})]
    if name not in CONTAINERS:
        return []
    rows: list[dict] = []
    by_stem: dict[str, dict[str, Path]] = {}  # the copies of one checkpoint share a name
    for child in sorted(folder.iterdir()):
        if child.is_dir():
            rows += _scan(child, logs)
        elif child.is_file() and child not in logs and (kind := _copy_kind(child.name)):
            stem, what = kind
            by_stem.setdefault(stem, {}).setdefault(what, child)
    for copies in by_stem.values():
        if row := _torch_row(copies):
            rows.append(row)
    return rows


def _copy_kind(name: str) -> tuple[str, str] | None:
    """(stem, 'weights' | 'archive' | 'metadata') of a file that may be a copy of a torch checkpoint."""
    for suffixes, what in ((ARCHIVES, "archive"), (WEIGHTS, "weights"), ((".json",), "metadata")):
        for suffix in suffixes:
            if name.endswith(suffix) and len(name) > len(suffix):
                return name[: -len(suffix)], what
    return None


def _torch_row(copies: dict[str, Path]) -> dict | None:
    """One torch checkpoint from its copies: the weights file (else the archive, else the
    metadata alone), its step from the metadata or the name. A JSON alone is a checkpoint only
    when it gives a step."""
    meta = _json(copies["metadata"]) if "metadata" in copies else {}
    if "metadata" in copies and "step" not in meta and len(copies) == 1:
        return None
    target = copies.get("weights") or copies.get("archive") or copies["metadata"]
    if "step" in meta:
        step = _step(meta["step"])
    else:
        m = STEP_IN_NAME.search(target.name)
        step = _step(m[1]) if m else None
    row = _row(target, step, "torch", meta)
    others = [
        {"kind": what, "path": str(p), "size": p.stat().st_size, "mtime": p.stat().st_mtime}
        for what, p in sorted(copies.items())
        if p != target
    ]
    row["copies"] = json.dumps(others, sort_keys=True) if others else None
    return row
