"""DeepSpeed console logs: progress, throughput, timers, every OVERFLOW variant, flops profiler, events."""

from __future__ import annotations

import json

import pytest
from conftest import ingest_paths
from real_samples import HELLO, contents, real_store, settle


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return real_store(tmp_path_factory, files=["deepspeed", "issue_excerpts"], trees={})


def test_hellodeepspeed_overflow_storm_skipped_and_checkpoints(store):
    run = "hellodeepspeed_bert_zero1_fp16_console"
    skipped = store.scalars(run, tag="skipped").select("step", "value")
    assert skipped.rows() == [(0, 0.0), (10, 10.0), (20, 17.0), (30, 17.0), (40, 17.0)]
    assert store.scalars(run, tag="RunningAvgSamplesPerSec")["step"].to_list() == [10, 20, 30, 40]
    ov = store.events(run, kinds=["overflow"])
    assert ov.height == 17
    assert ov["step"].to_list() == [10] * 10 + [20] * 7
    attrs = [json.loads(a) for a in ov["attrs"]]
    assert attrs[0]["attempted_scale"] == 4294967296 and attrs[9]["new_scale"] == 4194304
    assert attrs[16]["new_scale"] == 32768 and {a["source"] for a in attrs} == {"deepspeed"}
    assert store.scalars(run, tag="derived/loss_scale")["value"].to_list()[-1] == 32768
    assert store.events(run, kinds=["checkpoint"])["step"].to_list() == [10, 20, 30, 40]
    assert store.scalars(run, tag="loss", all_points=True)["value"].to_list() == [
        10.8766,
        10.868,
        10.7828,
        10.6658,
    ]
    metrics = dict(store.query(f"SELECT DISTINCT tag, metric FROM scalars WHERE run_id = '{run}'").rows())
    assert metrics["derived/loss_scale"] == "loss_scale" and metrics["lr"] == "lr"


def test_pipeline_engine_console(store):
    run = "deepspeed_pipeline_parallel_console"
    assert store.scalars(run, tag="skipped")["step"].to_list() == list(range(0, 210, 10))
    assert set(store.scalars(run, tag="skipped")["value"]) == {0.0}
    loss = store.scalars(run, tag="loss")
    assert loss["step"].to_list() == list(range(10, 210, 10))
    assert (loss["value"][0], loss["value"][-1]) == (2.2985, 1.5927)
    sps = store.scalars(run, tag="samples/sec")["value"]
    assert (sps.min(), sps.max()) == (639.687, 802.957)
    assert store.events(run, kinds=["overflow"]).height == 0


def test_cifar_wall_clock_timers_and_flops_profile(store):
    run = "deepspeed_cifar10_fp16_wallclock_console"
    assert store.scalars(run, tag="skipped")["step"].to_list() == [0]
    counts = dict(
        store.query(
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
    assert store.events(run, kinds=["overflow"]).height == 0
    flops = json.loads(store.query(f"SELECT config FROM runs WHERE run_id = '{run}'")["config"][0])[
        "flops_profile"
    ]
    assert flops["step"] == 2
    assert flops["iter latency"] == pytest.approx(7.6e-3)
    assert flops["samples/second"] == 2105.51  # the profiler prints "samples/second"
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
def test_every_overflow_variant(store, run, n, last_new, variants):
    attrs = [json.loads(a) for a in store.events(run, kinds=["overflow"])["attrs"]]
    assert len(attrs) == n
    assert [a["new_scale"] for a in attrs if a["new_scale"] is not None][-1] == last_new
    found: dict[str, int] = {}
    for a in attrs:
        found[a["variant"]] = found.get(a["variant"], 0) + 1
    assert found == variants


def test_hf_dict_before_any_step_is_counted_and_old_samples_per_sec_read(store):
    # the HF dict line comes before any line that states a step: counted, not placed
    assert contents(store, "deepspeed_overflow_to_min_scale_with_hf_logs")["hf_dict"] == 1
    assert store.scalars("deepspeed_2021_stage3_overflow_and_old_timer", tag="SamplesPerSec").height == 1


def test_old_step_and_timer_forms(store):
    run = "deepspeed_0.5_step_and_old_timer"
    assert store.scalars(run, tag="skipped").select("step", "value").rows() == [
        (40, 2.0),
        (50, 2.0),
        (60, 2.0),
    ]
    assert (
        store.query(f"SELECT count(*) n FROM scalars_all WHERE run_id = '{run}' AND tag = 'SamplesPerSec'")[
            "n"
        ][0]
        == 2
    )
    assert (
        store.query(f"SELECT count(*) n FROM scalars_all WHERE run_id = '{run}' AND tag = 'MemAllocated'")[
            "n"
        ][0]
        == 2
    )
    t255 = store.query(
        "SELECT tag, count(*) n FROM scalars_all WHERE run_id = 'deepspeed_2020_wall_clock_breakdown_timers' GROUP BY tag",
    )
    assert dict(t255.rows())["SamplesPerSec"] == 1
    assert sum(n for t, n in t255.rows() if t.startswith("time/")) >= 8
    # 5 timer lines, 2 glued to tqdm bars; no line states a step, so they are counted, not placed
    assert contents(store, "deepspeed_2023_rank_time_ms_timers_with_tqdm")["timer"] == 5


def test_growing_console_log_resumes_with_its_state(tmp_store, tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    log = run / "stdout.log"
    lines = HELLO.splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if "OVERFLOW" in line) + 3  # mid overflow storm
    log.write_text("".join(lines[:cut]) + "partial line without newline")
    ingest_paths(tmp_store, run)
    assert (
        tmp_store.query("SELECT count(*) n FROM events WHERE kind = 'overflow'")["n"][0] == 0
    )  # waiting for their step
    log.write_text("".join(lines))
    settle(log)
    r = ingest_paths(tmp_store, run)
    assert r.files_read == 1
    ev = tmp_store.query("SELECT step FROM events WHERE kind = 'overflow' ORDER BY \"offset\"")
    assert ev["step"].to_list() == [10] * 10 + [20] * 7  # same as reading the whole file at once
    lines_seen = tmp_store.query('SELECT max("offset") m FROM events')["m"][0]
    assert lines_seen > cut  # line numbers continue across ingests
    assert tmp_store.query("SELECT count(*) n FROM scalars_all WHERE tag = 'skipped'")["n"][0] == 5


def test_events_from_text(tmp_store, tmp_path):
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
    ingest_paths(tmp_store, run)
    ev = tmp_store.query('SELECT step, kind, message, attrs FROM events ORDER BY "offset"')
    kinds = ev["kind"].to_list()
    assert kinds == ["recovery", "resume", "oom", "text", "min_loss_scale"]
    rec = json.loads(ev["attrs"][0])
    assert ev["step"][0] == 150 and rec == {"pattern": "P1", "changes": {"lr": 0.0008, "warmup": 0.01}}
    assert ev["step"][1] == 100 and json.loads(ev["attrs"][1])["path"] == "/ckpt/global_step100"
    assert "CUDA out of memory" in ev["message"][2]
    assert json.loads(ev["attrs"][3])["reason"] == "nccl_timeout"
    status = tmp_store.query("SELECT status, evidence FROM runs").row(0)
    assert status[0] == "diverged" and "minimum" in status[1]
    mom = tmp_store.query("SELECT value FROM scalars WHERE tag = 'mom'")["value"].to_list()
    assert mom == [0.9]
