"""Every point on its true step, on real logs of tool versions the readers were not written
against (the sample runs made with DeepSpeed 0.19, transformers 5, Keras 3, TRL), each count
checked against an independent reader (json, csv, re, tbparse) — never the workbench."""

from __future__ import annotations

import csv
import functools
import json
import re
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from conftest import ingest_paths
from real_counts import expected, real_tree_store
from real_samples import SAMPLES, sample_store
from tbparse import SummaryReader
from writers import tbx_scalars

from workbench.store import Store

RUNS = [
    "deepspeed_resumed_after_kill",
    "deepspeed_default_log_level",
    "hf_diverge_nan_filtered",
    "keras_csvlogger_appended",
    "trl_sft_console",
    "healthy_deepspeed_fp16",
]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return sample_store(tmp_path_factory, RUNS)


def steps(store, run, tag, view="scalars", source=None):
    """The steps of `tag` in `view` (of one `source`), in order."""
    rows = _rows(store, store.current_generation().name, view, run).get(tag, [])
    return [step for step, src in rows if source is None or src == source]


@functools.cache
def _rows(store, generation, view, run):
    """(step, source) by tag of one run, asked once per generation of the store."""
    out = {}
    source = "source" if view == "scalars_all" else "NULL"  # `scalars` has one source per point
    for tag, step, src in store.query(
        f"SELECT tag, step, {source} FROM {view} WHERE run_id = '{run}' ORDER BY tag, step"
    ).rows():
        out.setdefault(tag, []).append((step, src))
    return out


def ds_steps(path: Path) -> list[int]:
    return [int(m[1]) for m in re.finditer(r"\] step=(\d+), skipped=", path.read_text())]


def test_resumed_deepspeed_console_is_kept_and_ordered_by_its_timestamps(store):
    run = "deepspeed_resumed_after_kill"
    first, second = ds_steps(SAMPLES / run / "stdout.log"), ds_steps(SAMPLES / run / "resume.stdout.log")
    assert first[0] == second[0] == 0 and second[1] == 210  # both consoles start with the engine's step=0
    files = dict(
        store.query(f"SELECT path, segment FROM files WHERE run_id = '{run}' AND format = 'text_log'").rows()
    )
    seg = {Path(p).name: s for p, s in files.items()}
    assert seg["stdout.log"] < seg["resume.stdout.log"]  # by first timestamp, not by path
    # the resumed console's step=0 report came before its checkpoint load: dropped; the rest kept
    assert steps(store, run, "skipped", "scalars_all", "text_log") == sorted(first + second[1:])
    current = steps(store, run, "skipped")
    assert current == sorted(set(first) | set(second[1:])) and current[-1] == 400
    # the killed process's steps 210..230 are superseded by the resumed one's, nothing else
    sup = store.query(
        f"SELECT step FROM scalars_all WHERE run_id = '{run}' AND tag = 'skipped' AND superseded"
    )
    assert sup["step"].to_list() == [210, 220, 230]


def test_throughput_lines_take_the_engine_step_after_a_resume(store):
    run = "deepspeed_resumed_after_kill"
    text = (SAMPLES / run / "resume.stdout.log").read_text()
    timer_steps = [int(m) for m in re.findall(r"global_step=(\d+), RunningAvg", text)]
    assert timer_steps[0] == 10  # the throughput timer restarts at 0 in the resumed process
    resumed = store.query(
        f"SELECT step FROM scalars_all WHERE run_id = '{run}' AND tag = 'CurrSamplesPerSec' "
        "AND source_file LIKE '%resume.stdout.log' ORDER BY step",
    )["step"].to_list()
    assert resumed == list(range(210, 401, 10)) and len(resumed) == len(timer_steps)


