"""Every row of FORMATS.md §6 (beyond TensorBoard) reproduced on the real samples."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest
from conftest import DATA, ingest_paths, q

from workbench.store import Store

REAL = DATA / "real_logs"
ONE_FILE_RUNS = ["deepspeed", "issue_excerpts", "bigscience", "nanogpt"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Each single-file sample as its own run (named by the file's stem before `__`), the
    structured samples in their own layouts; every file settled (untouched for an hour)."""
    root = tmp_path_factory.mktemp("real") / "runs"
    for group in ONE_FILE_RUNS:
        for f in sorted((REAL / group).iterdir()):
            if f.suffix in (".tsv", ".md"):
                continue
            run = root / f.name.split("__")[0].removesuffix(".log").removesuffix(".txt")
            run.mkdir(parents=True, exist_ok=True)
            shutil.copy(f, run / f.name)
    for group in ("hf_trainer", "lightning_csvlogger", "mlflow_filestore"):
        shutil.copytree(REAL / group, root / group)
    shutil.copytree(DATA / "keras_tf2_swahili_stt", root / "keras")
    old = time.time() - 3600
    for dirpath, _, files in os.walk(root):
        for name in files:
            os.utime(os.path.join(dirpath, name), (old, old))
    s = Store(root.parent / "store")
    ingest_paths(s, root)
    return s


def series(store, run, tag, view="scalars"):
    return q(store, f"SELECT step, value FROM {view} WHERE run_id = '{run}' AND tag = '{tag}' ORDER BY step")


def events(store, run, kind):
    return q(
        store,
        f"SELECT step, message, attrs FROM events WHERE run_id = '{run}' AND kind = '{kind}' ORDER BY \"offset\"",
    )


def test_row3_mlflow_equals_keras_tensorboard(store):
    run = "mlflow_filestore/swahili_stt/mlruns/1/ed05f9cd599442fe9a0c9222184710b8"
    loss = series(store, run, "loss")
    assert loss["step"].to_list() == list(range(10))
    assert loss["value"].to_list() == series(store, "keras", "epoch_loss")["value"].to_list()
    config = json.loads(q(store, f"SELECT config FROM runs WHERE run_id = '{run}'")["config"][0])["mlflow"]
    assert config["status"] == "FINISHED"
    assert len(config["params"]) == 20 and len(config["tags"]) == 5
    assert config["params"]["opt_name"] == "SGD"


def test_row8_hellodeepspeed(store):
    run = "hellodeepspeed_bert_zero1_fp16_console"
    skipped = series(store, run, "skipped")
    assert skipped.rows() == [(0, 0.0), (10, 10.0), (20, 17.0), (30, 17.0), (40, 17.0)]
    assert series(store, run, "RunningAvgSamplesPerSec")["step"].to_list() == [10, 20, 30, 40]
    ov = events(store, run, "overflow")
    assert ov.height == 17
    assert ov["step"].to_list() == [10] * 10 + [20] * 7
    attrs = [json.loads(a) for a in ov["attrs"]]
    assert attrs[0]["attempted_scale"] == 4294967296 and attrs[9]["new_scale"] == 4194304
    assert attrs[16]["new_scale"] == 32768 and {a["source"] for a in attrs} == {"deepspeed"}
    assert series(store, run, "derived/loss_scale")["value"].to_list()[-1] == 32768
    assert events(store, run, "checkpoint")["step"].to_list() == [10, 20, 30, 40]
    assert series(store, run, "loss", "scalars_all")["value"].to_list() == [10.8766, 10.868, 10.7828, 10.6658]
    metrics = dict(q(store, f"SELECT DISTINCT tag, metric FROM scalars WHERE run_id = '{run}'").rows())
    assert metrics["derived/loss_scale"] == "loss_scale" and metrics["lr"] == "lr"


