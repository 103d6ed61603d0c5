"""Every scalar encoding, written by real writers, read back exactly."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ingest_paths, q
from writers import scalar_tensor_summary, tb_native_scalars, tbx_scalars, tbx_summaries


def test_simple_value_float32_round_trip(store, tmp_path):
    vals = [(s, float(np.float32(1.0 / (s + 3)))) for s in range(100)]
    tbx_scalars(
        tmp_path / "run",
        {"train/loss": vals, "grad_norm/layer.0-x": vals[:5], "Train/Samples/train_loss": vals[:3]},
    )
    ingest_paths(store, tmp_path / "run")
    df = q(store, "SELECT tag, step, value, wall_time FROM scalars ORDER BY tag, step")
    loss = df.filter(df["tag"] == "train/loss")
    assert loss["step"].to_list() == list(range(100))
    assert loss["value"].to_list() == [v for _, v in vals]
    assert loss["wall_time"].to_list() == [1_700_000_000.0 + s for s in range(100)]
    assert df.filter(df["tag"] == "grad_norm/layer.0-x").height == 5
    metrics = dict(q(store, "SELECT DISTINCT tag, metric FROM scalars").rows())
    assert metrics == {"train/loss": "loss", "Train/Samples/train_loss": "loss", "grad_norm/layer.0-x": None}


def test_non_finite_values_are_kept(store, tmp_path):
    tbx_scalars(
        tmp_path / "run", {"loss": [(0, 1.0), (1, float("nan")), (2, float("inf")), (3, -float("inf"))]}
    )
    ingest_paths(store, tmp_path / "run")
    v = q(store, "SELECT value FROM scalars ORDER BY step")["value"].to_list()
    assert v[0] == 1.0 and np.isnan(v[1]) and v[2] == np.inf and v[3] == -np.inf


def test_tf_free_writer_encoding_c(store, tmp_path):
    tb_native_scalars(tmp_path / "run", "eval/acc", [(s, 0.5 + s / 100) for s in range(0, 50, 5)])
    ingest_paths(store, tmp_path / "run")
    df = q(store, "SELECT step, value FROM scalars ORDER BY step")
    assert df["step"].to_list() == list(range(0, 50, 5))
    assert df["value"].to_list() == [float(np.float32(0.5 + s / 100)) for s in range(0, 50, 5)]


@pytest.mark.parametrize(
    "dtype, content, value, expected",
    [
        ("float", True, 0.1, float(np.float32(0.1))),  # encoding B: TF2 tensor_content
        ("float", False, 0.1, float(np.float32(0.1))),  # encoding C: float_val
        ("double", False, 0.1, 0.1),  # encoding D: double_val
        ("double", True, 1e300, 1e300),
        ("half", False, 0.5, 0.5),
        ("int64", True, 12345, 12345.0),
        ("int64", False, -7, -7.0),
    ],
)
def test_tensor_encodings(store, tmp_path, dtype, content, value, expected):
    tbx_summaries(
        tmp_path / "run", [(s, scalar_tensor_summary("m", dtype, value, content=content)) for s in range(3)]
    )
    ingest_paths(store, tmp_path / "run")
    df = q(store, "SELECT step, value FROM scalars ORDER BY step")
    assert df["step"].to_list() == [0, 1, 2]
    assert df["value"].to_list() == [expected] * 3


def test_metadata_only_on_first_value_still_scalars(store, tmp_path):
    """TF1 FileWriter strips metadata after a tag's first write: the first-seen plugin applies."""
    first = scalar_tensor_summary("acc", "float", 0.25, content=True)
    later = scalar_tensor_summary("acc", "float", 0.5, content=True)
    later.value[0].ClearField("metadata")
    tbx_summaries(tmp_path / "run", [(0, first), (1, later), (2, later)])
    ingest_paths(store, tmp_path / "run")
    assert q(store, "SELECT value FROM scalars ORDER BY step")["value"].to_list() == [0.25, 0.5, 0.5]


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
    assert q(store, "SELECT value FROM scalars ORDER BY step")["value"].to_list() == [0.25, 0.5]


def test_histograms_and_text_are_not_scalars(store, tmp_path):
    from tensorboardX import SummaryWriter

    w = SummaryWriter(str(tmp_path / "run"))
    w.add_histogram("w", np.arange(10.0), 0)
    w.add_text("notes", "hello", 3)
    w.add_scalar("loss", 1.5, 3)
    w.close()
    ingest_paths(store, tmp_path / "run")
    assert q(store, "SELECT tag, step, value FROM scalars").rows() == [("loss", 3, 1.5)]
    assert q(store, "SELECT step, kind, message FROM events").rows() == [(3, "text", "hello")]
