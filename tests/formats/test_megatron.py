"""Megatron(-DeepSpeed) iteration and validation lines, with DeepSpeed notices mixed in."""

from __future__ import annotations

import json

import pytest
from real_samples import contents, real_store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return real_store(tmp_path_factory, files=["bigscience", "issue_excerpts"], trees={})


def test_megatron_deepspeed_iteration_lines_truncated_lines_and_nan_window(store):
    run = "megatron_deepspeed_iteration_lines_extracted_from_chronicles"
    assert (
        store.query(f"SELECT count(*) n FROM scalars_all WHERE run_id = '{run}' AND tag = 'lm loss'")["n"][0]
        == 65
    )
    prob = store.query(f"SELECT kind FROM problems WHERE run_id = '{run}'")
    assert prob["kind"].to_list() == ["truncated_line"] * 6
    nan = store.events(run, kinds=["nan_window"])
    assert nan["step"].to_list() == [9027]
    assert (
        store.query(f"SELECT DISTINCT metric FROM scalars WHERE run_id = '{run}' AND tag = 'lm loss'")[
            "metric"
        ][0]
        == "loss"
    )


def test_overflow_attached_to_following_iteration(store):
    run = "tr8b-104B"
    loss = store.scalars(run, tag="lm loss")
    assert loss["step"].to_list() == list(range(17060, 17069))
    assert loss.filter(loss["step"] == 17062)["value"][0] == pytest.approx(4.374, abs=1e-3)
    ov = store.events(run, kinds=["overflow"])
    assert ov["step"].to_list() == [17062, 17063, 17064, 17065, 17067, 17068]
    assert [json.loads(a)["new_scale"] for a in ov["attrs"]] == [
        1048576.0,
        524288.0,
        262144.0,
        131072.0,
        65536.0,
        32768.0,
    ]


def test_megatron_lm_iteration_lines_and_timers(store):
    loss = store.scalars("megatron_lm_iteration_lines", tag="lm loss")
    assert loss["step"].to_list() == [122, 123, 124, 125]
    assert (loss["value"][0], loss["value"][-1]) == (2.50422, 2.477393)
    assert set(store.scalars("megatron_lm_iteration_lines", tag="loss scale")["value"]) == {1.0}
    assert contents(store, "megatron_lm_timers")["timer"] == 5
