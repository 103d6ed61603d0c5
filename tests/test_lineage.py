"""Lineage from files alone: resumes, recovery restarts, forks; stitched series; changed checkpoints."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from conftest import DATA, cli, ingest_paths
from real_counts import REAL, expected, real_tree_store
from writers import tbx_scalars

from ingest import lineage
from workbench.store import Store

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def samples(sample_runs_store):
    return sample_runs_store  # lineage is only read


def test_sample_runs_edges(samples):
    edges = samples.query(
        "SELECT child_run, child_segment, parent_run, parent_step, kind, changes FROM lineage ORDER BY child_run",
    ).rows()
    assert [e[:5] for e in edges] == [
        ("attention_collapse_recovery", 0, "attention_collapse", 100, "recovery"),
        ("deepspeed_resumed_after_kill", 2, "deepspeed_resumed_after_kill", 200, "resume"),
        ("resumed_after_kill", 1, "resumed_after_kill", 200, "resume"),
    ]
    assert json.loads(edges[0][5]) == {
        "clip": 0.7,
        "lr": pytest.approx(0.0024),
        "warmup": 0.01,
        "weight_decay": 0.012,
    }
    ev = samples.query("SELECT evidence FROM lineage WHERE child_run = 'resumed_after_kill'")["evidence"][0]
    assert "restarts at step 200 <= previous segment's last step 229" in ev and "loading checkpoint" in ev


def test_recovered_status_keeps_the_failed_label(samples):
    row = samples.query(
        "SELECT status, recovered_by, evidence FROM runs WHERE run_id = 'attention_collapse'"
    ).row(0)
    assert row[0] == "recovered" and row[1] == "attention_collapse_recovery" and "ended healthy" in row[2]
    assert (
        samples.query("SELECT outcome FROM labels WHERE run_id = 'attention_collapse'")["outcome"][0]
        == "failed"
    )


def test_stitched_series_along_the_recovery(samples):
    con = samples.connect()
    s = lineage.stitched(con, "attention_collapse_recovery", "loss")
    assert s.height == 400 and s["step"].to_list() == list(range(400))  # no duplicate steps
    assert s.group_by("run_id").len().sort("run_id").rows() == [
        ("attention_collapse", 100),
        ("attention_collapse_recovery", 300),
    ]
    assert lineage.path_to(con, "attention_collapse_recovery") == [
        ("attention_collapse", 100),
        ("attention_collapse_recovery", None),
    ]


def test_real_samples_have_checkpoints_and_no_false_edges(tmp_path):
    store = Store(tmp_path / "s")
    ingest_paths(store, DATA / "real_logs/hf_trainer")
    assert store.query("SELECT count(*) n FROM lineage")["n"][0] == 0  # checkpoint-500/-8500 are the same run
    assert store.query("SELECT step FROM checkpoints ORDER BY step")["step"].to_list() == [500, 8500]


def test_hf_output_dir_resumed_into_a_second_runs_folder(tmp_path):
    out = tmp_path / "runs/hf_out"
    tbx_scalars(out / "runs/Nov30_12-00-00_host", {"train/loss": [(s, 1.0) for s in range(0, 300, 10)]})
    time.sleep(1.1)
    tbx_scalars(out / "runs/Nov30_13-05-10_host", {"train/loss": [(s, 0.5) for s in range(200, 500, 10)]})
    (out / "checkpoint-200").mkdir()
    (out / "checkpoint-200/trainer_state.json").write_text(
        json.dumps({"global_step": 200, "log_history": []})
    )
    store = Store(tmp_path / "s")
    ingest_paths(store, tmp_path / "runs")
    assert store.query(
        "SELECT child_run, child_segment, parent_step, kind, parent_checkpoint LIKE '%checkpoint-200' c FROM lineage",
    ).rows() == [("hf_out", 1, 200, "resume", True)]


def test_fork_from_another_runs_checkpoint(tmp_path):
    a = tmp_path / "runs/base"
    tbx_scalars(a, {"loss": [(s, 1.0) for s in range(0, 100)]})
    (a / "checkpoints").mkdir()
    (a / "checkpoints/ckpt_60.json").write_text(json.dumps({"step": 60}))
    tbx_scalars(tmp_path / "runs/finetune", {"loss": [(s, 0.5) for s in range(60, 120)]})
    store = Store(tmp_path / "s")
    ingest_paths(store, tmp_path / "runs")
    assert store.query("SELECT child_run, parent_run, parent_step, kind FROM lineage").rows() == [
        ("finetune", "base", 60, "fork")
    ]


def test_changed_checkpoint_is_reported_on_reingest(tmp_path):
    run = tmp_path / "runs/r"
    tbx_scalars(run, {"loss": [(0, 1.0)]})
    (run / "checkpoints").mkdir()
    weights = run / "checkpoints/ckpt_10.pt"
    weights.write_bytes(b"a" * 100)
    import hashlib

    digest = hashlib.sha256(b"a" * 100).hexdigest()
    (run / "checkpoints/ckpt_10.json").write_text(json.dumps({"step": 10, "sha256": digest}))
    store = Store(tmp_path / "s")
    r1 = ingest_paths(store, tmp_path / "runs", hash_checkpoints=True)
    assert r1.problems == [] and store.query("SELECT sha256 FROM checkpoints")["sha256"][0] == digest
    weights.write_bytes(b"b" * 100)  # same size, new content
    os.utime(weights, (time.time() + 5, time.time() + 5))
    r2 = ingest_paths(store, tmp_path / "runs", hash_checkpoints=True)
    assert [p.kind for _, p in r2.problems] == ["checkpoint_changed", "checkpoint_mismatch"]
    changed, mismatch = (p.message for _, p in r2.problems)
    assert "sha256 differs" in changed
    assert mismatch.startswith("ckpt_10.pt (sha256 ") and "ckpt_10.json" in mismatch
    r3 = ingest_paths(store, tmp_path / "runs", hash_checkpoints=True)  # reported once
    assert r3.problems == [] and store.query("SELECT count(*) n FROM problems")["n"][0] == 2


def test_lineage_cli_tree_and_stitch(samples):
    tree = cli("lineage", "attention_collapse_recovery", store=samples)
    assert (
        tree.exit_code == 0
        and "recovery from step 100" in tree.stdout
        and "attention_collapse recovered" in tree.stdout
    )
    csv = cli("lineage", "attention_collapse_recovery", "--stitch", "loss", "--format", "csv", store=samples)
    lines = csv.stdout.splitlines()
    assert lines[0] == "step,value,run_id,hop" and len(lines) == 401


def test_backtest_reports_recovery_outcomes_per_rule(samples):
    from detectors.backtest import Settings, backtest
    from detectors.rules import Rule

    rules = [
        Rule("spike", "loss > mean(loss, 100) + 3 * std(loss, 100)"),
        Rule("p1", "grad_norm < 1e-5 and attn_entropy < 0.3", for_steps=5),
        Rule("early", "loss > 0"),
    ]
    # one backtest for the three (a rule's row is scored from its own alarms alone)
    by_rule = {
        r["rule"]: r for r in backtest(samples, rules, None, Settings(bootstrap=0), predictors=False).rules
    }
    # the spike alarm at 153 came after the recovery trigger (150); P1 at 214 too: neither preceded it
    assert (by_rule["p1"]["recoveries_after_alarm"], by_rule["p1"]["recoveries_healthy"]) == (0, 0)
    # every recovery follows its first alarm: the restart with a changed config as a new run is
    # manual; the two runs resumed inside themselves from an earlier checkpoint are automatic
    e = by_rule["early"]
    assert (e["recoveries_after_alarm"], e["recoveries_healthy"]) == (3, 3)
    assert (e["recoveries_manual"], e["recoveries_manual_healthy"]) == (1, 1)
    assert (e["recoveries_automatic"], e["recoveries_automatic_healthy"]) == (2, 2)


def test_deepspeed_resumed_in_its_folder_right_after_a_save(tmp_path_factory):
    """d11: DeepSpeed killed right after saving global_step150, resumed in the same folder by a
    second process; no step is logged by both. The second console's checkpoint load (its model
    states read twice, then the optimizer's) is one resume event, and the lineage edge."""
    store = real_tree_store(tmp_path_factory, {"ds": "defects/d11_deepspeed_resume_after_ckpt150"})
    loads = expected("defects/d11_deepspeed_resume_after_ckpt150/resume.stdout.log")["_checkpoint_loads"]
    assert len(loads) == 3 and {load["step"] for load in loads} == {150}
    resumes = store.query("SELECT step, source_file, \"offset\" FROM events WHERE kind = 'resume'").rows()
    assert len(resumes) == 1
    step, source, line = resumes[0]
    assert step == 150 and source.endswith("/resume.stdout.log") and line == loads[0]["line"]
    segment = store.query(f"SELECT segment FROM files WHERE path = '{source}'")["segment"][0]
    edges = store.query(
        "SELECT child_run, child_segment, parent_run, parent_step, parent_checkpoint, kind FROM lineage",
    )
    assert [e[:4] + e[5:] for e in edges.rows()] == [("ds", segment, "ds", 150, "resume")]
    assert edges["parent_checkpoint"][0].endswith("/ckpt/global_step150")


