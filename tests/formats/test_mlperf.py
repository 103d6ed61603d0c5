"""MLPerf training logs (`:::MLLOG {json}` lines) from mlcommons' published results: v1.0 BERT
(Dell) and v4.0 Llama-2-70B LoRA (Juniper's DeepSpeed reference, NVIDIA's NeMo), counted by
an independent reader (tests/data/real/count_independently.py)."""

from __future__ import annotations

import json

import pytest
from real_counts import REAL, assert_matches, expected, real_tree_store

from ingest.base import ReadContext
from ingest.mlperf import MlperfIngestor, parse_line

FILES = {
    "bert_v1.0": "mlperf/v1.0_Dell_DSS8440x8A100-PCIE-40GB_bert_result_0.txt",
    "lora_v4.0_deepspeed": "mlperf/v4.0_JuniperNetworks_h100_n1_ngc24.1_pytorch_deepspeed_llama2_70b_lora_result_0.txt",
    "lora_v4.0_nemo": "mlperf/v4.0_NVIDIA_h200_ngc24.04_nemo_llama2_70b_lora_result_0.txt",
}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return real_tree_store(tmp_path_factory, FILES)


@pytest.mark.parametrize("run", sorted(FILES))
def test_points_match_the_independent_count(store, run):
    fmt = store.query(f"SELECT format FROM files WHERE run_id = '{run}'")["format"].to_list()
    assert fmt == ["mlperf"]
    assert_matches(store, run, expected(FILES[run]))


def test_wall_time_is_time_ms(store):
    line = next(
        t for t in (REAL / FILES["lora_v4.0_deepspeed"]).read_text().splitlines() if '"train_loss"' in t
    )
    ev = json.loads(line.split(":::MLLOG ", 1)[1])
    row = store.query(
        "SELECT wall_time FROM scalars_all WHERE run_id = 'lora_v4.0_deepspeed' AND tag = 'train_loss' "
        f"AND step = {ev['metadata']['samples_count']}",
    )
    assert row["wall_time"][0] == pytest.approx(ev["time_ms"] / 1000)


def test_run_stop_success_is_completed(store):
    status = dict(store.query("SELECT run_id, status FROM runs").rows())
    assert status == dict.fromkeys(FILES, "completed")


def test_a_position_that_does_not_advance_numbers_the_points_and_says_so(store):
    # BERT v1.0 logs each of its 20 evaluations at epoch_num 1
    note = store.query("SELECT note FROM files WHERE run_id = 'bert_v1.0'")["note"][0]
    assert "eval_accuracy: its epoch_num does not advance" in note
    assert expected(FILES["bert_v1.0"])["_records"]["eval_accuracy"] == 20
    evals = store.query("SELECT count(*) n FROM events WHERE run_id = 'bert_v1.0' AND kind = 'eval'")["n"][0]
    assert evals == 20


def test_hyperparameters_logged_once_are_configuration(store):
    config = json.loads(
        store.query("SELECT config FROM runs WHERE run_id = 'lora_v4.0_deepspeed'")["config"][0]
    )
    assert config["mlperf"]["submission_benchmark"] == "llama2_70b_lora"
    assert config["mlperf"]["global_batch_size"] == 8
    assert config["mlperf"]["lora_rank"] == 16


def test_aborted_is_incomplete_and_no_run_stop_says_nothing(tmp_path):
    src = (REAL / FILES["lora_v4.0_deepspeed"]).read_text().splitlines(keepends=True)
    aborted = tmp_path / "aborted_result_0.txt"
    aborted.write_text("".join(t.replace('"status": "success"', '"status": "aborted"') for t in src))
    killed = tmp_path / "killed_result_0.txt"
    killed.write_text("".join(t for t in src if '"run_stop"' not in t))
    ing = MlperfIngestor()
    (batch,) = ing.read(aborted, 0, ReadContext("r"))
    assert [e.status for e in batch.evidence] == ["incomplete"]
    (batch,) = ing.read(killed, 0, ReadContext("r"))
    assert batch.evidence == [] and len(batch.points) > 0


def test_rank_prefix_and_bad_json():
    assert parse_line('0: :::MLLOG {"key": "train_loss", "value": 1.5, "metadata": {}}')["value"] == 1.5
    assert parse_line("plain console text") is None
    with pytest.raises(ValueError, match="does not decode"):
        parse_line(':::MLLOG {"key": "train_loss", "value": ')
