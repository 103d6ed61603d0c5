"""Column names and dtypes of every stored table, declared once.

Ingestors produce frames in these shapes; the store checks them on the way in (`conform`).
"""

from __future__ import annotations

import polars as pl

# One row per logged point of one chunk (a batch of one source file), as written to Parquet
# (tag and run_id dictionary-encoded; see StoreWriter.add_chunk).
SCALAR_PART = {
    "run_id": pl.String,
    "chunk_id": pl.Int64,
    "tag": pl.String,
    "step": pl.Int64,
    "wall_time": pl.Float64,
    "value": pl.Float64,
    # superseded by a later point of the same tag inside the same chunk (see store docs)
    "local_superseded": pl.Boolean,
}

FILES = {
    "path": pl.String,  # absolute path
    "run_id": pl.String,
    "format": pl.String,  # ingestor name, or null when skipped
    "status": pl.String,  # ok | problems | skipped | error
    "size": pl.Int64,
    "mtime_ns": pl.Int64,
    "consumed": pl.Int64,  # bytes read so far; the next ingest resumes here
    "content_sig": pl.String,  # hash of bytes [0, consumed) (sampled for big appendable files): rewrite or append?
    "first_wall_time": pl.Float64,  # orders a run's files into segments
    "last_wall_time": pl.Float64,  # of its newest record: how long ago the run last wrote
    "records": pl.Int64,
    "points": pl.Int64,
    "problems": pl.Int64,
    "note": pl.String,  # why skipped, or the last error
    "contents": pl.String,  # JSON: what was seen but not stored as points (histograms, images, ...)
    "state": pl.String,  # JSON: the ingestor's resume state (line number, current step, ...)
    "config_used": pl.String,  # what the reading took from the run's configuration (re-read when it changes)
    "ingested_at": pl.Float64,
    # unwritten for SETTLED_S when read: a read of a file still being written holds back what may
    # still change (an unfinished last line or record, notices waiting for a later step) and the
    # next ingest after it settles takes it, though the file did not change (null: not known)
    "settled": pl.Boolean,
}

CHUNKS = {
    "chunk_id": pl.Int64,
    "run_id": pl.String,
    "path": pl.String,
    "source": pl.String,
    "start_offset": pl.Int64,
    "end_offset": pl.Int64,
    "rows": pl.Int64,
}

# Per chunk and tag: the step range, for cross-chunk preemption and quick summaries.
CHUNK_TAGS = {
    "chunk_id": pl.Int64,
    "tag": pl.String,
    "points": pl.Int64,
    "min_step": pl.Int64,
    "max_step": pl.Int64,
    # what run status needs without reading points: the last step of a finite point not
    # superseded inside the chunk (null: none), and how many points are NaN/Inf (null: a chunk
    # written before these were kept, whose points the views read instead)
    "finite_step": pl.Int64,
    "nonfinite": pl.Int64,
}

# The Parquet parts a chunk wrote, as written: what `workbench check` verifies them against.
PARTS = {
    "chunk_id": pl.Int64,
    "kind": pl.String,  # scalars | events
    "rows": pl.Int64,
    "size": pl.Int64,
    "sha256": pl.String,  # size and sha256 are the file's (a compacted file's: shared by its chunks)
    # null: the chunk's own part; else the compacted file (store-relative) that holds its rows
    "file": pl.String,
    # the file's modification time as written: a part touched since is hashed before it is read
    "mtime_ns": pl.Int64,
}
PART_KINDS = ("scalars", "events")

# Events of one chunk, written as a Parquet part beside the points (joined to chunks by id).
EVENT_PART = {
    "chunk_id": pl.Int64,
    "run_id": pl.String,
    "step": pl.Int64,
    "wall_time": pl.Float64,
    "kind": pl.String,
    "message": pl.String,
    "attrs": pl.String,  # JSON object
    "path": pl.String,
    "offset": pl.Int64,
}

PROBLEMS = {
    "path": pl.String,
    "run_id": pl.String,
    "offset": pl.Int64,  # byte offset (binary formats) or line number (text formats)
    "kind": pl.String,
    "message": pl.String,
}

# Per run and tag: the first-seen summary plugin (TensorBoard applies the first metadata only).
PLUGINS = {"run_id": pl.String, "tag": pl.String, "plugin": pl.String}

# Per run: configuration gathered from the logs (hparams, ...), as a JSON object.
RUN_CONFIG = {"run_id": pl.String, "config": pl.String}

CHECKPOINTS = {
    "run_id": pl.String,
    "step": pl.Int64,
    "path": pl.String,
    "kind": pl.String,  # hf | deepspeed | torch
    "wall_time": pl.Float64,  # newest mtime of its files
    "size": pl.Int64,
    "files": pl.Int64,
    "metadata": pl.String,  # JSON: trainer_state fields, DeepSpeed `latest`, torch metadata (sha256, parent, ...)
    "sha256": pl.String,  # of the file (or of a folder's files), with `ingest --hash`
    # JSON: the other copies of a torch checkpoint ([{kind: metadata | archive, path, size, mtime,
    # sha256 of the file in the archive}]), or null
    "copies": pl.String,
    # whether the copies agree ("ok: ckpt_100.pt = ckpt_100.tar.zst = ckpt_100.json", or
    # "mismatch: ..."), checked when the checkpoint is first seen or changed; null: not checked
    "verified": pl.String,
}

