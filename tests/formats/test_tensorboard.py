"""TensorBoard event files: real files with tbparse as the oracle, every scalar encoding through real writers,
damage salvaged, resumes preempted."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import DATA, ingest_paths
from real_counts import assert_matches, expected, real_tree_store
from tbparse import SummaryReader
from writers import scalar_tensor_summary, tb_native_scalars, tbx_scalars, tbx_summaries

from workbench.store import Store

KERAS = DATA / "keras_tf2_swahili_stt"
GEN = DATA / "generated"


@pytest.fixture(scope="module")
def keras_v2(tmp_path_factory):
    """tests/data/keras_tf2_swahili_stt (Keras 2.5, epoch_loss only) ingested once: (store, report). Read only."""
    store = Store(tmp_path_factory.mktemp("keras_v2") / "store")
    return store, ingest_paths(store, KERAS)


def test_keras_v2_file_epoch_loss_and_profile_placeholder_skipped(keras_v2):
    store, report = keras_v2
    df = store.query("SELECT tag, step, value FROM scalars ORDER BY step")
    assert df["tag"].unique().to_list() == ["epoch_loss"]
    assert df["step"].to_list() == list(range(10))
    assert df["value"][0] == 332.6841735839844
    assert df["value"][-1] == 234.7978057861328
    assert report.files_read == 1 and report.files_skipped == 1
    files = store.query("SELECT path, status FROM files ORDER BY path")
    assert files["status"].to_list() == ["ok", "skipped"]
    assert files["path"][1].endswith(".profile-empty")
    assert store.query("SELECT run_id FROM runs")["run_id"].to_list() == ["keras_tf2_swahili_stt"]


def test_tf_free_writer_float_val_tensor(store):
    ingest_paths(store, GEN / "tb_native_run")
    df = store.query("SELECT tag, step, value FROM scalars ORDER BY step")
    assert df["tag"].unique().to_list() == ["eval/accuracy"]
    assert df["step"].to_list() == list(range(0, 50, 5))
    assert df["value"][-1] == 0.949999988079071  # float32 widened, not rounded


def test_resumed_writer_preemption_and_hparams_subrun(store):
    ingest_paths(store, GEN / "tbx_run")
    runs = store.query("SELECT run_id, segments, status, config FROM runs")
    assert runs["run_id"].to_list() == ["run_a"]  # the add_hparams folder attaches to run_a
    config = json.loads(runs["config"][0])
    assert config["hparams"] == {"bs": 32.0, "lr": 0.001, "opt": "adam"}
    assert config["session_status"] == "SUCCESS"
    assert runs["status"][0] == "completed"

    loss = store.query("SELECT step, value FROM scalars WHERE tag = 'train/loss' ORDER BY step")
    assert loss.height == 26
    assert loss["step"].to_list() == list(range(0, 260, 10))
    assert loss["step"].n_unique() == loss.height
    raw = store.query("SELECT step, value, superseded, segment FROM scalars_all WHERE tag = 'train/loss'")
    assert raw.height == 36
    sup = raw.filter("superseded")
    assert sup.height == 10
    assert sorted(sup["step"].to_list()) == list(range(100, 200, 10))
    assert set(sup["segment"].to_list()) == {0}  # the first writer's points lose
    # the first writer's spike at step 120 is kept, but superseded by the resumed writer's value
    assert raw.filter((raw["step"] == 120) & raw["superseded"])["value"].to_list() == [9.5]
    assert loss.filter(loss["step"] == 120)["value"][0] == pytest.approx(0.4912022352218628)

    lr = store.query("SELECT count(*) AS n FROM scalars WHERE tag = 'train/lr'")
    assert lr["n"][0] == 20
    final = store.query("SELECT value FROM scalars WHERE tag = 'hparam/final_loss'")
    assert final.height == 1
    contents = store.query(
        "SELECT contents FROM files WHERE path LIKE '%1796036286.vm' AND path NOT LIKE '%857561%'"
    )
    assert json.loads(contents["contents"][0])["histograms"] == 4
    text = store.query("SELECT step, kind, message FROM events WHERE kind = 'text'")
    assert text.rows() == [(0, "text", "run_a started; **markdown** text")]
    metrics = dict(store.query("SELECT DISTINCT tag, metric FROM scalars").rows())
    assert metrics["train/loss"] == "loss" and metrics["train/lr"] == "lr"
    assert metrics["hparam/final_loss"] is None


def test_truncated_file_is_an_unfinished_write(store, tmp_path):
    run = tmp_path / "t"
    run.mkdir()
    (run / "events.out.tfevents.truncated").write_bytes(
        (GEN / "broken/events.out.tfevents.truncated").read_bytes()
    )
    report = ingest_paths(store, run)
    assert report.problems == []
    counts = dict(store.query("SELECT tag, count(*) FROM scalars GROUP BY tag").rows())
    assert counts == {"train/loss": 20, "train/lr": 20}
    f = store.query("SELECT consumed, note FROM files")
    assert f["consumed"][0] == 41941
    assert "41941" in f["note"][0]


def test_corrupt_record_is_salvaged_and_reported_with_offset(store, tmp_path):
    run = tmp_path / "c"
    run.mkdir()
    (run / "events.out.tfevents.corrupt_mid").write_bytes(
        (GEN / "broken/events.out.tfevents.corrupt_mid").read_bytes()
    )
    report = ingest_paths(store, run)
    counts = dict(store.query("SELECT tag, count(*) FROM scalars GROUP BY tag").rows())
    assert counts == {"train/loss": 20, "train/lr": 20}  # TensorBoard stops at 11
    assert [(p.offset, p.kind) for _, p in report.problems] == [(20826, "bad_data_crc")]
    prob = store.query('SELECT path, "offset", kind, message FROM problems')
    assert prob["offset"].to_list() == [20826]
    assert "10039" in prob["message"][0]
    assert store.query("SELECT count(*) AS n FROM events WHERE kind = 'text'")["n"][0] == 1


PARITY = [
    KERAS / "events.out.tfevents.1628697775.DESKTOP-V1DB051.21044.31250.v2",
    GEN / "tb_native_run/events.out.tfevents.1796036290.vm.17224.0",
    GEN / "tbx_run/run_a/events.out.tfevents.1796036286.vm",
    GEN / "tbx_run/run_a/events.out.tfevents.1796036287.vm",
    GEN / "tbx_run/run_a/1796036286.857561/events.out.tfevents.1796036286.vm",
    GEN / "broken/events.out.tfevents.truncated",
]


@pytest.fixture(scope="module")
def parity_store(tmp_path_factory):
    """Each file of PARITY alone in a run folder (run id: its index), all read by one ingest."""
    root = tmp_path_factory.mktemp("parity")
    for i, path in enumerate(PARITY):
        (root / "runs" / str(i)).mkdir(parents=True)
        shutil.copy2(path, root / "runs" / str(i) / path.name)
    store = Store(root / "store")
    ingest_paths(store, root / "runs")
    return store


@pytest.mark.parametrize("i", range(len(PARITY)), ids=[p.name for p in PARITY])
def test_parity_with_tbparse(parity_store, i):
    reader = SummaryReader(str(PARITY[i]), extra_columns={"wall_time"})
    oracle = (
        reader.scalars if len(reader.scalars) else reader.tensors
    )  # tbparse files float_val scalars as tensors
    ours = parity_store.query(
        f"SELECT tag, step, wall_time, value FROM scalars_all WHERE run_id = '{i}' ORDER BY tag, step",
    )
    expected = sorted(zip(oracle["tag"], oracle["step"], oracle["wall_time"], oracle["value"], strict=True))
    assert len(ours) == len(expected) > 0
    for (t, s, w, v), (et, es, ew, ev) in zip(ours.rows(), expected, strict=True):
        assert (t, s) == (et, int(es))
        assert w == pytest.approx(ew, abs=1e-6)
        assert v == ev


def test_simple_value_float32_round_trip(store, tmp_path):
    vals = [(s, float(np.float32(1.0 / (s + 3)))) for s in range(100)]
    tbx_scalars(
        tmp_path / "run",
        {"train/loss": vals, "grad_norm/layer.0-x": vals[:5], "Train/Samples/train_loss": vals[:3]},
    )
    ingest_paths(store, tmp_path / "run")
    df = store.query("SELECT tag, step, value, wall_time FROM scalars ORDER BY tag, step")
    loss = df.filter(df["tag"] == "train/loss")
    assert loss["step"].to_list() == list(range(100))
    assert loss["value"].to_list() == [v for _, v in vals]
    assert loss["wall_time"].to_list() == [1_700_000_000.0 + s for s in range(100)]
    assert df.filter(df["tag"] == "grad_norm/layer.0-x").height == 5
    metrics = dict(store.query("SELECT DISTINCT tag, metric FROM scalars").rows())
    assert metrics == {"train/loss": "loss", "Train/Samples/train_loss": "loss", "grad_norm/layer.0-x": None}


def test_non_finite_values_are_kept(store, tmp_path):
    tbx_scalars(
        tmp_path / "run", {"loss": [(0, 1.0), (1, float("nan")), (2, float("inf")), (3, -float("inf"))]}
    )
    ingest_paths(store, tmp_path / "run")
    v = store.query("SELECT value FROM scalars ORDER BY step")["value"].to_list()
    assert v[0] == 1.0 and np.isnan(v[1]) and v[2] == np.inf and v[3] == -np.inf


def test_tf_free_writer_encoding_c(store, tmp_path):
    tb_native_scalars(tmp_path / "run", "eval/acc", [(s, 0.5 + s / 100) for s in range(0, 50, 5)])
    ingest_paths(store, tmp_path / "run")
    df = store.query("SELECT step, value FROM scalars ORDER BY step")
    assert df["step"].to_list() == list(range(0, 50, 5))
    assert df["value"].to_list() == [float(np.float32(0.5 + s / 100)) for s in range(0, 50, 5)]


ENCODINGS = [  # dtype, tensor_content, value written, value read
    ("float", True, 0.1, float(np.float32(0.1))),  # encoding B: TF2 tensor_content
    ("float", False, 0.1, float(np.float32(0.1))),  # encoding C: float_val
    ("double", False, 0.1, 0.1),  # encoding D: double_val
    ("double", True, 1e300, 1e300),
    ("half", False, 0.5, 0.5),
    ("int64", True, 12345, 12345.0),
    ("int64", False, -7, -7.0),
]


@pytest.fixture(scope="module")
def encodings_store(tmp_path_factory):
    """Each case of ENCODINGS written as its own run (run id: its index), all read by one ingest."""
    root = tmp_path_factory.mktemp("encodings")
    for i, (dtype, content, value, _) in enumerate(ENCODINGS):
        summaries = [(s, scalar_tensor_summary("m", dtype, value, content=content)) for s in range(3)]
        tbx_summaries(root / "runs" / str(i), summaries)
    store = Store(root / "store")
    ingest_paths(store, root / "runs")
    return store


@pytest.mark.parametrize("i", range(len(ENCODINGS)), ids=["-".join(map(str, case[:3])) for case in ENCODINGS])
def test_tensor_encodings(encodings_store, i):
    expected = ENCODINGS[i][3]
    df = encodings_store.query(f"SELECT step, value FROM scalars WHERE run_id = '{i}' ORDER BY step")
    assert df["step"].to_list() == [0, 1, 2]
    assert df["value"].to_list() == [expected] * 3


def test_metadata_only_on_first_value_still_scalars(store, tmp_path):
    """TF1 FileWriter strips metadata after a tag's first write: the first-seen plugin applies."""
    first = scalar_tensor_summary("acc", "float", 0.25, content=True)
    later = scalar_tensor_summary("acc", "float", 0.5, content=True)
    later.value[0].ClearField("metadata")
    tbx_summaries(tmp_path / "run", [(0, first), (1, later), (2, later)])
    ingest_paths(store, tmp_path / "run")
    assert store.query("SELECT value FROM scalars ORDER BY step")["value"].to_list() == [0.25, 0.5, 0.5]