def test_checkpoint_copies_are_checked_on_first_sight_and_reported_once(tmp_path_factory):
    """d16: a torch loop saved ckpt_N.pt with a metadata JSON (sha256, size) and a .tar.zst copy,
    then overwrote ckpt_100.pt at step 150. The three copies of a checkpoint are one row; with
    --hash the first ingest says which copy disagrees, and later ingests do not say it again."""
    root = tmp_path_factory.mktemp("d16") / "runs"
    store = Store(root.parent / "store")
    shutil.copytree(REAL / "defects/d16_checkpoint_sha_mismatch", root / "loop")
    counted = expected("defects/d16_checkpoint_sha_mismatch/checkpoints")
    first = ingest_paths(store, root, hash_checkpoints=True)
    assert [(Path(path).name, p.kind) for path, p in first.problems] == [
        ("ckpt_100.pt", "checkpoint_mismatch")
    ]
    message = first.problems[0][1].message
    bad, good = counted["ckpt_100"]["file_sha256"], counted["ckpt_100"]["metadata_sha256"]
    assert good == counted["ckpt_100"]["archive_sha256"] != bad
    assert message.startswith(f"ckpt_100.pt (sha256 {bad[:12]}...) disagrees with ")
    assert "ckpt_100.tar.zst" in message and "ckpt_100.json" in message and good[:12] in message
    rows = store.query("SELECT path, step, sha256, copies, verified FROM checkpoints ORDER BY step").rows()
    assert [(Path(r[0]).name, r[1]) for r in rows] == [("ckpt_100.pt", 100), ("ckpt_200.pt", 200)]
    for (_, step, sha, copies, verified), name in zip(rows, ("ckpt_100", "ckpt_200"), strict=True):
        archive = next(c for c in json.loads(copies) if c["kind"] == "archive")
        assert sha == counted[name]["file_sha256"] and archive["sha256"] == counted[name]["archive_sha256"]
        assert verified.startswith("mismatch: " if step == 100 else "ok: ")
    for _ in range(2):
        again = ingest_paths(store, root, hash_checkpoints=True)
        assert again.problems == []
        assert store.query("SELECT kind FROM problems").rows() == [("checkpoint_mismatch",)]