def test_deepspeed_monitor_series_land_on_optimizer_steps(store):
    for run, per_step in (("deepspeed_resumed_after_kill", 16), ("deepspeed_default_log_level", 32)):
        with open(SAMPLES / run / "monitor_csv/job/Train_Samples_lr.csv", newline="") as f:
            samples = sorted({int(r[0]) for r in csv.reader(f) if r and r[0] != "step"})
        assert (
            steps(store, run, "Train/Samples/lr", "scalars_all", "deepspeed_monitor_csv")[-1]
            == samples[-1] // per_step
        )
        tb = SummaryReader(str(SAMPLES / run / "monitor_tb")).scalars
        tb_steps = sorted(set(tb[tb["tag"] == "Train/Samples/lr"]["step"] // per_step))
        stored = sorted(set(steps(store, run, "Train/Samples/lr", "scalars_all", "tensorboard")))
        assert stored == tb_steps == list(range(1, 401))
        # the monitor, the JSONL and the console agree on lr: one current row per step
        lr = store.query(f"SELECT step FROM scalars WHERE run_id = '{run}' AND metric = 'lr' ORDER BY step")
        assert lr["step"].to_list() == list(range(0 if run == "deepspeed_resumed_after_kill" else 1, 401))
    note = store.query(
        "SELECT note FROM files WHERE path LIKE '%default_log_level/monitor_csv/job/Train_Samples_lr.csv'",
    )
    assert "16 x 2 gradient accumulation x world size 1 (assumed" in note["note"][0]


def test_deepspeed_at_the_default_log_level_counts_steps_from_its_timers(store):
    run = "deepspeed_default_log_level"
    lines = (SAMPLES / run / "stdout.log").read_text().splitlines()
    assert not any("step=" in line for line in lines)
    # independently: a step closes at each global timer line; other timers belong to the step they precede
    step, expected = 0, []
    for line in lines:
        if "time (ms)" not in line:
            continue
        if "| fwd:" in line:
            step += 1
        elif "optimizer_step" in line:
            expected.append(step + 1)
    assert step == 400
    assert steps(store, run, "time/step") == list(range(1, 401))
    assert steps(store, run, "time/optimizer_step") == expected and len(expected) == 394
    note = store.query(f"SELECT note FROM files WHERE run_id = '{run}' AND format = 'text_log'")["note"][0]
    assert "counted from DeepSpeed's global timer lines" in note


def test_hf_train_entries_with_token_counts_are_kept(store):
    run = "hf_diverge_nan_filtered"
    state = json.loads((SAMPLES / run / "trainer_state.json").read_text())
    train = [e for e in state["log_history"] if "loss" in e]
    assert all("train_runtime" in e and "num_input_tokens_seen" in e for e in train)
    for key in ("loss", "grad_norm", "learning_rate", "train_tokens_per_second"):
        assert steps(store, run, key, "scalars_all", "hf_trainer") == [e["step"] for e in train]
    nan = store.query(
        f"SELECT count(*) n FROM scalars WHERE run_id = '{run}' AND tag = 'grad_norm' AND isnan(value)",
    )["n"][0]
    assert nan == sum(1 for e in train if e["grad_norm"] != e["grad_norm"]) == 24
    config = json.loads(store.query(f"SELECT config FROM runs WHERE run_id = '{run}'")["config"][0])
    assert config["trainer_summary"]["train_loss"] == pytest.approx(state["log_history"][-1]["train_loss"])


def test_a_divergence_hidden_by_the_nan_filter_is_diverged(store):
    status, evidence = store.query(
        "SELECT status, evidence FROM runs WHERE run_id = 'hf_diverge_nan_filtered'"
    ).row(0)
    assert status == "diverged" and evidence.startswith("grad_norm is NaN from step 185")


def test_console_dicts_without_a_step_are_counted_by_logging_steps(store):
    for run, n_train in (("hf_diverge_nan_filtered", 60), ("trl_sft_console", 20)):
        state = json.loads((SAMPLES / run / "trainer_state.json").read_text())
        train_steps = [e["step"] for e in state["log_history"] if "loss" in e]
        assert len(train_steps) == n_train
        assert steps(store, run, "loss", "scalars_all", "text_log") == train_steps
        eval_steps = [e["step"] for e in state["log_history"] if "eval_loss" in e]
        assert steps(store, run, "eval_loss", "scalars_all", "text_log") == eval_steps
        note = store.query(f"SELECT note FROM files WHERE run_id = '{run}' AND format = 'text_log'")["note"][
            0
        ]
        assert "x logging_steps 5" in note


def test_keras_csvlogger_appended_fits_continue_the_step_axis(store):
    run = "keras_csvlogger_appended"
    with open(SAMPLES / run / "training.log", newline="") as f:
        rows = list(csv.DictReader(f))
    epochs = [int(r["epoch"]) for r in rows]
    assert epochs == [0, 1, 2, 3] * 3
    loss = store.query(
        f"SELECT step, value FROM scalars WHERE run_id = '{run}' AND tag = 'loss' ORDER BY step"
    )
    assert loss["step"].to_list() == list(range(12))
    assert loss["value"].to_list() == [float(r["loss"]) for r in rows]
    assert steps(store, run, "epoch") == list(range(12))
    restarts = store.query(
        f"SELECT step FROM events WHERE run_id = '{run}' AND kind = 'restart' ORDER BY step"
    )
    assert restarts["step"].to_list() == [4, 8]


def test_every_sample_run_agrees_with_itself_across_sources(sample_runs_store):
    store = sample_runs_store
    verdicts = store.query("SELECT run_id, metric, source_a, source_b, verdict, agree FROM agreement")
    assert verdicts.height > 50
    bad = verdicts.filter(~verdicts["verdict"].is_in(["ok", "few"]))
    assert bad.is_empty(), bad
    assert verdicts.filter(verdicts["verdict"] == "ok")["agree"].min() >= 0.99
    statuses = store.query("SELECT DISTINCT status FROM runs")["status"].to_list()
    assert not any(s.startswith("running") for s in statuses)  # a fresh copy is no live run


def test_a_mis_scaled_source_is_reported_with_both_sources(store, tmp_path):
    run = tmp_path / "r/mis"
    loss = [(s, float(np.exp(-s / 50))) for s in range(1, 101)]
    tbx_scalars(run / "tb", {"train/loss": loss})
    with open(run / "metrics.jsonl", "w") as f:  # the same values, logged against samples (x 8)
        for s, v in loss:
            f.write(json.dumps({"step": s * 8, "loss": v}) + "\n")
    s = Store(tmp_path / "store")
    ingest_paths(s, tmp_path / "r")
    row = s.query("SELECT verdict, step_scale, agree FROM agreement WHERE metric = 'loss'").row(0)
    assert row[0] == "scaled" and abs(row[1]) == 8 and row[2] == 1.0
    problem = s.query("SELECT path, kind, message FROM problems").row(0)
    assert problem[1] == "sources_disagree" and "jsonl" in problem[2] and "tensorboard" in problem[2]
    assert "8 times" in problem[2]
    assert "scaled" in s.query("SELECT consistency FROM runs")["consistency"][0]


def test_monitor_without_any_batch_size_learns_it_from_another_source(tmp_path):
    """A DeepSpeed run folder whose ds_config and console are gone: the monitor's samples axis is
    divided by the ratio at which its lr agrees with the user's JSONL."""
    run = tmp_path / "r/ds"
    shutil.copytree(SAMPLES / "deepspeed_default_log_level/monitor_csv", run / "monitor_csv")
    shutil.copy(SAMPLES / "deepspeed_default_log_level/metrics.jsonl", run / "metrics.jsonl")
    s = Store(tmp_path / "store")
    ingest_paths(s, tmp_path / "r")
    assert steps(s, "ds", "Train/Samples/lr", "scalars_all", "deepspeed_monitor_csv") == list(range(1, 401))
    config = json.loads(s.query("SELECT config FROM runs")["config"][0])
    assert config["learned"] == {"train_batch_size": 32, "from": "agreement with jsonl"}


def test_the_console_engine_dump_gives_the_batch_size(tmp_path):
    """ds_config without train_batch_size or micro batch: the console's resolved config says 16."""
    run = tmp_path / "r/ds"
    shutil.copytree(SAMPLES / "deepspeed_resumed_after_kill", run)
    config = json.loads((run / "ds_config.json").read_text())
    del config["train_batch_size"], config["train_micro_batch_size_per_gpu"]
    (run / "ds_config.json").write_text(json.dumps(config))
    s = Store(tmp_path / "store")
    ingest_paths(s, tmp_path / "r")
    assert steps(s, "ds", "Train/Samples/lr", "scalars_all", "deepspeed_monitor_csv")[-1] == 400
    engine = json.loads(s.query("SELECT config FROM runs")["config"][0])["deepspeed_engine"]
    assert engine["train_batch_size"] == 16 and engine["world_size"] == 1


def test_json_files_that_are_no_log_are_skipped(tmp_path):
    run = tmp_path / "r/exp"
    tbx_scalars(run, {"loss": [(0, 1.0), (1, 0.5)]})
    (run / "config.json").write_text(json.dumps({"hidden_size": 32, "num_layers": 2, "dropout": 0.1}))
    (run / "PRUNED_BLOBS.json").write_text(json.dumps({"blobs": 3, "bytes": 1024}))
    (run / "summary.json").write_text(json.dumps({"best_loss": 0.5, "epochs": 3}))
    s = Store(tmp_path / "store")
    ingest_paths(s, tmp_path / "r")
    assert s.query("SELECT formats FROM runs")["formats"][0] == "tensorboard"
    skipped = s.query("SELECT count(*) n FROM files WHERE status = 'skipped'")["n"][0]
    assert skipped == 3


HF_OUT = "defects/d01_checkpoints_output_dir/checkpoints"  # HF Trainer's default output layout
AGREEING = {
    "loss": "train/loss",
    "grad_norm": "train/grad_norm",
    "lr": "train/learning_rate",
    "eval_loss": "eval/loss",
}


def test_hf_default_layout_gives_one_row_per_step_of_each_metric(tmp_path_factory):
    """trainer_state.json logs `loss`, HF's TensorBoard callback `train/loss` in runs/<stamp>/
    (tests/data/real/defects/d01): both are metric `loss`, and they agree, so `scalars` keeps one
    row per step (trainer_state's), `scalars_all` keeps both, runs.points counts each step once,
    and a replay loads one series."""
    from detectors import replay

    store = real_tree_store(tmp_path_factory, {"hf": HF_OUT})
    state = expected(f"{HF_OUT}/trainer_state.json")
    tb = {k.split("/", 1)[1]: v for k, v in expected(f"{HF_OUT}/runs").items() if not k.startswith("_")}
    for metric, tb_tag in AGREEING.items():
        rows = store.query(f"SELECT tag, step, value FROM scalars WHERE metric = '{metric}' ORDER BY step")
        state_tag = {"lr": "learning_rate"}.get(metric, metric)
        assert rows["step"].is_unique().all() and set(rows["tag"]) == {state_tag}, metric
        assert rows.height == state[state_tag]["points"] == tb[tb_tag]["points"], metric
        both = store.query(f"SELECT tag, superseded FROM scalars_all WHERE metric = '{metric}'")
        assert both.height == 2 * rows.height  # the TensorBoard rows are kept, superseded by source
        assert both.filter(pl.col("tag") == tb_tag)["superseded"].all(), metric
    stored = store.query("SELECT count(*) n FROM scalars_all")["n"][0]
    points = store.query("SELECT points FROM runs")["points"][0]
    assert points == stored - sum(tb[t]["points"] for t in AGREEING.values())
    tags = replay.load(store, ["hf"]).tags_frame
    assert tags.filter(pl.col("metric") == "loss")["tag"].to_list() == ["loss"]
