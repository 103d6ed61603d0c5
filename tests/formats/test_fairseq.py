"""fairseq text logs and `--log-format json` lines."""

from __future__ import annotations

import pytest
from real_counts import assert_matches, expected, real_tree_store
from real_samples import contents, real_store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return real_store(tmp_path_factory, files=["issue_excerpts"], trees={})


def test_fairseq_text_and_json_log_lines(store):
    loss = store.scalars("fairseq_train_inner_text", tag="loss").select("step", "value")
    assert loss.rows() == [(2800, 9.255), (2900, 8.979), (3000, 9.376), (3100, 9.251)]
    js = store.query(
        "SELECT tag, step, value FROM scalars WHERE run_id = 'fairseq_json_log_format' AND tag IN ('loss', 'valid_loss') ORDER BY step, tag",
    )
    assert [r for r in js.rows() if r[0] == "loss"] == [
        ("loss", 53749, 3.097),
        ("loss", 55899, 3.095),
        ("loss", 58049, 3.092),
    ]
    assert len([r for r in js.rows() if r[0] == "valid_loss"]) == 3  # the first comes before any step
    note = store.query("SELECT note FROM files WHERE run_id = 'fairseq_json_log_format'")["note"][0]
    assert "1 records before the first step" in note


# ---- fairseq-py's progress lines before 2020 (tests/data/real/fairseq_progress) -----------------
OLD = {
    "fairseq_2018": "fairseq_progress/fairseq_2018_epoch_progress__fairseq-issue-301.log",
    "fairseq_2019_overflow": "fairseq_progress/fairseq_2019_epoch_summary_overflow__fairseq-issue-506.log",
    "fairseq_2019_fp16": "fairseq_progress/fairseq_2019_fp16_inner_lines__fairseq-issue-940.log",
    "fairseq_2019_inner_epoch": "fairseq_progress/fairseq_2019_inner_and_epoch_lines__fairseq-issue-514.log",
}


def stored_name(counted: str) -> str:
    """The counter's `inner/`, `epoch/`, `valid/` names as the reader stores them."""
    part, key = counted.split("/", 1)
    if part == "inner" or key.startswith(("train ", "valid ", "valid_")):
        return key
    return f"{'train' if part == 'epoch' else 'valid'}/{key}"


@pytest.fixture(scope="module")
def old(tmp_path_factory):
    return real_tree_store(tmp_path_factory, OLD)


@pytest.mark.parametrize("run", sorted(OLD))
def test_pre_2020_progress_lines_match_the_independent_count(old, run):
    counts = expected(OLD[run])
    assert_matches(old, run, counts, {k: stored_name(k) for k in counts if not k.startswith("_")})


def test_2018_lines_without_num_updates_count_batches(old):
    # `| epoch 005  1000 / 8223 ...`: 4 epochs of 8223 batches, then 1000; the epoch summary and
    # the validation after it stand at the epoch's last logged step
    loss = old.scalars("fairseq_2018", tag="loss").select("step", "value")
    assert loss["step"].to_list() == [4 * 8223 + i for i in range(1000, 9000, 1000)]
    assert old.scalars("fairseq_2018", tag="valid loss").select("step", "value").rows() == [
        (4 * 8223 + 8000, 3.13)
    ]
    # the first line, epoch 4's validation, comes before any step: counted, not stored
    assert contents(old, "fairseq_2018")["values_before_first_step"] == 2
    metrics = dict(old.query("SELECT DISTINCT tag, metric FROM scalars WHERE metric IS NOT NULL").rows())
    assert metrics["valid_loss"] == metrics["valid loss"] == "eval_loss" and metrics["gnorm"] == "grad_norm"