def test_derived_tables_in_order_a_failed_hook_keeps_the_last_table(tmp_path):
    """The commit's hooks run in order on one set of views: the agreement hook reads the lineage
    written just before it, and a hook that fails keeps the last table and says why."""
    import polars as pl

    from workbench.store import schema

    tbx_scalars(tmp_path / "runs/a", {"loss": [(0, 1.0), (1, 0.5)]})
    store = Store(tmp_path / "s")
    ingest_paths(store, tmp_path / "runs")
    edge = {"child_run": "a", "child_segment": 1, "parent_run": "a", "parent_step": 1}
    edge |= {"parent_checkpoint": None, "kind": "resume", "evidence": "test", "changes": None}
    seen = []

    def one_edge(con, before, changed):
        return pl.DataFrame([edge], schema=schema.LINEAGE)

    def probe(con, before, changed):
        seen.append(con.sql("SELECT child_run, kind FROM lineage").fetchall())
        return before

    def boom(con, before, changed):
        raise RuntimeError("boom")

    # each commit changes a table (a commit of unchanged tables carries the derived ones over)
    with store.writer() as w:
        w.add("roots", [{"root": str(tmp_path / "elsewhere")}])
        w.commit(derive={"lineage": one_edge, "agreement": probe})
    assert seen == [[("a", "resume")]]
    with store.writer() as w:
        w.add("roots", [{"root": str(tmp_path / "elsewhere too")}])
        w.commit(derive={"lineage": boom, "agreement": probe})
        assert w.derive_errors == {"lineage": "RuntimeError: boom"}
    assert seen[-1] == [("a", "resume")]  # the last lineage, carried over
    assert store.lineage()["kind"].to_list() == ["resume"]
