"""HF Trainer trainer_state.json and *_results.json (and LLaMA-Factory's trainer_log.jsonl beside them)."""

from __future__ import annotations

import json

import pytest
from real_samples import real_store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return real_store(tmp_path_factory, files=[], trees={"hf_trainer": "hf_trainer"})


def test_llamafactory_trainer_state_wins_over_its_jsonl(store):
    run = "hf_trainer/mistral_llamafactory"
    loss = store.scalars(run, tag="loss")
    assert loss.height == 866 and loss["step"].to_list() == list(range(10, 8670, 10))
    raw = store.query(
        f"SELECT source, count(*) n FROM scalars_all WHERE run_id = '{run}' AND tag = 'loss' GROUP BY source ORDER BY source",
    )
    assert raw.rows() == [
        ("hf_trainer", 866),
        ("jsonl", 866),
    ]  # one current row per step: the trainer state wins
    cur = store.query(f"SELECT count(*) n FROM scalars WHERE run_id = '{run}' AND tag = 'loss'")
    assert cur["n"][0] == 866
    config = json.loads(store.query(f"SELECT config FROM runs WHERE run_id = '{run}'")["config"][0])
    assert config["trainer_summary"]["train_loss"] == pytest.approx(0.28918, abs=1e-5)
    assert config["trainer_summary"]["train_runtime"] == 20387.7129
    assert store.scalars(run, tag="throughput", all_points=True)["value"][0] == 0.0  # the string "0.00"
    assert store.query(f"SELECT count(*) n FROM events WHERE run_id = '{run}' AND kind = 'eval'")["n"][0] == 0
    ckpt = store.query(f"SELECT step, kind, metadata FROM checkpoints WHERE run_id = '{run}' ORDER BY step")
    assert ckpt["step"].to_list() == [500, 8500] and set(ckpt["kind"]) == {"hf"}
    assert json.loads(ckpt["metadata"][1])["max_steps"] == 8660


def test_whisper_old_trainer_state_eval_wer_and_results(store):
    run = "hf_trainer/whisper_large_v2_japanese"
    assert store.scalars(run, tag="loss")["step"].to_list() == list(range(25, 5025, 25))
    wer = store.scalars(run, tag="eval_wer")
    assert wer["step"].to_list() == [1000, 2000, 3000, 4000, 5000]
    assert wer["value"].to_list() == pytest.approx([0.7888, 0.7478, 0.7432, 0.7443, 0.7449], abs=1e-4)
    assert store.query(f"SELECT count(*) n FROM events WHERE run_id = '{run}' AND kind = 'eval'")["n"][0] >= 5
    config = json.loads(store.query(f"SELECT config FROM runs WHERE run_id = '{run}'")["config"][0])
    assert config["trainer_state"]["best_metric"] == 0.7431560204762965
    assert len(config["results"]["all"]) == 12


def test_trl_checkpoint_state_is_not_completed(store):
    run = "hf_trainer/tinyllama_trl_sft"
    assert store.scalars(run, tag="loss")["step"].to_list() == list(range(15, 2805, 15))
    ev = store.scalars(run, tag="eval_loss")
    assert ev.height == 14 and ev["step"].to_list() == list(range(200, 3000, 200))
    status = store.query(f"SELECT status, evidence FROM runs WHERE run_id = '{run}'").row(0)
    assert status[0] != "completed" and "2800" in status[1]
