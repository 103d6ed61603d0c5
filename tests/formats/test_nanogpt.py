"""nanoGPT consoles: modded-nanogpt's `step:N/T key:value` lines, and karpathy/nanoGPT's
`iter N: loss X, time Yms[, mfu Z%]` and `step N: train loss X, val loss Y` (train.py run here
at two commits, tests/data/real/nanogpt_console), counted by an independent reader."""

from __future__ import annotations

import re

import pytest
from real_counts import REAL, assert_matches, expected, real_tree_store, stored
from real_samples import real_store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return real_store(tmp_path_factory, files=["nanogpt"], trees={})


def test_modded_nanogpt_train_and_val_lines_with_nan_step_avg(store):
    run = "modded-nanogpt"
    train = store.query(
        f"SELECT step, value, source_file FROM scalars_all WHERE run_id = '{run}' AND tag = 'train_loss'",
    )
    assert train.height == 6200 and sorted(train["step"]) == list(range(1, 6201))
    val = store.query(
        f"SELECT step, value, source_file FROM scalars_all WHERE run_id = '{run}' AND tag = 'val_loss' ORDER BY source_file, step",
    )
    muon = val.filter(val["source_file"].str.contains("Muon"))
    sub3 = val.filter(val["source_file"].str.contains("Sub3Min"))
    assert muon.height == 51 and muon["value"][-1] == 3.2785
    assert sub3.height == 13 and sub3.row(-1)[:2] == (1393, 3.2785)
    nan = store.query(
        f"SELECT count(*) n FROM scalars_all WHERE run_id = '{run}' AND tag = 'step_avg' AND isnan(value)",
    )
    assert nan["n"][0] == 26


# ---- karpathy/nanoGPT train.py ----------------------------------------------------------------
KARPATHY = {
    "crash_2023": "nanogpt_console/nanogpt_038ce894_2023-01-31_zero_division_crash.log",
    "clean_2024": "nanogpt_console/nanogpt_dc81cb36_2024-12-09_clean.log",
    "nan_2024": "nanogpt_console/nanogpt_dc81cb36_2024-12-09_lr30_nan.log",
}
NAMES = {"train_loss": "train/loss_estimate", "val_loss": "val/loss"}  # W&B: train/loss, val/loss


@pytest.fixture(scope="module")
def karpathy(tmp_path_factory):
    return real_tree_store(tmp_path_factory, KARPATHY)


@pytest.mark.parametrize("run", sorted(KARPATHY))
def test_karpathy_iter_and_eval_lines_match_the_independent_count(karpathy, run):
    counts = expected(KARPATHY[run])
    assert_matches(karpathy, run, {k: v for k, v in counts.items() if k != "mfu"}, NAMES)
    # mfu: every printed value but nanoGPT's "-100.00%" (not measured yet)
    unknown = len(re.findall(r"mfu -100\.00%", (REAL / KARPATHY[run]).read_text()))
    mfu = stored(karpathy, run, "mfu")
    if "mfu" not in counts:  # the 2023 commit printed no mfu
        assert mfu == {} and unknown == 0
        return
    assert unknown > 0 and len(mfu) == counts["mfu"]["points"] - unknown
    assert mfu[counts["mfu"]["last_step"]] == counts["mfu"]["spot"][str(counts["mfu"]["last_step"])]


def test_karpathy_runs_end_as_their_logs_say(karpathy):
    status = dict(karpathy.query("SELECT run_id, status FROM runs").rows())
    assert status == {"crash_2023": "crashed", "nan_2024": "diverged", "clean_2024": "unknown"}
    crash = karpathy.query(
        "SELECT step, attrs FROM events WHERE run_id = 'crash_2023' AND kind = 'crash'"
    ).row(0)
    assert crash[0] == expected(KARPATHY["crash_2023"])["loss"]["last_step"]
    assert (
        "ZeroDivisionError: division by zero"
        in karpathy.query("SELECT evidence FROM runs WHERE run_id = 'crash_2023'")["evidence"][0]
    )
    saves = karpathy.query(
        "SELECT step FROM events WHERE run_id = 'clean_2024' AND kind = 'checkpoint' ORDER BY step"
    )
    assert saves["step"].to_list() == [20, 40, 60, 80]  # `saving checkpoint to out-clean` after an eval


def test_karpathy_metrics(karpathy):
    metrics = dict(
        karpathy.query("SELECT DISTINCT tag, metric FROM scalars WHERE run_id = 'clean_2024'").rows()
    )
    assert metrics == {
        "loss": "loss",
        "time_ms": None,
        "mfu": None,
        "train/loss_estimate": None,  # the evaluation's estimate: no second training loss
        "val/loss": "eval_loss",
    }


# ---- karpathy/llama2.c train.py (nanoGPT's evaluation line, its own iteration line) ------------
LLAMA2C = {
    "llama2c_2023": "llama2c_console/llama2c_5b161ab_2023-07-23_console.log",
    "llama2c_2024": "llama2c_console/llama2c_350e04fe_master_console.log",
}


@pytest.fixture(scope="module")
def llama2c(tmp_path_factory):
    return real_tree_store(tmp_path_factory, LLAMA2C)


@pytest.mark.parametrize("run", sorted(LLAMA2C))
def test_llama2c_lines_match_the_independent_count(llama2c, run):
    counts = expected(LLAMA2C[run])
    assert_matches(llama2c, run, {k: v for k, v in counts.items() if k != "mfu"}, NAMES)
    unknown = len(re.findall(r"mfu -100\.00%", (REAL / LLAMA2C[run]).read_text()))
    mfu = stored(llama2c, run, "mfu")
    assert unknown > 0 and len(mfu) == counts["mfu"]["points"] - unknown
    kinds = dict(llama2c.query(f"SELECT tag, metric FROM scalars WHERE run_id = '{run}' GROUP BY ALL").rows())
    assert kinds["loss"] == "loss" and kinds["lr"] == "lr" and kinds["val/loss"] == "eval_loss"