def test_row9_pipeline_engine(store):
    run = "deepspeed_pipeline_parallel_console"
    assert series(store, run, "skipped")["step"].to_list() == list(range(0, 210, 10))
    assert set(series(store, run, "skipped")["value"]) == {0.0}
    loss = series(store, run, "loss")
    assert loss["step"].to_list() == list(range(10, 210, 10))
    assert (loss["value"][0], loss["value"][-1]) == (2.2985, 1.5927)
    sps = series(store, run, "samples/sec")["value"]
    assert (sps.min(), sps.max()) == (639.687, 802.957)
    assert events(store, run, "overflow").height == 0


def test_row10_cifar_timers_and_flops_profile(store):
    run = "deepspeed_cifar10_fp16_wallclock_console"
    assert series(store, run, "skipped")["step"].to_list() == [0]
    counts = dict(
        q(
            store,
            f"SELECT tag, count(*) FROM scalars_all WHERE run_id = '{run}' AND tag LIKE 'time/%' GROUP BY tag",
        ).rows()
    )
    assert (
        counts["time/compute_norm"] == 10
        and counts["time/forward_microstep"] == 10
        and counts["time/forward"] == 10
    )
    assert not any(
        t.startswith("time/ep_") or t == "time/ep_microstep" for t in counts
    )  # the elided fragment
    assert events(store, run, "overflow").height == 0
    flops = json.loads(q(store, f"SELECT config FROM runs WHERE run_id = '{run}'")["config"][0])[
        "flops_profile"
    ]
    assert flops["step"] == 2
    assert flops["iter latency"] == pytest.approx(7.6e-3)
    assert flops["samples/second"] == 2105.51  # FORMATS.md §6 prints it as "real_logs/second"
    assert len([k for k in flops if not k.endswith("(unit)") and k != "step"]) == 18


@pytest.mark.parametrize(
    "run, n, last_new, variants",
    [
        ("deepspeed_overflow_loss_scaler_int", 6, 67108864, {"reduce": 6}),
        ("deepspeed_overflow_to_min_scale_with_hf_logs", 5, 2, {"reduce": 5}),
        ("deepspeed_overflow_hysteresis_epoch_start", 4, 8192, {"hysteresis": 1, "reduce": 3}),
        ("deepspeed_overflow_hysteresis", 6, 4096, {"hysteresis": 3, "reduce": 3}),
        ("deepspeed_overflow_stage_1_and_2_float_scale_with_tqdm", 2, 32.0, {"reduce": 2}),
        ("deepspeed_2021_deepscale_overflow_stage2_with_tqdm", 3, 16777216.0, {"reduce": 3}),
        ("deepspeed_2021_stage3_overflow_and_old_timer", 5, 524288.0, {"reduce": 5}),
    ],
)
def test_row11_overflow_variants(store, run, n, last_new, variants):
    attrs = [json.loads(a) for a in events(store, run, "overflow")["attrs"]]
    assert len(attrs) == n
    assert [a["new_scale"] for a in attrs if a["new_scale"] is not None][-1] == last_new
    found: dict[str, int] = {}
    for a in attrs:
        found[a["variant"]] = found.get(a["variant"], 0) + 1
    assert found == variants


def contents(store, run):
    rows = q(store, f"SELECT contents FROM files WHERE run_id = '{run}'")["contents"]
    return json.loads(rows[0])


def test_row11_extras(store):
    # the HF dict line comes before any line that states a step: counted, not placed
    assert contents(store, "deepspeed_overflow_to_min_scale_with_hf_logs")["hf_dict"] == 1
    assert series(store, "deepspeed_2021_stage3_overflow_and_old_timer", "SamplesPerSec").height == 1


