"""Run discovery on the layouts real tools write (DESIGN.md, "Run discovery")."""

from __future__ import annotations

from conftest import ingest_paths, q
from writers import tbx_scalars

ONE = {"loss": [(0, 1.0), (1, 0.5)]}


def _runs(store):
    return q(store, "SELECT run_id, files FROM runs ORDER BY run_id").rows()


def test_plain_tensorboard_tree_each_folder_is_a_run(store, tmp_path):
    tbx_scalars(tmp_path / "runs/exp1", ONE)
    tbx_scalars(tmp_path / "runs/exp2", ONE)
    tbx_scalars(tmp_path / "runs/exp2/sub", ONE)  # TensorBoard: a sub-folder is its own run
    ingest_paths(store, tmp_path / "runs")
    assert _runs(store) == [("exp1", 1), ("exp2", 1), ("exp2/sub", 1)]


def test_path_that_is_itself_a_run_is_named_by_its_folder(store, tmp_path):
    tbx_scalars(tmp_path / "my_run", ONE)
    ingest_paths(store, tmp_path / "my_run")
    assert _runs(store) == [("my_run", 1)]


def test_container_folders_attach_to_their_run(store, tmp_path):
    tbx_scalars(tmp_path / "r/run1/tb", ONE)
    tbx_scalars(tmp_path / "r/run2/logs", ONE)
    tbx_scalars(tmp_path / "r/hf_out/runs/Nov30_12-00-00_host", ONE)
    tbx_scalars(tmp_path / "r/hf_out/runs/Nov30_13-05-10_host", ONE)  # a resume: second segment
    tbx_scalars(tmp_path / "r/ds/monitor_tb/job1", ONE)
    ingest_paths(store, tmp_path / "r")
    assert _runs(store) == [("ds", 1), ("hf_out", 2), ("run1", 1), ("run2", 1)]
    assert q(store, "SELECT segments FROM runs WHERE run_id = 'hf_out'")["segments"][0] == 2


def test_hparams_subfolder_attaches_and_checkpoints_are_not_runs(store, tmp_path):
    tbx_scalars(tmp_path / "r/exp", ONE)
    tbx_scalars(tmp_path / "r/exp/1796036286.857561", {"hparam/x": [(0, 1.0)]})
    tbx_scalars(tmp_path / "r/exp/checkpoint-500", ONE)
    tbx_scalars(tmp_path / "r/exp/global_step10", ONE)
    ingest_paths(store, tmp_path / "r")
    assert _runs(store) == [("exp", 2)]


def test_store_inside_the_tree_and_stray_files(tmp_path):
    from workbench.store import Store

    tbx_scalars(tmp_path / "r/exp", ONE)
    (tmp_path / "r/exp/README.md").write_text("notes")
    (tmp_path / "r/exp/events.out.tfevents.0.host.profile-empty").write_bytes(b"")
    (tmp_path / "r/empty").mkdir()
    store = Store(tmp_path / "r/mystore")
    r = ingest_paths(store, tmp_path / "r")
    r2 = ingest_paths(store, tmp_path / "r")  # the store's own files must not be ingested
    assert r.files_read == 1 and r.files_skipped == 2
    assert r2.files_read == 0 and r2.files_skipped == 2
    skipped = q(store, "SELECT path, note FROM files WHERE status = 'skipped' ORDER BY path")
    assert [p.rsplit("/", 1)[1] for p in skipped["path"]] == [
        "README.md",
        "events.out.tfevents.0.host.profile-empty",
    ]


def test_empty_event_file_is_reported_not_fatal(store, tmp_path):
    tbx_scalars(tmp_path / "r/a", ONE)
    (tmp_path / "r/b").mkdir(parents=True)
    (tmp_path / "r/b/events.out.tfevents.1.host").write_bytes(b"")
    r = ingest_paths(store, tmp_path / "r")
    assert r.problems == []
    assert q(store, "SELECT run_id, points FROM runs ORDER BY run_id").rows() == [("a", 2), ("b", 0)]
