"""`.gz` JSON and CSV logs read as they are: real files gzipped as people
archive them (tests/data/real/defects/d03_gz, provenance beside them), each counted by an
independent reader (tests/data/real/count_independently.py)."""

from __future__ import annotations

import json

import pytest
from real_counts import assert_matches, expected, real_tree_store

from ingest.hf_trainer import SUMMARY_KEYS

RUNS = {
    "hf_whisper": "defects/d03_gz/hf_whisper",
    "lightning": "defects/d03_gz/lightning_version_0",
    "keras": "defects/d03_gz/keras_csvlogger",
}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return real_tree_store(tmp_path_factory, RUNS)


def test_every_gz_log_is_read_by_its_format(store):
    formats = dict(store.query("SELECT regexp_extract(path, '[^/]+$') AS name, format FROM files").rows())
    assert formats == {
        "trainer_state.json.gz": "hf_trainer",
        "all_results.json.gz": "hf_trainer",
        "eval_results.json.gz": "hf_trainer",
        "train_results.json.gz": "hf_trainer",
        "metrics.csv.gz": "lightning_csv",
        "hparams.yaml": "lightning_hparams",
        "training.log.gz": "keras_csv",
    }
    assert store.query("SELECT count(*) n FROM problems")["n"][0] == 0


def test_lightning_metrics_csv_gz_matches_the_independent_count(store):
    assert_matches(store, "lightning", expected("defects/d03_gz/lightning_version_0/metrics.csv.gz"))


def test_keras_training_log_gz_matches_the_independent_count(store):
    assert_matches(store, "keras", expected("defects/d03_gz/keras_csvlogger/training.log.gz"))


def test_trainer_state_json_gz_matches_the_independent_count(store):
    counts = expected("defects/d03_gz/hf_whisper/trainer_state.json.gz")
    # the final summary included, its run-wide aggregates as summary/<key>
    summary = {k: f"summary/{k}" for k in counts if k in SUMMARY_KEYS and "loss" in counts}
    assert_matches(store, "hf_whisper", counts, summary)
    config = json.loads(store.query("SELECT config FROM runs WHERE run_id = 'hf_whisper'")["config"][0])
    assert set(config["results"]) == {"all", "eval", "train"}
    assert config["trainer_state"]["global_step"] == counts["_global_step"]