def test_row12_old_forms(store):
    run = "deepspeed_0.5_step_and_old_timer"
    assert series(store, run, "skipped").rows() == [(40, 2.0), (50, 2.0), (60, 2.0)]
    assert (
        q(store, f"SELECT count(*) n FROM scalars_all WHERE run_id = '{run}' AND tag = 'SamplesPerSec'")["n"][
            0
        ]
        == 2
    )
    assert (
        q(store, f"SELECT count(*) n FROM scalars_all WHERE run_id = '{run}' AND tag = 'MemAllocated'")["n"][
            0
        ]
        == 2
    )
    t255 = q(
        store,
        "SELECT tag, count(*) n FROM scalars_all WHERE run_id = 'deepspeed_2020_wall_clock_breakdown_timers' GROUP BY tag",
    )
    assert dict(t255.rows())["SamplesPerSec"] == 1
    assert sum(n for t, n in t255.rows() if t.startswith("time/")) >= 8
    # 5 timer lines, 2 glued to tqdm bars; no line states a step, so they are counted, not placed
    assert contents(store, "deepspeed_2023_rank_time_ms_timers_with_tqdm")["timer"] == 5


def test_row13_megatron_iteration_lines(store):
    run = "megatron_deepspeed_iteration_lines_extracted_from_chronicles"
    assert (
        q(store, f"SELECT count(*) n FROM scalars_all WHERE run_id = '{run}' AND tag = 'lm loss'")["n"][0]
        == 65
    )
    prob = q(store, f"SELECT kind FROM problems WHERE run_id = '{run}'")
    assert prob["kind"].to_list() == ["truncated_line"] * 6
    nan = events(store, run, "nan_window")
    assert nan["step"].to_list() == [9027]
    assert (
        q(store, f"SELECT DISTINCT metric FROM scalars WHERE run_id = '{run}' AND tag = 'lm loss'")["metric"][
            0
        ]
        == "loss"
    )


def test_row14_overflow_attached_to_following_iteration(store):
    run = "tr8b-104B"
    loss = series(store, run, "lm loss")
    assert loss["step"].to_list() == list(range(17060, 17069))
    assert loss.filter(loss["step"] == 17062)["value"][0] == pytest.approx(4.374, abs=1e-3)
    ov = events(store, run, "overflow")
    assert ov["step"].to_list() == [17062, 17063, 17064, 17065, 17067, 17068]
    assert [json.loads(a)["new_scale"] for a in ov["attrs"]] == [
        1048576.0,
        524288.0,
        262144.0,
        131072.0,
        65536.0,
        32768.0,
    ]


def test_row15_megatron_lm(store):
    loss = series(store, "megatron_lm_iteration_lines", "lm loss")
    assert loss["step"].to_list() == [122, 123, 124, 125]
    assert (loss["value"][0], loss["value"][-1]) == (2.50422, 2.477393)
    assert set(series(store, "megatron_lm_iteration_lines", "loss scale")["value"]) == {1.0}
    assert contents(store, "megatron_lm_timers")["timer"] == 5


def test_row16_llamafactory_state_and_jsonl(store):
    run = "hf_trainer/mistral_llamafactory"
    loss = series(store, run, "loss")
    assert loss.height == 866 and loss["step"].to_list() == list(range(10, 8670, 10))
    raw = q(
        store,
        f"SELECT source, count(*) n FROM scalars_all WHERE run_id = '{run}' AND tag = 'loss' GROUP BY source ORDER BY source",
    )
    assert raw.rows() == [
        ("hf_trainer", 866),
        ("jsonl", 866),
    ]  # one current row per step: the trainer state wins
    cur = q(store, f"SELECT count(*) n FROM scalars WHERE run_id = '{run}' AND tag = 'loss'")
    assert cur["n"][0] == 866
    config = json.loads(q(store, f"SELECT config FROM runs WHERE run_id = '{run}'")["config"][0])
    assert config["trainer_summary"]["train_loss"] == pytest.approx(0.28918, abs=1e-5)
    assert config["trainer_summary"]["train_runtime"] == 20387.7129
    assert series(store, run, "throughput", "scalars_all")["value"][0] == 0.0  # the string "0.00"
    assert q(store, f"SELECT count(*) n FROM events WHERE run_id = '{run}' AND kind = 'eval'")["n"][0] == 0
    ckpt = q(store, f"SELECT step, kind, metadata FROM checkpoints WHERE run_id = '{run}' ORDER BY step")
    assert ckpt["step"].to_list() == [500, 8500] and set(ckpt["kind"]) == {"hf"}
    assert json.loads(ckpt["metadata"][1])["max_steps"] == 8660


