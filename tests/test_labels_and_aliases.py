"""Canonical metrics from workbench.toml aliases; labels from labels.toml, the CLI and evidence."""

from __future__ import annotations

from conftest import ingest_paths
from writers import tbx_scalars


def test_user_aliases_from_workbench_toml(tmp_path, monkeypatch):
    from workbench.store import Store

    store = Store(tmp_path / "store")
    tbx_scalars(tmp_path / "r", {"my_model/xent": [(0, 1.0)], "train/loss": [(0, 1.0)]})
    ingest_paths(store, tmp_path / "r")
    assert dict(store.query("SELECT tag, metric FROM scalars").rows())["my_model/xent"] is None
    (store.root / "workbench.toml").write_text('[aliases]\nloss = ["my_model/*"]\n')
    assert dict(store.query("SELECT tag, metric FROM scalars").rows()) == {
        "my_model/xent": "loss",
        "train/loss": "loss",
    }


def test_auto_labels_from_evidence_and_manual_override(store, tmp_path):
    tbx_scalars(
        tmp_path / "r/nan_run", {"train/loss": [(0, 2.0), (1, 1.5), (2, float("nan")), (3, float("nan"))]}
    )
    tbx_scalars(tmp_path / "r/fine", {"train/loss": [(0, 2.0), (1, 1.5)]})
    tbx_scalars(tmp_path / "r/labelled", {"train/loss": [(0, 2.0), (1, float("inf"))]})
    (tmp_path / "r/labels.toml").write_text(
        '[runs."labelled"]\noutcome = "healthy"\nnote = "inf was a logging bug"\n'
        '[runs."broken"]\noutcome = "maybe"\n'
    )
    r = ingest_paths(store, tmp_path / "r")
    assert [p.kind for _, p in r.problems] == ["bad_label"]
    labels = store.query("SELECT run_id, outcome, onset, kind, source FROM labels ORDER BY run_id").rows()
    assert labels == [
        ("labelled", "healthy", None, None, "manual"),
        ("nan_run", "failed", 2, "divergence_nan", "auto"),
    ]


def test_label_attributes_are_kept_as_json_and_survive_a_manual_override(store, tmp_path):
    tbx_scalars(tmp_path / "r/a", {"train/loss": [(0, 2.0), (1, 1.5)]})
    tbx_scalars(tmp_path / "r/b", {"train/loss": [(0, 2.0), (1, 1.5)]})
    (tmp_path / "r/labels.toml").write_text(
        '[runs."a"]\noutcome = "healthy"\ntrainer = "hf"\nsize = 12\nclip = 0.25\nbf16 = true\n'
        '[runs."b"]\noutcome = "failed"\nonset = 1\noptimizer = "sgd"\nextra = [1, 2]\n'
    )
    r = ingest_paths(store, tmp_path / "r")
    assert [(p.kind, "extra" in p.message) for _, p in r.problems] == [("bad_label", True)]
    rows = store.query(
        "SELECT run_id, attrs->>'trainer' AS trainer, (attrs->>'size')::INT AS size, "
        "(attrs->>'clip')::DOUBLE AS clip, attrs->>'bf16' AS bf16, attrs->>'optimizer' AS opt "
        "FROM labels ORDER BY run_id",
    ).rows()
    assert rows == [("a", "hf", 12, 0.25, "true", None), ("b", None, None, None, None, "sgd")]
    store.label("b", "healthy", None, None, "re-checked")  # the CLI's word on the outcome only
    assert store.query("SELECT outcome, attrs->>'optimizer' FROM labels WHERE run_id = 'b'").rows() == [
        ("healthy", "sgd")
    ]