def test_first_seen_plugin_persists_across_incremental_ingests(store, tmp_path):
    from tensorboardX import SummaryWriter

    w = SummaryWriter(str(tmp_path / "run"))
    fw = w._get_file_writer()
    fw.add_summary(scalar_tensor_summary("acc", "float", 0.25, content=True), 0)
    w.flush()
    ingest_paths(store, tmp_path / "run")
    later = scalar_tensor_summary("acc", "float", 0.5, content=True)
    later.value[0].ClearField("metadata")
    fw.add_summary(later, 1)
    w.close()
    ingest_paths(store, tmp_path / "run")
    assert store.query("SELECT value FROM scalars ORDER BY step")["value"].to_list() == [0.25, 0.5]


def test_histograms_and_text_are_not_scalars(store, tmp_path):
    from tensorboardX import SummaryWriter

    w = SummaryWriter(str(tmp_path / "run"))
    w.add_histogram("w", np.arange(10.0), 0)
    w.add_text("notes", "hello", 3)
    w.add_scalar("loss", 1.5, 3)
    w.close()
    ingest_paths(store, tmp_path / "run")
    assert store.query("SELECT tag, step, value FROM scalars").rows() == [("loss", 3, 1.5)]
    assert store.query("SELECT step, kind, message FROM events").rows() == [(3, "text", "hello")]


