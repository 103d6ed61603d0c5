"""One tree that mixes the layouts real tools write: every format read
here, gzipped logs, HF's default output layout, a `checkpoints/` output dir, a lone checkpoint,
a Git LFS clone, resumed DeepSpeed runs, checkpoint copies. Every file is read or listed with a
reason, a metric is one row per step, and ingesting the unchanged tree again gives what a fresh
ingest gives."""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

import polars as pl
import pytest
from conftest import DATA, SAMPLE_RUNS, ingest_paths
from real_samples import settle

from workbench.store import Store

SAMPLES = [
    "deepspeed_resumed_after_kill",
    "hf_diverge_nan_filtered",
    "keras_csvlogger_appended",
    "healthy_moe_top1",
]
REAL_LOGS = ["lightning_csvlogger", "mlflow_filestore", "bigscience", "nanogpt", "issue_excerpts"]
HF_OUT = DATA / "real/defects/d01_checkpoints_output_dir/checkpoints"
GZIPPED = {  # as people archive finished logs: a console and a JSONL, each its own run
    "console/stdout.log.gz": DATA / "real_logs/deepspeed/hellodeepspeed_bert_zero1_fp16_console.log",
    "jsonl/metrics.jsonl.gz": SAMPLE_RUNS / "healthy_seed0/metrics.jsonl",
}


def _tree(root: Path) -> Path:
    """The mixed tree, every file settled (finished writing)."""
    for folder in sorted((DATA / "real").iterdir()):
        if folder.is_dir():
            shutil.copytree(folder, root / "real" / folder.name)
    for name in REAL_LOGS:
        shutil.copytree(DATA / "real_logs" / name, root / "real_logs" / name)
    for name in SAMPLES:
        shutil.copytree(SAMPLE_RUNS / name, root / "samples" / name)
    shutil.copytree(HF_OUT, root / "hf_default_layout", ignore=shutil.ignore_patterns("checkpoint-*"))
    for name, src in GZIPPED.items():
        (root / "gzipped" / name).parent.mkdir(parents=True)
        (root / "gzipped" / name).write_bytes(gzip.compress(src.read_bytes(), mtime=0))
    for dirpath, _, names in os.walk(root):
        settle(*(os.path.join(dirpath, n) for n in names))
    return root


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """(store ingested twice, store ingested once, the tree, the second ingest's report)."""
    base = tmp_path_factory.mktemp("layouts")
    root = _tree(base / "tree")
    twice, fresh = Store(base / "twice"), Store(base / "fresh")
    ingest_paths(twice, root, hash_checkpoints=True)
    again = ingest_paths(twice, root, hash_checkpoints=True)
    ingest_paths(fresh, root, hash_checkpoints=True)
    return twice, fresh, root, again


def test_every_file_is_read_or_listed_with_a_reason(stores):
    """Each file is a log read (a format), a file listed with why it is not read (a note), or
    a checkpoint's (in or beside a recorded checkpoint: weights, metadata, DeepSpeed's `latest`);
    every run has a log read, and every checkpoint a run."""
    store, _, root, _ = stores
    files = store.query("SELECT path, run_id, format, note FROM files")
    listed = {p: (fmt, note) for p, _, fmt, note in files.rows()}
    checkpoints = store.query("SELECT run_id, path FROM checkpoints")
    held = [Path(p) for p in checkpoints["path"]]
    unaccounted = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            fmt, note = listed.get(str(path), (None, None))
            if (
                fmt is None
                and not note
                and not any(h in path.parents or h.parent == path.parent for h in held)
            ):
                unaccounted.append(str(path.relative_to(root)))
    assert unaccounted == []
    runs = set(store.query("SELECT run_id FROM runs")["run_id"])
    assert set(files.filter(pl.col("format").is_not_null())["run_id"]) == runs
    assert set(checkpoints["run_id"]) <= runs  # no checkpoint of a run that `runs` lacks
    layouts = {
        "hf_default_layout",
        "real/defects/d01_checkpoints_output_dir/checkpoints",
        "real/defects/d06_checkpoint_alone/checkpoint-40",
        "gzipped/console",
        "gzipped/jsonl",
    }
    assert layouts <= runs
    lfs = store.query("SELECT run_id FROM problems WHERE message LIKE 'a Git LFS pointer%'")
    assert lfs["run_id"].to_list() == ["real/defects/d09_lfs_pointer"]