def test_row17_whisper_old_trainer_state(store):
    run = "hf_trainer/whisper_large_v2_japanese"
    assert series(store, run, "loss")["step"].to_list() == list(range(25, 5025, 25))
    wer = series(store, run, "eval_wer")
    assert wer["step"].to_list() == [1000, 2000, 3000, 4000, 5000]
    assert wer["value"].to_list() == pytest.approx([0.7888, 0.7478, 0.7432, 0.7443, 0.7449], abs=1e-4)
    assert q(store, f"SELECT count(*) n FROM events WHERE run_id = '{run}' AND kind = 'eval'")["n"][0] >= 5
    config = json.loads(q(store, f"SELECT config FROM runs WHERE run_id = '{run}'")["config"][0])
    assert config["trainer_state"]["best_metric"] == 0.7431560204762965
    assert len(config["results"]["all"]) == 12


def test_row18_trl_checkpoint_state_is_not_completed(store):
    run = "hf_trainer/tinyllama_trl_sft"
    assert series(store, run, "loss")["step"].to_list() == list(range(15, 2805, 15))
    ev = series(store, run, "eval_loss")
    assert ev.height == 14 and ev["step"].to_list() == list(range(200, 3000, 200))
    status = q(store, f"SELECT status, evidence FROM runs WHERE run_id = '{run}'").row(0)
    assert status[0] != "completed" and "2800" in status[1]


def test_row19_lightning_csv(store):
    run = "lightning_csvlogger/slm_training_version_0"
    counts = dict(
        q(store, f"SELECT tag, count(*) FROM scalars_all WHERE run_id = '{run}' GROUP BY tag").rows()
    )
    assert counts["train_loss_step"] == 2814 and counts["val_loss"] == 10 and counts["epoch_time"] == 10
    assert q(store, f"SELECT max(step) m FROM scalars WHERE run_id = '{run}'")["m"][0] == 140739
    config = json.loads(q(store, f"SELECT config FROM runs WHERE run_id = '{run}'")["config"][0])
    assert config["hparams"]["d_model"] == 768


def test_row20_21_nanogpt(store):
    run = "modded-nanogpt"
    train = q(
        store,
        f"SELECT step, value, source_file FROM scalars_all WHERE run_id = '{run}' AND tag = 'train_loss'",
    )
    assert train.height == 6200 and sorted(train["step"]) == list(range(1, 6201))
    val = q(
        store,
        f"SELECT step, value, source_file FROM scalars_all WHERE run_id = '{run}' AND tag = 'val_loss' ORDER BY source_file, step",
    )
    muon = val.filter(val["source_file"].str.contains("Muon"))
    sub3 = val.filter(val["source_file"].str.contains("Sub3Min"))
    assert muon.height == 51 and muon["value"][-1] == 3.2785
    assert sub3.height == 13 and sub3.row(-1)[:2] == (1393, 3.2785)
    nan = q(
        store,
        f"SELECT count(*) n FROM scalars_all WHERE run_id = '{run}' AND tag = 'step_avg' AND isnan(value)",
    )
    assert nan["n"][0] == 26


def test_row22_fairseq(store):
    loss = series(store, "fairseq_train_inner_text", "loss")
    assert loss.rows() == [(2800, 9.255), (2900, 8.979), (3000, 9.376), (3100, 9.251)]
    js = q(
        store,
        "SELECT tag, step, value FROM scalars WHERE run_id = 'fairseq_json_log_format' AND tag IN ('loss', 'valid_loss') ORDER BY step, tag",
    )
    assert [r for r in js.rows() if r[0] == "loss"] == [
        ("loss", 53749, 3.097),
        ("loss", 55899, 3.095),
        ("loss", 58049, 3.092),
    ]
    assert len([r for r in js.rows() if r[0] == "valid_loss"]) == 3  # the first comes before any step
    note = q(store, "SELECT note FROM files WHERE run_id = 'fairseq_json_log_format'")["note"][0]
    assert "1 records before the first step" in note