# ---- Keras' train/ and validation/ of one fit: Keras 3 (TF 2.21) with
# validation data, tests/data/real/defects/d05_keras_tb_validation, counted by tbparse
@pytest.fixture(scope="module")
def keras_fit(tmp_path_factory):
    return real_tree_store(tmp_path_factory, {"fit": "defects/d05_keras_tb_validation"})


def test_keras_train_and_validation_folders_are_one_run(keras_fit):
    assert keras_fit.query("SELECT run_id, files FROM runs").rows() == [("fit/logs", 2)]
    # tags keep the folder, as TensorBoard shows run/tag; counted per sub-folder by tbparse
    assert_matches(keras_fit, "fit/logs", expected("defects/d05_keras_tb_validation/logs"))


def test_keras_validation_loss_is_eval_loss_not_loss(keras_fit):
    metrics = dict(keras_fit.query("SELECT DISTINCT tag, metric FROM scalars WHERE tag LIKE '%loss%'").rows())
    assert metrics == {
        "train/epoch_loss": "loss",
        "validation/epoch_loss": "eval_loss",
        "validation/evaluation_loss_vs_iterations": "eval_loss",
    }
    counts = expected("defects/d05_keras_tb_validation/logs")
    loss = keras_fit.query("SELECT step, value FROM scalars WHERE metric = 'loss' ORDER BY step").rows()
    assert [s for s, _ in loss] == list(range(6))
    assert loss[-1][1] == pytest.approx(counts["train/epoch_loss"]["spot"]["5"])
    assert counts["validation/epoch_loss"]["spot"]["5"] != counts["train/epoch_loss"]["spot"]["5"]


