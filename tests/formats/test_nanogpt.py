"""nanoGPT / modded-nanogpt `step:N/T key:value` lines."""

from __future__ import annotations

import pytest
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
