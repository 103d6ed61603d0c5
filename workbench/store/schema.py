"""Column names and dtypes of every stored table, declared once.

Ingestors produce frames in these shapes; the store checks them on the way in (`conform`).
Dtypes are the Python types polars reads as String, Int64, Float64 and Boolean, so that a
reader of the store (`workbench sql`, `workbench runs`) needs no polars to know them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl

# One row per logged point of one chunk (a batch of one source file), as written to Parquet
# (tag and run_id dictionary-encoded; see StoreWriter.add_chunk).
SCALAR_PART = {
    "run_id": str,
    "chunk_id": int,
    "tag": str,
    "step": int,
    "wall_time": float,
    "value": float,
    # superseded by a later point of the same tag inside the same chunk (see store docs)
    "local_superseded": bool,
}

FILES = {
    "path": str,  # absolute path
    "run_id": str,
    "format": str,  # ingestor name, or null when skipped
    "status": str,  # ok | problems | skipped | error
    "size": int,
    "mtime_ns": int,
    "consumed": int,  # bytes read so far; the next ingest resumes here
    "content_sig": str,  # hash of bytes [0, consumed) (sampled for big appendable files): rewrite or append?
    "first_wall_time": float,  # orders a run's files into segments
    "last_wall_time": float,  # of its newest record: how long ago the run last wrote
    "records": int,
    "points": int,
    "problems": int,
    "note": str,  # why skipped, or the last error
    "contents": str,  # JSON: what was seen but not stored as points (histograms, images, ...)
    "state": str,  # JSON: the ingestor's resume state (line number, current step, ...)
    "config_used": str,  # what the reading took from the run's configuration (re-read when it changes)
    "ingested_at": float,
    # unwritten for SETTLED_S when read: a read of a file still being written holds back what may
    # still change (an unfinished last line or record, notices waiting for a later step) and the
    # next ingest after it settles takes it, though the file did not change (null: not known)
    "settled": bool,
}

CHUNKS = {
    "chunk_id": int,
    "run_id": str,
    "path": str,
    "source": str,
    "start_offset": int,
    "end_offset": int,
    "rows": int,
}

# Per chunk and tag: the step range, for cross-chunk preemption and quick summaries.
CHUNK_TAGS = {
    "chunk_id": int,
    "tag": str,
    "points": int,
    "min_step": int,
    "max_step": int,
    # what run status needs without reading points: the last step of a finite point not
    # superseded inside the chunk (null: none), and how many points are NaN/Inf (null: a chunk
    # written before these were kept, whose points the views read instead)
    "finite_step": int,
    "nonfinite": int,
}

# The Parquet parts a chunk wrote, as written: what `workbench check` verifies them against.
PARTS = {
    "chunk_id": int,
    "kind": str,  # scalars | events
    "rows": int,
    "size": int,
    "sha256": str,  # size and sha256 are the file's (a compacted file's: shared by its chunks)
    # null: the chunk's own part; else the compacted file (store-relative) that holds its rows
    "file": str,
    # the file's modification time as written: a part touched since is hashed before it is read
    "mtime_ns": int,
}
PART_KINDS = ("scalars", "events")

# Events of one chunk, written as a Parquet part beside the points (joined to chunks by id).
EVENT_PART = {
    "chunk_id": int,
    "run_id": str,
    "step": int,
    "wall_time": float,
    "kind": str,
    "message": str,
    "attrs": str,  # JSON object
    "path": str,
    "offset": int,
}

PROBLEMS = {
    "path": str,
    "run_id": str,
    "offset": int,  # byte offset (binary formats) or line number (text formats)
    "kind": str,
    "message": str,
}

# Per run and tag: the first-seen summary plugin (TensorBoard applies the first metadata only).
PLUGINS = {"run_id": str, "tag": str, "plugin": str}

# Per run: configuration gathered from the logs (hparams, ...), as a JSON object.
RUN_CONFIG = {"run_id": str, "config": str}

CHECKPOINTS = {
    "run_id": str,
    "step": int,
    "path": str,
    "kind": str,  # hf | deepspeed | torch
    "wall_time": float,  # newest mtime of its files
    "size": int,
    "files": int,
    "metadata": str,  # JSON: trainer_state fields, DeepSpeed `latest`, torch metadata (sha256, parent, ...)
    "sha256": str,  # of the file (or of a folder's files), with `ingest --hash`
    # JSON: the other copies of a torch checkpoint ([{kind: metadata | archive, path, size, mtime,
    # sha256 of the file in the archive}]), or null
    "copies": str,
    # whether the copies agree ("ok: ckpt_100.pt = ckpt_100.tar.zst = ckpt_100.json", or
    # "mismatch: ..."), checked when the checkpoint is first seen or changed; null: not checked
    "verified": str,
}

# Manual labels (labels.toml files, `workbench label`); auto labels are derived in the view.
LABELS = {
    "run_id": str,
    "outcome": str,  # failed | healthy | unknown
    "onset": int,
    "kind": str,
    "note": str,
    "origin": str,  # the labels.toml it came from, or "workbench label"
    "attrs": str,  # JSON object: the entry's other scalar keys (trainer, optimizer, ...), or null
}
OUTCOMES = ("failed", "healthy", "unknown")

# One alert interval as the rule engine computes it (see detectors.engine).
ALERT = {
    "run_id": str,
    "rule": str,
    "tag": str,  # the matched tag when the rule has a glob, else empty
    "step_start": int,  # rising edge
    "step_fired": int,  # where for_steps was reached (lead time counts from here)
    "step_end": int,
    "value": float,  # the first metric of the rule at step_fired
    "message": str,
    "params": str,  # JSON
    "severity": str,
}
# Stored alerts: those of the last replay of each rule over each run (detectors.replay), and
# those a watch raised live (workbench.watch); a replay over the finished logs gives the same.
ALERTS = {
    **ALERT,
    "source": str,  # replay | live
    "raised_at": float,  # unix time a watch raised it (null for a replay)
}
ALERT_SOURCES = ("replay", "live")

# What a watch did with each alert it raised, by the alert's id (`workbench.notify.alert_id`: its
# run, rule and first step), apart from `alerts`, whose rows a replay or a re-evaluation
# replaces: a restarted watch sends what was never sent, and nothing twice it knows was sent.
DELIVERIES = {
    "alert_id": str,
    "run_id": str,
    "rule": str,
    "step_start": int,
    "outcome": str,  # one of DELIVERY_OUTCOMES
    "notified_at": float,  # when the last notifier had it (null: not sent)
    "detail": str,  # why a notifier failed
}
# sent: every notifier has it; failed: one gave up (sent again by the next watch); history: in
# the logs before any watch followed its run (stored, not sent)
DELIVERY_OUTCOMES = ("sent", "failed", "history")

# The folders a watch has followed, since when: alerts of runs under none of them when a watch
# starts were in the logs before any watch (history); under one, they are sent if never sent.
WATCHED = {"root": str, "since": float}

ROOTS = {"root": str}

# Which source keeps the current row when two sources of a run log the same tag at the same
# step: the lowest precedence wins (written by ingest from its format registry).
SOURCES = {"source": str, "precedence": int}

# End-of-run evidence found in a log file; the run's status is its strongest row (see views).
EVIDENCE = {
    "path": str,
    "run_id": str,
    "status": str,  # one of STATUS_EVIDENCE
    "message": str,  # in words, shown as the run's `evidence`
    "step": int,
    "failure": str,  # the failure kind an automatic label takes from it, or null
    "wall_time": float,  # when it was written, if known: records written after it make it stale
}
# strongest first; `incomplete` (stopped before its planned end, no crash seen) reads as crashed;
# `checkpoint` (the logs are a checkpoint's snapshot of a run, which went on past it) is the status
STATUS_EVIDENCE = ("diverged", "crashed", "completed", "incomplete", "checkpoint")

# Lineage edges, derived from a whole generation at ingest (see ingest.lineage).
LINEAGE = {
    "child_run": str,
    "child_segment": int,
    "parent_run": str,
    "parent_step": int,
    "parent_checkpoint": str,
    "kind": str,  # resume | recovery | fork
    "evidence": str,
    "changes": str,  # JSON: hparam changes of a recovery, else null
}
# Per run, canonical metric and pair of sources logging it: do they agree (see ingest.agreement)?
AGREEMENT = {
    "run_id": str,
    "metric": str,
    "source_a": str,
    "tag_a": str,
    "path_a": str,
    "source_b": str,
    "tag_b": str,
    "path_b": str,
    "step_scale": int,  # b's step = a's step x scale + offset (negative: a's step / -scale)
    "step_offset": int,
    "common_steps": int,
    "agree": float,  # share of the common steps whose values agree
    "verdict": str,  # ok | offset | scaled | disagree | few
    # ok pairs: the weaker source's points at steps the stronger keeps (each such point counted
    # once, on its pair with the strongest agreeing source that logs its step): superseded by source
    "superseded": int,
}
DERIVED_TABLES: dict[str, dict] = {"lineage": LINEAGE, "agreement": AGREEMENT}

META_TABLES: dict[str, dict] = {
    "files": FILES,
    "chunks": CHUNKS,
    "chunk_tags": CHUNK_TAGS,
    "parts": PARTS,
    "problems": PROBLEMS,
    "plugins": PLUGINS,
    "run_config": RUN_CONFIG,
    "roots": ROOTS,
    "sources": SOURCES,
    "evidence": EVIDENCE,
    "checkpoints": CHECKPOINTS,
    "labels": LABELS,
    "alerts": ALERTS,
    "deliveries": DELIVERIES,
    "watched": WATCHED,
}


def empty(schema: dict) -> pl.DataFrame:
    import polars as pl

    return pl.DataFrame(schema=schema)


def conform(df: pl.DataFrame, schema: dict, what: str) -> pl.DataFrame:
    """Select and cast `df` to `schema`; a missing column is a bug in the producer."""
    import polars as pl

    missing = [c for c in schema if c not in df.columns]
    if missing:
        raise ValueError(f"{what}: missing columns {missing}")
    return df.select([pl.col(c).cast(t, strict=True) for c, t in schema.items()])
