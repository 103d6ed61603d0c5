"""HF Trainer trainer_state.json and *_results.json (and LLaMA-Factory's trainer_log.jsonl beside them)."""

from __future__ import annotations

import json

import pytest
from conftest import q
from real_counts import expected, real_tree_store
from real_samples import real_store, series


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return real_store(tmp_path_factory, files=[], trees={"hf_trainer": "hf_trainer"})


def test_llamafactory_trainer_state_wins_over_its_jsonl(store):
    run = "hf_trainer/mistral_llamafactory"
    loss = series(store, run, "loss")
    assert loss.height == 866 and loss["step"].to_list() == list(range(10, 8670, 10))
    raw = q(
        store,
        f"SELECT source, count(*) n FROM scalars_all WHERE run_id = '{run}' AND tag = 'loss' GROUP BY source ORDER BY source",
    )
    assert raw.rows() == [
        ("hf_trainer", 866),
        ("jsonl", 866),
    ]  # one current row per step: the trainer state wins
    cur = q(store, f"SELECT count(*) n FROM scalars WHERE run_id = '{run}' AND tag = 'loss'")
    assert cur["n"][0] == 866
    config = json.loads(q(store, f"SELECT config FROM runs WHERE run_id = '{run}'")["config"][0])
    assert config["trainer_summary"]["train_loss"] == pytest.approx(0.28918, abs=1e-5)
    assert config["trainer_summary"]["train_runtime"] == 20387.7129
    assert series(store, run, "throughput", "scalars_all")["value"][0] == 0.0  # the string "0.00"
    assert q(store, f"SELECT count(*) n FROM events WHERE run_id = '{run}' AND kind = 'eval'")["n"][0] == 0
    ckpt = q(store, f"SELECT step, kind, metadata FROM checkpoints WHERE run_id = '{run}' ORDER BY step")
    assert ckpt["step"].to_list() == [500, 8500] and set(ckpt["kind"]) == {"hf"}
    assert json.loads(ckpt["metadata"][1])["max_steps"] == 8660


def test_whisper_old_trainer_state_eval_wer_and_results(store):
    run = "hf_trainer/whisper_large_v2_japanese"
    assert series(store, run, "loss")["step"].to_list() == list(range(25, 5025, 25))
    wer = series(store, run, "eval_wer")
    assert wer["step"].to_list() == [1000, 2000, 3000, 4000, 5000]
    assert wer["value"].to_list() == pytest.approx([0.7888, 0.7478, 0.7432, 0.7443, 0.7449], abs=1e-4)
    assert q(store, f"SELECT count(*) n FROM events WHERE run_id = '{run}' AND kind = 'eval'")["n"][0] >= 5
    config = json.loads(q(store, f"SELECT config FROM runs WHERE run_id = '{run}'")["config"][0])
    assert config["trainer_state"]["best_metric"] == 0.7431560204762965
    assert len(config["results"]["all"]) == 12


def test_trl_checkpoint_state_is_not_completed(store):
    run = "hf_trainer/tinyllama_trl_sft"
    assert series(store, run, "loss")["step"].to_list() == list(range(15, 2805, 15))
    ev = series(store, run, "eval_loss")
    assert ev.height == 14 and ev["step"].to_list() == list(range(200, 3000, 200))
    status = q(store, f"SELECT status, evidence FROM runs WHERE run_id = '{run}'").row(0)
    assert status[0] == "checkpoint" and "2800" in status[1]


def test_a_checkpoint_published_alone_is_a_checkpoint_not_a_crash(tmp_path_factory):
    """checkpoint-40/ of a 60-step run, alone and as a Hub repository's root (tests/data/real/
    defects/d06): its trainer_state.json never has the final summary, and stopping short of
    max_steps is no evidence of a crash; the finished run's own state (d01) is completed."""
    store = real_tree_store(
        tmp_path_factory,
        {"d06": "defects/d06_checkpoint_alone", "done": "defects/d01_checkpoints_output_dir"},
    )
    counted = expected("defects/d06_checkpoint_alone/hub_repo_root/trainer_state.json")
    runs = q(store, "SELECT run_id, status, evidence, last_step FROM runs ORDER BY run_id").rows()
    assert [r[:2] for r in runs] == [
        ("d06/checkpoint-40", "checkpoint"),
        ("d06/hub_repo_root", "checkpoint"),
        ("done/checkpoints", "completed"),
    ]
    for _, _, evidence, last_step in runs[:2]:
        assert f"global_step {counted['_global_step']} of max_steps {counted['_max_steps']}" in evidence
        assert last_step == counted["_global_step"] == 40
    assert q(store, "SELECT count(*) n FROM labels")["n"][0] == 0  # no auto label of a failure
