"""The runs of the diverse corpus kept in tests/data/diverse (PROVENANCE.md there): each is
ingested with the label and family attributes of its labels.toml entry, and its own logs show
what its label says: the hard negatives really clip, restart their lr, skip fp16 steps, resume
and spike, and each failed run's onset is where its physical criterion puts it."""

from __future__ import annotations

import hashlib
import math
import tomllib

import polars as pl
import pytest
from conftest import DATA, ingest_paths

from workbench.store import Store

DIVERSE = DATA / "diverse"
MANIFEST = DIVERSE / "MANIFEST.tsv"  # as their build's manifest listed them (PROVENANCE.md)
LABELS: dict[str, dict] = tomllib.loads((DIVERSE / "labels.toml").read_text())["runs"]
FAMILY_KEYS = {
    "trainer",
    "optimizer",
    "size",
    "arch",
    "clip",
    "schedule",
    "precision",
    "dataset",
    "tags",
    "family",
}


@pytest.fixture(scope="module")
def diverse(tmp_path_factory) -> Store:
    store = Store(tmp_path_factory.mktemp("diverse") / "store")
    ingest_paths(store, DIVERSE)
    return store


def hard(name: str) -> str:
    """The run that is the healthy hard negative `name`."""
    return next(r for r, e in LABELS.items() if e.get("hard_negative") == name)


def failed(kind: str) -> str:
    return next(r for r, e in LABELS.items() if e.get("kind") == kind and e["outcome"] == "failed")


def series(store: Store, run: str, metric: str) -> pl.DataFrame:
    """(step, value) of a canonical metric, the newest write of each step."""
    return store.query(
        f"SELECT step, arg_max(value, wall_time) AS value FROM scalars WHERE run_id = '{run}' "
        f"AND metric = '{metric}' GROUP BY step ORDER BY step",
    )


def test_every_run_is_ingested_with_its_label(diverse):
    got = diverse.query("SELECT run_id, outcome, onset, kind FROM labels").rows_by_key("run_id", unique=True)
    # a label names the run's folder; Lightning nests the run in it as lightning_logs/version_0
    run_ids = {run: run if run in got else f"{run}/lightning_logs/version_0" for run in LABELS}
    assert set(run_ids.values()) <= set(got)
    for run, e in LABELS.items():
        assert got[run_ids[run]] == (e["outcome"], e.get("onset"), e.get("kind")), run
    assert not diverse.problems().filter(pl.col("kind").str.starts_with("label")).height


def test_files_are_the_corpus_files_unchanged():
    rows = [line.split("\t") for line in MANIFEST.read_text().splitlines()[1:]]
    manifest = {path: (int(size), sha) for path, size, sha, *_ in rows}
    for run in LABELS:
        for f in sorted((DIVERSE / run).rglob("*")):
            if f.is_file():
                path = str(f.relative_to(DIVERSE))
                assert manifest[path] == (f.stat().st_size, hashlib.sha256(f.read_bytes()).hexdigest()), path


def test_labels_carry_the_family_attributes():
    for run, e in LABELS.items():
        assert e.keys() >= FAMILY_KEYS, run
        assert e["family"] == f"{e['trainer']}/{e['optimizer']}/{e['size']}"
        assert run.startswith(e["trainer"] + "/")


def test_heavy_clipping_clips_most_steps(diverse):
    run = hard("clip_0.25")
    assert LABELS[run]["clip"] == 0.25 and LABELS[run]["outcome"] == "healthy"
    g = series(diverse, run, "grad_norm")["value"]
    assert len(g) >= 20 and (g > 0.25).mean() > 0.5


def test_warm_restarts_put_the_lr_back_up(diverse):
    run = hard("warm_restarts")
    lr = series(diverse, run, "lr")["value"].to_list()
    decay = next(i for i in range(1, len(lr)) if lr[i] < lr[i - 1])  # past the warm-up
    jumps = [i for i in range(decay, len(lr)) if lr[i] > 3 * lr[i - 1]]
    assert len(jumps) >= 2  # a restart every third of the run
    assert all(lr[i] > 0.8 * max(lr) for i in jumps)  # back near the peak


def test_fp16_skips_come_early_and_the_run_ends_healthy(diverse):
    run = hard("fp16_skips")
    scale = series(diverse, run, "loss_scale")
    falls = scale.filter(pl.col("value").diff() < 0)["step"]
    assert len(falls) >= 3 and falls[0] <= 20
    assert LABELS[run]["loss_scale_falls"] == len(falls)
    assert math.isfinite(series(diverse, run, "loss")["value"][-1])


def test_recovered_spike_is_one_step(diverse):
    run = hard("recovered_spike")
    loss = series(diverse, run, "loss")
    at = int(LABELS[run]["note"].split("at step ")[1].split(":")[0])
    v = dict(loss.iter_rows())
    before = sorted(v[s] for s in range(at - 10, at))[5]
    assert v[at] > 1.5 * before and v[at + 5] < 1.1 * before


def test_resumed_run_restarts_from_its_last_checkpoint(diverse):
    run = hard("resumed")
    kill = int(LABELS[run]["note"].split("killed (no clean exit) at step ")[1].split(",")[0])
    edges = diverse.query(f"SELECT kind, parent_run, parent_step FROM lineage WHERE child_run = '{run}'")
    assert edges.rows() == [("resume", run, kill // 50 * 50)]


def test_divergence_onset_is_the_first_non_finite_loss(diverse):
    run = failed("divergence_nan")
    loss = series(diverse, run, "loss")
    first = loss.filter(~pl.col("value").is_finite())["step"][0]
    assert first == LABELS[run]["onset"]


def test_filtered_divergence_shows_in_the_grad_norm_not_the_loss(diverse):
    run = failed("divergence_nan_filtered")
    assert LABELS[run]["trainer"] == "hf"
    grad = series(diverse, run, "grad_norm")
    assert grad.filter(~pl.col("value").is_finite())["step"][0] == LABELS[run]["onset"]
    assert series(diverse, run, "loss")["value"].is_finite().all()  # the Trainer's NaN filter


def test_memory_blowup_onset_is_the_rss_jump(diverse):
    run = failed("memory_blowup")
    rss = series(diverse, run, "memory_gb")
    jump = rss.filter(pl.col("value").diff() > 3.0)["step"]
    assert jump.to_list() == [LABELS[run]["onset"]]
