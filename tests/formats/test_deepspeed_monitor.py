"""DeepSpeed monitor CSVs (samples on the x axis) with and without their ds_config."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import SAMPLE_RUNS, ingest_paths
from real_samples import write_monitor_csv
from writers import tbx_scalars


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
    assert store.query("SELECT run_id FROM runs")["run_id"].to_list() == ["ds_run"]
    loss = store.query(
        "SELECT step, value, metric FROM scalars WHERE tag = 'Train/Samples/train_loss' ORDER BY step"
    )
    assert loss["step"].to_list() == list(range(1, 26))  # samples / train_batch_size
    assert loss.filter(loss["step"] >= 10)["value"].unique().to_list() == [4.0]  # the restart supersedes
    assert loss["metric"][0] == "loss"
    samples = store.query("SELECT step, value FROM scalars WHERE tag = 'samples' ORDER BY step")
    assert samples.row(0) == (1, 32.0)
    config = json.loads(store.query("SELECT config FROM runs")["config"][0])
    assert config["ds_config"]["train_batch_size"] == 32
    ckpt = store.query("SELECT run_id, step, kind, metadata FROM checkpoints").rows()
    assert ckpt == [("ds_run", 20, "deepspeed", '{"latest": true}')]


def test_monitor_csv_without_config_keeps_samples_and_says_so(store, tmp_path):
    write_monitor_csv(tmp_path / "r/monitor_csv/job", "Train/Samples/train_loss", [(64, 1.0), (128, 0.9)])
    ingest_paths(store, tmp_path / "r")
    assert store.query("SELECT step FROM scalars ORDER BY step")["step"].to_list() == [64, 128]
    assert "samples" in store.query("SELECT note FROM files")["note"][0]


@pytest.mark.parametrize("batch", ["1e30", str(2**64), "Infinity"])
def test_an_absurd_batch_size_is_a_note_and_the_csv_keeps_its_samples(store, tmp_path, batch):
    """A real DeepSpeed monitor CSV beside a ds_config whose train_batch_size no job reaches."""
    real = SAMPLE_RUNS / "healthy_deepspeed_fp16/monitor_csv/job/Train_Samples_lr.csv"
    rows = [ln.split(",") for ln in real.read_text().splitlines()[1:] if ln]
    run = tmp_path / "runs/ds"
    shutil.copytree(real.parent, run / "monitor_csv/job")
    (run / "ds_config.json").write_text('{"train_batch_size": ' + batch + ', "fp16": {"enabled": true}}')
    ingest_paths(store, tmp_path / "runs")
    lr = store.query("SELECT step, value FROM scalars WHERE tag = 'Train/Samples/lr' ORDER BY step")
    assert lr.rows() == [(int(x), float(v)) for x, v in rows]  # every point, on its samples axis
    note = store.query("SELECT note FROM files WHERE path LIKE '%Train_Samples_lr.csv'")["note"][0]
    assert "out of range" in note and "samples" in note
    assert store.query("SELECT count(*) AS n FROM problems")["n"][0] == 0
