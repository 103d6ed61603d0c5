"""Checkpoints found beside the logs: HF `checkpoint-N/`, DeepSpeed `global_stepN/` (+ `latest`),
torch files with a metadata JSON beside them (step, sha256, parent) in `checkpoints/` or `ckpt/`.

Only size, mtime and the small metadata files are read: weights are never opened.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from ingest.lines import JsonError, read_json_file, to_step

HF_DIR = re.compile(r"checkpoint-(\d+)")
DS_DIR = re.compile(r"global_step(\d+)")
CONTAINERS = {"checkpoints", "checkpoint", "ckpt", "ckpts"}
WEIGHTS = (".pt", ".pth", ".ckpt", ".safetensors", ".bin")
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
    }


def sha256_of(path: Path) -> str:
    """Of a file, or of a folder's files (their relative paths and contents, in order)."""
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        if path.is_dir():
            h.update(f.relative_to(path).as_posix().encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda fh=fh: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def scan(folder: Path, hash_files: bool = False, logs: frozenset[Path] = frozenset()) -> list[dict]:
    """Checkpoint rows for one checkpoint folder (or a container of checkpoints); `logs`: files
    read as logs (a container that is also HF's output_dir holds `*_results.json` with a step)."""
    rows = _scan(folder, logs)
    if hash_files:
        for r in rows:
            r["sha256"] = sha256_of(Path(r["path"]))
    return rows


def changes(old: dict, new: dict) -> str | None:
    """Why a checkpoint seen before no longer looks the same, or None."""
    why = []
    if old["size"] != new["size"]:
        why.append(f"size {old['size']} -> {new['size']} bytes")
    if old["wall_time"] != new["wall_time"]:
        why.append("modified since it was recorded")
    if old.get("sha256") and new.get("sha256") and old["sha256"] != new["sha256"]:
        why.append("sha256 differs")
    meta = json.loads(new.get("metadata") or "{}")
    if (
        new.get("sha256")
        and meta.get("sha256")
        and Path(new["path"]).is_file()
        and meta["sha256"] != new["sha256"]
    ):
        why.append("sha256 differs from the one in its metadata")
    return "; ".join(why) or None


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
    seen: set[Path] = set()
    for child in sorted(folder.iterdir()):
        if child.is_dir():
            rows += _scan(child, logs)
        elif child.suffix == ".json" and child not in logs:
            meta = _json(child)
            if "step" not in meta:
                continue
            weights = next((child.with_suffix(s) for s in WEIGHTS if child.with_suffix(s).exists()), None)
            target = weights or child
            seen.add(target)
            rows.append(_row(target, _step(meta["step"]), "torch", meta))
    for child in sorted(folder.iterdir()):
        if child.is_file() and child.suffix in WEIGHTS and child not in seen:
            m = STEP_IN_NAME.search(child.stem)
            rows.append(_row(child, _step(m[1]) if m else None, "torch", {}))
    return rows
