"""Text and JSON formats: run layouts, growing logs, gzip, malformed lines, aliases, samples->steps."""

from __future__ import annotations

import csv
import gzip
import json
import os
import time

from conftest import DATA, ingest_paths, q
from writers import tbx_scalars

REAL = DATA / "real_logs"
HELLO = (REAL / "deepspeed/hellodeepspeed_bert_zero1_fp16_console.log").read_text()


def settle(*paths):
    old = time.time() - 3600
    for p in paths:
        os.utime(p, (old, old))


def write_monitor_csv(folder, name, rows, header=True, mode="w"):
    """As deepspeed/monitor/csv_monitor.py writes it: header `step,<last name part>`, then rows."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (name.replace("/", "_").replace(" ", "_") + ".csv")
    with open(path, mode, newline="") as f:
        w = csv.writer(f)
        if header:
            w.writerow(["step", name.split("/")[-1]])
        w.writerows(rows)
    return path


def test_run_folder_with_many_sources_is_one_run(store, tmp_path):
    run = tmp_path / "runs/exp1"
    tbx_scalars(run / "tb", {"train/loss": [(s, 1.0) for s in range(5)]})
    with gzip.open(run / "metrics.jsonl.gz", "wt") as f:
        for s in range(5):
            f.write(json.dumps({"step": s, "loss": 2.0, "opt": {"grad_norm": 0.5}}) + "\n")
    (run / "stdout.log").write_text(HELLO)
    (run / "resume.stdout.log").write_text(HELLO.split("\n", 260)[-1])
    (run / "checkpoints").mkdir()
    (run / "checkpoints/ckpt_10.json").write_text(json.dumps({"step": 10, "sha256": "ab"}))
    ingest_paths(store, tmp_path / "runs")
    runs = q(store, "SELECT run_id, formats, files, segments FROM runs").rows()
    assert runs == [("exp1", "jsonl,tensorboard,text_log", 4, 4)]
    tags = set(q(store, "SELECT DISTINCT tag FROM scalars")["tag"])
    assert {"train/loss", "loss", "opt/grad_norm", "derived/loss_scale"} <= tags


def test_deepspeed_run_layout_and_samples_to_steps(store, tmp_path):
    run = tmp_path / "runs/ds_run"
    (run / "ckpt/global_step20").mkdir(parents=True)
    (run / "ckpt/latest").write_text("global_step20")
    (run / "ds_config.json").write_text(json.dumps({"train_batch_size": 32, "fp16": {"enabled": True}}))
    write_monitor_csv(
        run / "monitor_csv/job", "Train/Samples/train_loss", [(32 * s, 5.0 - s / 10) for s in range(1, 21)]
    )
    # a restarted job appends a second header and re-logs from step 10
    write_monitor_csv(
        run / "monitor_csv/job", "Train/Samples/train_loss", [(32 * s, 4.0) for s in range(10, 26)], mode="a"
    )
    tbx_scalars(run / "monitor_tb/job", {"Train/Samples/lr": [(32 * s, 1e-4) for s in range(1, 21)]})
    ingest_paths(store, tmp_path / "runs")
    assert q(store, "SELECT run_id FROM runs")["run_id"].to_list() == ["ds_run"]
    loss = q(
        store, "SELECT step, value, metric FROM scalars WHERE tag = 'Train/Samples/train_loss' ORDER BY step"
    )
    assert loss["step"].to_list() == list(range(1, 26))  # samples / train_batch_size
    assert loss.filter(loss["step"] >= 10)["value"].unique().to_list() == [4.0]  # the restart supersedes
    assert loss["metric"][0] == "loss"
    samples = q(store, "SELECT step, value FROM scalars WHERE tag = 'samples' ORDER BY step")
    assert samples.row(0) == (1, 32.0)
    config = json.loads(q(store, "SELECT config FROM runs")["config"][0])
    assert config["ds_config"]["train_batch_size"] == 32
    ckpt = q(store, "SELECT run_id, step, kind, metadata FROM checkpoints").rows()
    assert ckpt == [("ds_run", 20, "deepspeed", '{"latest": true}')]


def test_torch_checkpoints_with_metadata_beside_them(store, tmp_path):
    run = tmp_path / "r/exp"
    tbx_scalars(run, {"loss": [(0, 1.0)]})
    (run / "checkpoints").mkdir()
    (run / "checkpoints/ckpt_100.pt").write_bytes(b"x" * 1000)
    (run / "checkpoints/ckpt_100.json").write_text(
        json.dumps({"step": 100, "sha256": "ab12", "parent_run": "exp0"})
    )
    (run / "checkpoints/step_200.pt").write_bytes(b"y" * 10)
    ingest_paths(store, tmp_path / "r")
    rows = q(store, "SELECT run_id, step, kind, size, metadata FROM checkpoints ORDER BY step").rows()
    assert [r[:4] for r in rows] == [("exp", 100, "torch", 1000), ("exp", 200, "torch", 10)]
    assert json.loads(rows[0][4]) == {"parent_run": "exp0", "sha256": "ab12", "step": 100}
    (run / "checkpoints/ckpt_100.pt").unlink()  # rotated away
    (run / "checkpoints/ckpt_100.json").unlink()
    ingest_paths(store, tmp_path / "r")
    assert q(store, "SELECT step FROM checkpoints")["step"].to_list() == [200]


def test_monitor_csv_without_config_keeps_samples_and_says_so(store, tmp_path):
    write_monitor_csv(tmp_path / "r/monitor_csv/job", "Train/Samples/train_loss", [(64, 1.0), (128, 0.9)])
    ingest_paths(store, tmp_path / "r")
    assert q(store, "SELECT step FROM scalars ORDER BY step")["step"].to_list() == [64, 128]
    assert "samples" in q(store, "SELECT note FROM files")["note"][0]


def test_growing_console_log_resumes_with_its_state(store, tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    log = run / "stdout.log"
    lines = HELLO.splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if "OVERFLOW" in line) + 3  # mid overflow storm
    log.write_text("".join(lines[:cut]) + "partial line without newline")
    ingest_paths(store, run)
    assert (
        q(store, "SELECT count(*) n FROM events WHERE kind = 'overflow'")["n"][0] == 0
    )  # waiting for their step
    log.write_text("".join(lines))
    settle(log)
    r = ingest_paths(store, run)
    assert r.files_read == 1
    ev = q(store, "SELECT step FROM events WHERE kind = 'overflow' ORDER BY \"offset\"")
    assert ev["step"].to_list() == [10] * 10 + [20] * 7  # same as reading the whole file at once
    lines_seen = q(store, 'SELECT max("offset") m FROM events')["m"][0]
    assert lines_seen > cut  # line numbers continue across ingests
    assert q(store, "SELECT count(*) n FROM scalars_all WHERE tag = 'skipped'")["n"][0] == 5


def test_malformed_jsonl_lines_are_reported_with_line_numbers(store, tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        '{"step": 0, "loss": 1.0}\n{"step": 1, "loss": NaN}\nnot json at all\n[1, 2]\n{"step": 3, "loss": "0.50", "lr": Infinity}\n'
    )
    r = ingest_paths(store, run)
    assert [(p.offset, p.kind) for _, p in r.problems] == [(3, "bad_json"), (4, "bad_json")]
    df = q(store, "SELECT tag, step, value FROM scalars ORDER BY tag, step")
    rows = df.rows()
    assert rows[0] == ("loss", 0, 1.0) and rows[1][:2] == ("loss", 1) and rows[1][2] != rows[1][2]
    assert rows[2] == ("loss", 3, 0.5) and rows[3] == ("lr", 3, float("inf"))


def test_user_aliases_from_workbench_toml(tmp_path, monkeypatch):
    from workbench.store import Store

    store = Store(tmp_path / "store")
    tbx_scalars(tmp_path / "r", {"my_model/xent": [(0, 1.0)], "train/loss": [(0, 1.0)]})
    ingest_paths(store, tmp_path / "r")
    assert dict(q(store, "SELECT tag, metric FROM scalars").rows())["my_model/xent"] is None
    (store.root / "workbench.toml").write_text('[aliases]\nloss = ["my_model/*"]\n')
    assert dict(q(store, "SELECT tag, metric FROM scalars").rows()) == {
        "my_model/xent": "loss",
        "train/loss": "loss",
    }


def test_events_from_text(store, tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "train.log").write_text(
        "[2024-01-01 00:00:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] step=100, skipped=0, lr=[0.001], mom=[[0.9, 0.999]]\n"
        "[150] RECOVERY TRIGGERED: P1 - {'lr': 0.0008, 'warmup': 0.01}\n"
        "[2024-01-01 00:00:01,000] [INFO] [engine.py:1:load] Begin Load checkpoint from /ckpt/global_step100\n"
        "Traceback (most recent call last):\n"
        '  File "train.py", line 1, in <module>\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
        "[E ProcessGroupNCCL.cpp:1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1) ran for 1800000 milliseconds before timing out.\n"
        "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.\n"
    )
    settle(run / "train.log")
    ingest_paths(store, run)
    ev = q(store, 'SELECT step, kind, message, attrs FROM events ORDER BY "offset"')
    kinds = ev["kind"].to_list()
    assert kinds == ["recovery", "resume", "oom", "text", "min_loss_scale"]
    rec = json.loads(ev["attrs"][0])
    assert ev["step"][0] == 150 and rec == {"pattern": "P1", "changes": {"lr": 0.0008, "warmup": 0.01}}
    assert ev["step"][1] == 100 and json.loads(ev["attrs"][1])["path"] == "/ckpt/global_step100"
    assert "CUDA out of memory" in ev["message"][2]
    assert json.loads(ev["attrs"][3])["reason"] == "nccl_timeout"
    status = q(store, "SELECT status, evidence FROM runs").row(0)
    assert status[0] == "diverged" and "minimum" in status[1]
    mom = q(store, "SELECT value FROM scalars WHERE tag = 'mom'")["value"].to_list()
    assert mom == [0.9]


def test_auto_labels_from_evidence_and_manual_override(store, tmp_path):
    tbx_scalars(
        tmp_path / "r/nan_run", {"train/loss": [(0, 2.0), (1, 1.5), (2, float("nan")), (3, float("nan"))]}
    )
    tbx_scalars(tmp_path / "r/fine", {"train/loss": [(0, 2.0), (1, 1.5)]})
    tbx_scalars(tmp_path / "r/labelled", {"train/loss": [(0, 2.0), (1, float("inf"))]})
    (tmp_path / "r/labels.toml").write_text(
        '[runs."labelled"]\noutcome = "healthy"\nnote = "inf was a logging bug"\n'
        '[runs."broken"]\noutcome = "maybe"\n'
    )
    r = ingest_paths(store, tmp_path / "r")
    assert [p.kind for _, p in r.problems] == ["bad_label"]
    labels = q(store, "SELECT run_id, outcome, onset, kind, source FROM labels ORDER BY run_id").rows()
    assert labels == [
        ("labelled", "healthy", None, None, "manual"),
        ("nan_run", "failed", 2, "divergence_nan", "auto"),
    ]
