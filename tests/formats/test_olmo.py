"""The OLMo trainer's console (`[step=N/M]` headers, indented `name=value` metrics): ai2-olmo
0.2.5, OLMo of April 2024 and of August 2024 (with epochs and a grad norm), real excerpts
(tests/data/real/olmo_console), counted independently."""

from __future__ import annotations

from datetime import datetime

import pytest
from real_counts import assert_matches, expected, real_tree_store

FILES = {
    "olmo_0.2.5": "olmo_console/olmo_0.2.5_train729__public-notes.log",
    "olmo_2024_04": "olmo_console/olmo_2024-04_train816__public-notes.log",
    "olmo_2024_08": "olmo_console/olmo_2024-08_train908_epoch__OLMo-issue-692.log",
}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return real_tree_store(tmp_path_factory, FILES)


@pytest.mark.parametrize("run", sorted(FILES))
def test_metrics_under_each_step_header_match_the_independent_count(store, run):
    assert_matches(store, run, expected(FILES[run]))


def test_metrics_take_the_header_time_and_map_by_meaning(store):
    run = "olmo_2024_08"
    first = store.query(
        f"SELECT step, wall_time FROM scalars WHERE run_id = '{run}' AND tag = 'train/CrossEntropyLoss' ORDER BY step",
    )
    assert first.row(0) == (1, pytest.approx(datetime(2024, 8, 6, 9, 59, 26, 181000).timestamp()))
    metrics = dict(store.query(f"SELECT DISTINCT tag, metric FROM scalars WHERE run_id = '{run}'").rows())
    assert metrics["train/CrossEntropyLoss"] == "loss" and metrics["optim/total_grad_norm"] == "grad_norm"
    assert metrics["throughput/device/tokens_per_second"] == "tokens_per_sec"
