"""HF Trainer trainer_state.json and *_results.json (and LLaMA-Factory's trainer_log.jsonl beside them)."""

from __future__ import annotations

import json

import pytest
from real_counts import assert_matches, expected, real_tree_store
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
    runs = store.query("SELECT run_id, status, evidence, last_step FROM runs ORDER BY run_id").rows()
    assert [r[:2] for r in runs] == [
        ("d06/checkpoint-40", "checkpoint"),
        ("d06/hub_repo_root", "checkpoint"),
        ("done/checkpoints", "completed"),
    ]
    for _, _, evidence, last_step in runs[:2]:
        assert f"global_step {counted['_global_step']} of max_steps {counted['_max_steps']}" in evidence
        assert last_step == counted["_global_step"] == 40
    assert store.query("SELECT count(*) n FROM labels")["n"][0] == 0  # no auto label of a failure


# ---- the final log_history entry: tests/data/real/defects/d08_final_entry
D08 = {
    "trl_sft_last_entry": "defects/d08_final_entry/trl_sft_last_entry",
    "only_final_train_loss": "defects/d08_final_entry/only_final_train_loss",
}


@pytest.fixture(scope="module")
def d08(tmp_path_factory):
    return real_tree_store(tmp_path_factory, D08)


@pytest.mark.parametrize("run", sorted(D08))
def test_the_final_entry_metrics_are_points_at_its_step(d08, run):
    counts = expected(f"{D08[run]}/trainer_state.json")
    # every entry's numbers, the final summary's included: its aggregates as summary/<key>
    aggregates = ["train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos"]
    tags = {k: f"summary/{k}" for k in aggregates + (["train_loss"] if "loss" in counts else [])}
    assert_matches(d08, run, counts, tags)
    final = counts["_global_step"]
    loss_tag = tags.get("train_loss", "train_loss")
    assert d08.scalars(run, tag=loss_tag).select("step", "value")["step"].to_list() == [final]


def test_the_summary_mean_loss_is_no_training_loss_point(d08):
    """TRL's summary (step 23) has the run's mean loss, not step 23's: the loss curve ends at 20."""
    rows = d08.query(
        "SELECT tag, step FROM scalars WHERE run_id = 'trl_sft_last_entry' AND metric = 'loss' ORDER BY step"
    )
    assert rows.rows() == [("loss", s) for s in (5, 10, 15, 20)]
    mean = d08.scalars("trl_sft_last_entry", tag="summary/train_loss")
    assert mean.select("step", "value").rows() == [(23, pytest.approx(3.2158814720485522))]


def test_trl_last_steps_token_accuracy_is_at_the_final_step(d08):
    acc = d08.scalars("trl_sft_last_entry", tag="mean_token_accuracy").select("step", "value")
    assert acc["step"].to_list() == [5, 10, 15, 20, 23]
    assert acc["value"][-1] == pytest.approx(0.3324652810891469)
    assert d08.scalars("trl_sft_last_entry", tag="num_tokens").select("step", "value")["value"][-1] == 9200.0


def test_a_run_whose_only_training_loss_is_the_summary_has_a_loss_point(d08):
    rows = d08.query(
        "SELECT tag, step, value FROM scalars WHERE run_id = 'only_final_train_loss' AND metric = 'loss'"
    )
    assert rows.rows() == [("train_loss", 30, pytest.approx(3.145842742919922))]


# ---- LLaMA-Factory's throughput: tests/data/real/defects/d07_llamafactory_throughput
def test_llamafactory_throughput_is_tokens_per_second(tmp_path_factory):
    d07 = real_tree_store(tmp_path_factory, {"sft": "defects/d07_llamafactory_throughput"})
    counts = expected("defects/d07_llamafactory_throughput/trainer_log.jsonl")
    # total_steps is progress bookkeeping the reader leaves out; every other key is a series
    assert_matches(d07, "sft", {k: v for k, v in counts.items() if k != "total_steps"})
    rows = d07.query(
        "SELECT tag, metric, step, value FROM scalars WHERE run_id = 'sft' AND metric LIKE '%_per_sec'"
    )
    assert set(rows["tag"]) == {"throughput"} and set(rows["metric"]) == {"tokens_per_sec"}
    assert rows.height == counts["throughput"]["points"]
    # it is tokens seen over elapsed seconds: 1,614,784 tokens in 2:03 at step 5
    first = rows.sort("step").row(0)
    assert first[2:] == (5, 13061.0) and first[3] == pytest.approx(1614784 / 123, rel=0.01)
