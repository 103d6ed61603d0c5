"""torchtitan consoles (`[rank0]:[titan] ... - step: N  loss: X  grad_norm: G  memory: ...GiB(P%)
tps: T  tflops: F  mfu: U%`): four real excerpts of 2025-03 to 2026-05 from torchtitan pull
requests (tests/data/real/torchtitan), counted independently."""

from __future__ import annotations

from datetime import datetime

import pytest
from real_counts import assert_matches, expected, real_tree_store

FILES = {
    "no_grad_norm_2025_03": "torchtitan/torchtitan_2025-03_no_grad_norm__torchtitan-pr-950.log",
    "gc_profiler_2025_06": "torchtitan/torchtitan_2025-06_gc_and_profiler__torchtitan-pr-1287.log",
    "unprefixed_ranks_2026_02": "torchtitan/torchtitan_2026-02_grad_norm_unprefixed_ranks__torchtitan-pr-2389.log",
    "rank_prefixed_2026_05": "torchtitan/torchtitan_2026-05_grad_norm_rank_prefixed__torchtitan-pr-3393.log",
}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return real_tree_store(tmp_path_factory, FILES)


@pytest.mark.parametrize("run", sorted(FILES))
def test_step_lines_match_the_independent_count(store, run):
    assert_matches(store, run, expected(FILES[run]), view="scalars")  # a rank's copy: the last is current


def test_every_rank_printing_the_same_step_keeps_one_current_row(store):
    run = "unprefixed_ranks_2026_02"
    counts = expected(FILES[run])
    lines = counts["loss"]["lines"]  # 8 lines for 2 steps: 7 ranks printed step 4
    all_rows = store.query(f"SELECT count(*) n FROM scalars_all WHERE run_id = '{run}' AND tag = 'loss'")[
        "n"
    ][0]
    current = store.query(f"SELECT count(*) n FROM scalars WHERE run_id = '{run}' AND tag = 'loss'")["n"][0]
    assert (all_rows, current) == (lines, counts["loss"]["points"])


def test_wall_times_come_from_the_titan_prefix_and_metrics_by_meaning(store):
    run = "rank_prefixed_2026_05"
    wall = store.query(
        f"SELECT step, wall_time FROM scalars WHERE run_id = '{run}' AND tag = 'loss' ORDER BY step"
    )
    # `[rank0]:[titan] 2026-05-18 16:04:46,338 - root - INFO - step: 14 ...` (local time, as every console)
    assert wall.row(0) == (14, pytest.approx(datetime(2026, 5, 18, 16, 4, 46, 338000).timestamp()))
    metrics = dict(store.query(f"SELECT DISTINCT tag, metric FROM scalars WHERE run_id = '{run}'").rows())
    assert (
        metrics["loss"] == "loss"
        and metrics["grad_norm"] == "grad_norm"
        and metrics["tps"] == "tokens_per_sec"
    )