def test_a_metric_is_one_row_per_step(stores):
    """Sources of a run that log one metric and agree are one series. The rows that share a
    (run, metric, step) are per-layer series one source logs under one metric (MoE's
    `moe/layer_N/max_load`), or sources that disagree (each pair a `sources_disagree` problem)."""
    store = stores[0]
    shared = store.query(
        """SELECT s.run_id, s.metric, s.step, count(DISTINCT a.source) AS sources, count(*) AS n,
                  count(DISTINCT s.tag) AS tags
           FROM scalars s JOIN scalars_all a USING (run_id, tag, step)
           WHERE s.metric IS NOT NULL AND NOT a.superseded GROUP BY ALL HAVING count(*) > 1""",
    )
    assert (shared["n"] == shared["tags"]).all()
    # one source, several tags of a metric at a step: MoE's per-layer series; a Keras file that
    # mixes epoch- and iteration-indexed series (a `mixed_step_axes` problem); and two folders
    # of unrelated example files: custom_names' tutorial file logs one loss under two names on
    # purpose, and a fairseq epoch summary repeats its last update's step with the epoch's mean
    mixed = store.query("SELECT DISTINCT run_id FROM problems WHERE kind = 'mixed_step_axes'")["run_id"]
    examples = ["real/custom_names/tb_tutorial_names", "real/fairseq_progress"]
    layers = shared.filter((pl.col("sources") == 1) & ~pl.col("run_id").is_in([*mixed, *examples]))
    assert set(layers["metric"]) <= {"moe_max_load", "moe_mean_load"}
    disagree = store.query("SELECT DISTINCT run_id, metric FROM agreement WHERE verdict <> 'ok'")
    apart = shared.filter(pl.col("sources") > 1).select("run_id", "metric").unique()
    assert apart.join(disagree, on=["run_id", "metric"], how="anti").is_empty()
    for run in ("hf_default_layout", "real/defects/d01_checkpoints_output_dir/checkpoints"):
        loss = store.query(
            f"SELECT step, count(*) n FROM scalars WHERE run_id = '{run}' AND metric = 'loss' GROUP BY step",
        )
        assert loss.height == 12 and loss["n"].max() == 1


def test_a_second_ingest_equals_a_fresh_one(stores):
    twice, fresh, _, again = stores
    assert again.files_read == 0 and again.points == 0
    assert [p.kind for _, p in again.problems] == ["not_read"]  # the LFS pointer, still not pulled
    views = {
        "runs": "SELECT * EXCLUDE (started, last_write, ingested_at) FROM runs",
        "files": "SELECT * EXCLUDE (mtime, ingested_at) FROM files",
        "scalars_all": "SELECT * FROM scalars_all",
        "events": "SELECT * FROM events",
        "checkpoints": "SELECT * EXCLUDE (wall_time) FROM checkpoints",
        "lineage": "SELECT * FROM lineage",
        "problems": "SELECT * FROM problems",
        "labels": "SELECT * FROM labels",
        "agreement": "SELECT * FROM agreement",
    }
    differ = [
        view
        for view, sql in views.items()
        if not twice.query(f"{sql} ORDER BY ALL").equals(fresh.query(f"{sql} ORDER BY ALL"))
    ]
    assert differ == []


def test_resumed_deepspeed_runs_have_their_resume_edges(stores):
    """The sample run resumed with a step overlap, and d11 resumed right after a save."""
    edges = (
        stores[0].query("SELECT child_run, parent_run, parent_step, kind FROM lineage ORDER BY ALL").rows()
    )
    for run, step in (
        ("samples/deepspeed_resumed_after_kill", 200),
        ("real/defects/d11_deepspeed_resume_after_ckpt150", 150),
    ):
        assert (run, run, step, "resume") in edges
