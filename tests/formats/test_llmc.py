"""llm.c `main.log` (`s:N trl:X [lr:Y norm:Z]`, `s:N tel:X`): the CUDA trainer's of 2024-10 and
the older Python format of 2024-06 (tests/data/real/llmc_main_log), counted independently."""

from __future__ import annotations

import pytest
from real_counts import assert_matches, expected, real_tree_store

FILES = {
    "cuda_2024_10": "llmc_main_log/llmc_cuda_2024-10-13_main.log",
    "python_2024_06": "llmc_main_log/llmc_python_2024-06-06_AdamW_main.log",
}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return real_tree_store(tmp_path_factory, FILES)


@pytest.mark.parametrize("run", sorted(FILES))
def test_main_log_matches_the_independent_count(store, run):
    assert store.query(f"SELECT format FROM files WHERE run_id = '{run}'")["format"].to_list() == ["text_log"]
    assert_matches(store, run, expected(FILES[run]))


def test_llmc_keys_map_to_their_meaning(store):
    metrics = dict(store.query("SELECT DISTINCT tag, metric FROM scalars").rows())
    assert metrics == {"trl": "loss", "tel": "eval_loss", "lr": "lr", "norm": "grad_norm"}
    assert store.query("SELECT count(*) n FROM problems")["n"][0] == 0
