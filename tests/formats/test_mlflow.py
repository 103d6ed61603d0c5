"""MLflow file stores: a real Keras run logged to MLflow and to TensorBoard agree."""

from __future__ import annotations

import json

import pytest
from real_samples import real_store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return real_store(
        tmp_path_factory,
        files=[],
        trees={"mlflow_filestore": "mlflow_filestore", "keras": "../keras_tf2_swahili_stt"},
    )


def test_mlflow_filestore_equals_keras_tensorboard(store):
    run = "mlflow_filestore/swahili_stt/mlruns/1/ed05f9cd599442fe9a0c9222184710b8"
    loss = store.scalars(run, tag="loss")
    assert loss["step"].to_list() == list(range(10))
    assert loss["value"].to_list() == store.scalars("keras", tag="epoch_loss")["value"].to_list()
    config = json.loads(store.query(f"SELECT config FROM runs WHERE run_id = '{run}'")["config"][0])["mlflow"]
    assert config["status"] == "FINISHED"
    assert len(config["params"]) == 20 and len(config["tags"]) == 5
    assert config["params"]["opt_name"] == "SGD"
