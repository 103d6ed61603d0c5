"""PyTorch Lightning CSVLogger: metrics.csv with sparse columns, hparams.yaml."""

from __future__ import annotations

import json

import pytest
from real_samples import real_store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return real_store(tmp_path_factory, files=[], trees={"lightning_csvlogger": "lightning_csvlogger"})


def test_lightning_csvlogger_sparse_columns_and_hparams(store):
    run = "lightning_csvlogger/slm_training_version_0"
    counts = dict(
        store.query(f"SELECT tag, count(*) FROM scalars_all WHERE run_id = '{run}' GROUP BY tag").rows()
    )
    assert counts["train_loss_step"] == 2814 and counts["val_loss"] == 10 and counts["epoch_time"] == 10
    assert store.query(f"SELECT max(step) m FROM scalars WHERE run_id = '{run}'")["m"][0] == 140739
    config = json.loads(store.query(f"SELECT config FROM runs WHERE run_id = '{run}'")["config"][0])
    assert config["hparams"]["d_model"] == 768
