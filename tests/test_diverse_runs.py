"""The runs of the diverse corpus kept in tests/data/diverse (PROVENANCE.md there): each is
ingested with the label and family attributes of its labels.toml entry, and its own logs show
what its label says: the hard negatives really clip, restart their lr, skip fp16 steps, resume
and spike, and each failed run's onset is where its physical criterion puts it."""

from __future__ import annotations

import math
import tomllib

import polars as pl
import pytest
from conftest import DATA, ingest_paths, q

from workbench.store import Store

DIVERSE = DATA / "diverse"
LABELS: dict[str, dict] = tomllib.loads((DIVERSE / "labels.toml").read_text())["runs"]
FAMILY_KEYS = {"trainer", "optimizer", "size", "arch", "clip", "schedule", "precision", "dataset", "tags", "family"}


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
    return q(
        store,
        f"SELECT step, arg_max(value, wall_time) AS value FROM scalars WHERE run_id = '{run}' "
        f"AND metric = '{metric}' GROUP BY step ORDER BY step",
    )


def test_every_run_is_ingested_with_its_label(diverse):
    got = q(diverse, "SELECT run_id, outcome, onset, kind FROM labels").rows_by_key("run_id", unique=True)
    assert set(LABELS) <= set(got)
    for run, e in LABELS.items():
        assert got[run] == (e["outcome"], e.get("onset"), e.get("kind")), run


def test_labels_carry_the_family_attributes():
    for run, e in LABELS.items():
        assert FAMILY_KEYS <= e.keys(), run
        assert e["family"] == f"{e['trainer']}/{e['optimizer']}/{e['size']}"
        assert run.startswith(e["trainer"] + "/")


def test_heavy_clipping_clips_most_steps(diverse):
    run = hard("clip_0.25")
    assert LABELS[run]["clip"] == 0.25 and LABELS[run]["outcome"] == "healthy"
    g = series(diverse, run, "grad_norm")["value"]
    assert len(g) > 50 and (g > 0.25).mean() > 0.5


def test_warm_restarts_put_the_lr_back_up(diverse):
    run = hard("warm_restarts")
    lr = series(diverse, run, "lr")["value"].to_list()
    jumps = [i for i in range(1, len(lr)) if lr[i] > 3 * lr[i - 1]]
    assert len(jumps) == 2  # restarts at a third and two thirds of the run


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


def test_resumed_run_has_two_writers_overlapping(diverse):
    run = hard("resumed")
    kill = int(LABELS[run]["note"].split("killed (no clean exit) at step ")[1].split(",")[0])
    files = q(diverse, f"SELECT files FROM runs WHERE run_id = '{run}'")["files"][0]
    assert files >= 2
    steps = q(diverse, f"SELECT step, count(DISTINCT wall_time) AS n FROM scalars WHERE run_id = '{run}' AND metric = 'loss' GROUP BY step")
    redone = steps.filter(pl.col("n") > 1)["step"]
    assert redone.min() >= kill // 50 * 50 and redone.max() < kill  # from the checkpoint to the kill


def test_divergence_onset_is_the_first_non_finite_loss(diverse):
    run = failed("divergence_nan")
    loss = series(diverse, run, "loss")
    first = loss.filter(~pl.col("value").is_finite())["step"][0]
    assert first == LABELS[run]["onset"]
