"""fairseq text logs and `--log-format json` lines."""

from __future__ import annotations

import pytest
from real_samples import real_store


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
