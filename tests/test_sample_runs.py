"""The committed sample corpus: every run ingests, every labelled failure is visible in its data."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

SAMPLES = Path(__file__).parent.parent / "sample_runs"
LABELS = tomllib.loads((SAMPLES / "labels.toml").read_text())["runs"]


@pytest.fixture(scope="module")
def store(sample_runs_ingest):
    s, report = sample_runs_ingest
    assert report.problems == []
    return s


def value_at(store, run, tag, step):
    return store.query(
        f"SELECT value FROM scalars WHERE run_id = '{run}' AND tag = '{tag}' AND step = {step}"
    )["value"][0]


def test_corpus_shape_and_labels(store):
    outcomes = [v["outcome"] for v in LABELS.values()]
    assert len(LABELS) >= 12 and outcomes.count("healthy") >= 4 and outcomes.count("failed") >= 6
    labels = store.query("SELECT run_id, outcome, onset, kind, source FROM labels ORDER BY run_id")
    assert labels.height == len(LABELS) and set(labels["source"]) == {"manual"}
    for run_id, outcome, onset, _kind, _source in labels.rows():
        assert LABELS[run_id]["outcome"] == outcome and LABELS[run_id].get("onset") == onset
    assert sorted(store.query("SELECT run_id FROM runs")["run_id"]) == sorted(LABELS)
    assert sum(f.stat().st_size for f in SAMPLES.rglob("*") if f.is_file()) < 30e6


def test_nan_divergence_is_non_finite_at_its_onset(store):
    onset = LABELS["diverge_nan"]["onset"]
    loss = store.query(
        "SELECT step, value FROM scalars WHERE run_id = 'diverge_nan' AND tag = 'train/loss' ORDER BY step",
    )
    assert not any(v != v for v in loss.filter(loss["step"] < onset)["value"])  # finite before
    assert value_at(store, "diverge_nan", "train/loss", onset) != value_at(
        store, "diverge_nan", "train/loss", onset
    )
    assert store.query("SELECT status FROM runs WHERE run_id = 'diverge_nan'")["status"][0] == "diverged"


@pytest.mark.parametrize("run", ["spike_recovers", "spike_no_recovery"])
def test_spikes(store, run):
    onset = LABELS[run]["onset"]
    before = store.query(
        f"SELECT avg(value) m FROM scalars WHERE run_id = '{run}' AND tag = 'train/loss' AND step BETWEEN {onset - 20} AND {onset - 1}",
    )["m"][0]
    peak = store.query(
        f"SELECT max(value) m FROM scalars WHERE run_id = '{run}' AND tag = 'train/loss' AND step BETWEEN {onset} AND {onset + 5}",
    )["m"][0]
    end = store.query(
        f"SELECT avg(value) m FROM scalars WHERE run_id = '{run}' AND tag = 'train/loss' AND step >= 380",
    )["m"][0]
    assert peak > 1.8 * before
    assert (end < 1.3 * before) == (run == "spike_recovers")


def test_attention_collapse_p1_signals(store):
    onset = LABELS["attention_collapse"]["onset"]
    late = store.query(
        f"""SELECT max(value) FILTER (WHERE tag = 'attn_entropy') ent, max(value) FILTER (WHERE tag = 'train/grad_norm') gn
                        FROM scalars WHERE run_id = 'attention_collapse' AND step BETWEEN {onset + 60} AND 399""",
    ).row(0)
    assert late[0] < 0.3 and late[1] < 1e-5
    assert (
        store.query(
            "SELECT min(value) m FROM scalars WHERE run_id = 'healthy_seed0' AND tag = 'attn_entropy' AND step > 50",
        )["m"][0]
        > 1.0
    )


def test_dead_ffn_p2_signals(store):
    v = store.query(
        """SELECT max(value) FILTER (WHERE tag LIKE 'ffn_input_std/%') ffn, max(value) FILTER (WHERE tag LIKE 'ln_input_std/%') ln
                    FROM scalars WHERE run_id = 'representation_collapse' AND step >= 250""",
    ).row(0)
    assert v[0] < 0.005 and v[1] < 0.05


def test_overfit_eval_rises_while_train_falls(store):
    onset = LABELS["overfit"]["onset"]
    ev = store.query(
        "SELECT step, value FROM scalars WHERE run_id = 'overfit' AND tag = 'eval/loss' ORDER BY step"
    )
    best = ev.filter(ev["step"] == onset)["value"][0]
    assert best == ev["value"].min() and ev["value"][-1] > best * 1.2
    tr = store.query(
        f"SELECT avg(value) FILTER (WHERE step < {onset + 20}) a, avg(value) FILTER (WHERE step > 500) b FROM scalars WHERE run_id = 'overfit' AND tag = 'train/loss'",
    ).row(0)
    assert tr[1] < tr[0]


def test_fp16_overflow_storm_has_overflow_events_down_to_min_scale(store):
    ev = store.query(
        "SELECT kind, attrs FROM events WHERE run_id = 'fp16_overflow_storm' ORDER BY \"offset\""
    )
    overflows = [json.loads(a) for k, a in ev.rows() if k == "overflow"]
    assert (
        len(overflows) >= 10 and overflows[-1]["new_scale"] is None or overflows[-1]["attempted_scale"] <= 2
    )
    assert "min_loss_scale" in ev["kind"].to_list()
    scale = store.query(
        "SELECT step, value FROM scalars WHERE run_id = 'fp16_overflow_storm' AND metric = 'loss_scale' ORDER BY step",
    )
    assert scale.filter(scale["step"] == LABELS["fp16_overflow_storm"]["onset"]).height == 1
    assert scale["value"][-1] <= 2


def test_plateau_and_memory_jump(store):
    onset = LABELS["plateau"]["onset"]
    lr = value_at(store, "plateau", "train/lr", onset)
    assert lr < 1e-4
    rss = store.query(
        "SELECT step, value FROM scalars WHERE run_id = 'memory_jump' AND tag = 'memory/rss_gb' ORDER BY step",
    )
    jump = LABELS["memory_jump"]["onset"]
    assert rss.filter(rss["step"] == jump)["value"][0] - rss.filter(rss["step"] == jump - 1)["value"][0] > 3


def test_resumed_run_has_two_segments_and_its_checkpoint(store):
    seg = store.query(
        "SELECT segment, min(step) lo, max(step) hi FROM scalars_all WHERE run_id = 'resumed_after_kill' AND tag = 'train/loss' GROUP BY segment ORDER BY segment",
    ).rows()
    assert seg == [(0, 0, 229), (1, 200, 399)] or [s[1:] for s in seg] == [(0, 229), (200, 399)]
    assert (
        store.query(
            "SELECT count(*) n FROM scalars_all WHERE run_id = 'resumed_after_kill' AND tag = 'train/loss' AND superseded",
        )["n"][0]
        == 30
    )
    resume = store.query(
        "SELECT step, attrs FROM events WHERE run_id = 'resumed_after_kill' AND kind = 'resume'"
    )
    assert resume["step"].to_list() == [200]
    assert (
        200
        in store.query("SELECT step FROM checkpoints WHERE run_id = 'resumed_after_kill'")["step"].to_list()
    )


def test_recovery_restart_and_its_parent_checkpoint(store):
    rec = store.query(
        "SELECT step, attrs FROM events WHERE run_id = 'attention_collapse_recovery' AND kind = 'recovery'",
    )
    attrs = json.loads(rec["attrs"][0])
    assert attrs["pattern"] == "P1" and attrs["changes"]["lr"] == pytest.approx(0.0024)
    meta = [
        json.loads(m)
        for m in store.query("SELECT metadata FROM checkpoints WHERE run_id = 'attention_collapse_recovery'")[
            "metadata"
        ]
    ]
    assert meta and all(m["parent_run"] == "attention_collapse" and m["parent_step"] == 100 for m in meta)
    assert (
        store.query(
            "SELECT min(step) s FROM scalars WHERE run_id = 'attention_collapse_recovery' AND tag = 'train/loss'",
        )["s"][0]
        == 100
    )


def test_resumed_console_log_supersedes_the_killed_one(store):
    """Console logs carry no wall time: the resumed log (first step 200) follows the killed one."""
    rows = store.query(
        """SELECT source_file LIKE '%resume.stdout.log' AS resumed, count(*) n, count(*) FILTER (WHERE superseded_by = 'later') sup
                       FROM scalars_all WHERE run_id = 'resumed_after_kill' AND tag = 'train_loss' GROUP BY ALL ORDER BY resumed""",
    ).rows()
    assert rows == [(False, 230, 30), (True, 200, 0)]