# Manual labels (labels.toml files, `workbench label`); auto labels are derived in the view.
LABELS = {
    "run_id": pl.String,
    "outcome": pl.String,  # failed | healthy | unknown
    "onset": pl.Int64,
    "kind": pl.String,
    "note": pl.String,
    "origin": pl.String,  # the labels.toml it came from, or "workbench label"
    "attrs": pl.String,  # JSON object: the entry's other scalar keys (trainer, optimizer, ...), or null
}
OUTCOMES = ("failed", "healthy", "unknown")

# One alert interval as the rule engine computes it (see detectors.engine).
ALERT = {
    "run_id": pl.String,
    "rule": pl.String,
    "tag": pl.String,  # the matched tag when the rule has a glob, else empty
    "step_start": pl.Int64,  # rising edge
    "step_fired": pl.Int64,  # where for_steps was reached (lead time counts from here)
    "step_end": pl.Int64,
    "value": pl.Float64,  # the first metric of the rule at step_fired
    "message": pl.String,
    "params": pl.String,  # JSON
    "severity": pl.String,
}
# Stored alerts: those of the last replay of each rule over each run (detectors.replay), and
# those a watch raised live (workbench.watch); a replay over the finished logs gives the same.
ALERTS = {
    **ALERT,
    "source": pl.String,  # replay | live
    "raised_at": pl.Float64,  # unix time a watch raised it (null for a replay)
}
ALERT_SOURCES = ("replay", "live")

# What a watch did with each alert it raised, by the alert's id (`workbench.notify.alert_id`: its
# run, rule and first step), apart from `alerts`, whose rows a replay or a re-evaluation
# replaces: a restarted watch sends what was never sent, and nothing twice it knows was sent.
DELIVERIES = {
    "alert_id": pl.String,
    "run_id": pl.String,
    "rule": pl.String,
    "step_start": pl.Int64,
    "outcome": pl.String,  # one of DELIVERY_OUTCOMES
    "notified_at": pl.Float64,  # when the last notifier had it (null: not sent)
    "detail": pl.String,  # why a notifier failed
}
# sent: every notifier has it; failed: one gave up (sent again by the next watch); history: in
# the logs before any watch followed its run (stored, not sent)
DELIVERY_OUTCOMES = ("sent", "failed", "history")

# The folders a watch has followed, since when: alerts of runs under none of them when a watch
# starts were in the logs before any watch (history); under one, they are sent if never sent.
WATCHED = {"root": pl.String, "since": pl.Float64}

ROOTS = {"root": pl.String}

# Which source keeps the current row when two sources of a run log the same tag at the same
# step: the lowest precedence wins (written by ingest from its format registry).
SOURCES = {"source": pl.String, "precedence": pl.Int64}

# End-of-run evidence found in a log file; the run's status is its strongest row (see views).
EVIDENCE = {
    "path": pl.String,
    "run_id": pl.String,
    "status": pl.String,  # one of STATUS_EVIDENCE
    "message": pl.String,  # in words, shown as the run's `evidence`
    "step": pl.Int64,
    "failure": pl.String,  # the failure kind an automatic label takes from it, or null
    "wall_time": pl.Float64,  # when it was written, if known: records written after it make it stale
}
# strongest first; `incomplete` (stopped before its planned end, no crash seen) reads as crashed;
# `checkpoint` (the logs are a checkpoint's snapshot of a run, which went on past it) is the status
STATUS_EVIDENCE = ("diverged", "crashed", "completed", "incomplete", "checkpoint")

# Lineage edges, derived from a whole generation at ingest (see ingest.lineage).
LINEAGE = {
    "child_run": pl.String,
    "child_segment": pl.Int64,
    "parent_run": pl.String,
    "parent_step": pl.Int64,
    "parent_checkpoint": pl.String,
    "kind": pl.String,  # resume | recovery | fork
    "evidence": pl.String,
    "changes": pl.String,  # JSON: hparam changes of a recovery, else null
}
# Per run, canonical metric and pair of sources logging it: do they agree (see ingest.agreement)?
AGREEMENT = {
    "run_id": pl.String,
    "metric": pl.String,
    "source_a": pl.String,
    "tag_a": pl.String,
    "path_a": pl.String,
    "source_b": pl.String,
    "tag_b": pl.String,
    "path_b": pl.String,
    "step_scale": pl.Int64,  # b's step = a's step x scale + offset (negative: a's step / -scale)
    "step_offset": pl.Int64,
    "common_steps": pl.Int64,
    "agree": pl.Float64,  # share of the common steps whose values agree
    "verdict": pl.String,  # ok | offset | scaled | disagree | few
    # ok pairs: the weaker source's points at steps the stronger keeps (each such point counted
    # once, on its pair with the strongest agreeing source that logs its step): superseded by source
    "superseded": pl.Int64,
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
    return pl.DataFrame(schema=schema)


def conform(df: pl.DataFrame, schema: dict, what: str) -> pl.DataFrame:
    """Select and cast `df` to `schema`; a missing column is a bug in the producer."""
    missing = [c for c in schema if c not in df.columns]
    if missing:
        raise ValueError(f"{what}: missing columns {missing}")
    return df.select([pl.col(c).cast(t, strict=True) for c, t in schema.items()])