# ---- mixed step axes: Keras 3 TensorBoard(update_freq=5),
# tests/data/real/defects/d10_keras_mixed_axes
def test_epoch_and_iteration_indexed_series_in_one_run_are_flagged(tmp_path_factory, keras_fit):
    store = real_tree_store(tmp_path_factory, {"fit": "defects/d10_keras_mixed_axes"})
    counts = expected("defects/d10_keras_mixed_axes/logs")
    assert_matches(store, "fit/logs", counts)
    flagged = store.query(
        "SELECT regexp_extract(path, '(train|validation)/[^/]+$', 1) AS folder, message FROM problems "
        "WHERE kind = 'mixed_step_axes' ORDER BY folder",
    ).rows()
    assert [folder for folder, _ in flagged] == ["train", "validation"]
    train = flagged[0][1]
    assert f"train/epoch_loss count epochs (to {counts['train/epoch_loss']['last_step']})" in train.replace(
        "train/epoch_accuracy, train/epoch_learning_rate, ", ""
    )
    assert (
        f"train/batch_accuracy, train/batch_loss optimizer steps (to {counts['train/batch_loss']['last_step']})"
        in train
    )
    # d05's validation/ mixes them too (epoch_* and evaluation_*_vs_iterations); its train/ does not
    d05 = keras_fit.query("SELECT path FROM problems WHERE kind = 'mixed_step_axes'")["path"].to_list()
    assert len(d05) == 1 and "/validation/" in d05[0]


def test_a_keras_file_of_one_axis_is_not_flagged(keras_v2):
    store, _ = keras_v2  # Keras 2.5, epoch_loss only
    assert store.query("SELECT count(*) n FROM problems")["n"][0] == 0
