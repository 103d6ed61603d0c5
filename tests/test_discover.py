"""Run discovery on the layouts real tools write: which files are logs, which run each belongs to."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

from conftest import ingest_paths
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from real_counts import REAL, assert_matches, expected, real_tree_store
from real_samples import HELLO
from writers import tbx_scalars

from ingest.mlflow import mlflow_run_dir
from ingest.wandb_offline import RUN_DIR, WandbRunIngestor

ONE = {"loss": [(0, 1.0), (1, 0.5)]}


def _runs(store):
    return store.query("SELECT run_id, files FROM runs ORDER BY run_id").rows()


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
    assert store.query("SELECT segments FROM runs WHERE run_id = 'hf_out'")["segments"][0] == 2


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
    skipped = store.query("SELECT path, note FROM files WHERE status = 'skipped' ORDER BY path")
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
    assert store.query("SELECT run_id, points FROM runs ORDER BY run_id").rows() == [("a", 2), ("b", 0)]


def test_run_folder_with_many_sources_is_one_run(store, tmp_path):
    run = tmp_path / "runs/exp1"
    tbx_scalars(run / "tb", {"train/loss": [(s, 1.0) for s in range(5)]})
    with gzip.open(run / "metrics.jsonl.gz", "wt") as f:
        for s in range(5):
            f.write(json.dumps({"step": s, "loss": 2.0, "opt": {"grad_norm": 0.5}}) + "\n")
    (run / "stdout.log").write_text(HELLO)
    (run / "resume.stdout.log").write_text(HELLO.split("\n", 260)[-1])
    (run / "checkpoints").mkdir()
    (run / "checkpoints/ckpt_10.json").write_text(json.dumps({"step": 10, "sha256": "ab"}))
    ingest_paths(store, tmp_path / "runs")
    runs = store.query("SELECT run_id, formats, files, segments FROM runs").rows()
    assert runs == [("exp1", "jsonl,tensorboard,text_log", 4, 4)]
    tags = set(store.query("SELECT DISTINCT tag FROM scalars")["tag"])
    assert {"train/loss", "loss", "opt/grad_norm", "derived/loss_scale"} <= tags


def test_torch_checkpoints_with_metadata_beside_them(store, tmp_path):
    run = tmp_path / "r/exp"
    tbx_scalars(run, {"loss": [(0, 1.0)]})
    (run / "checkpoints").mkdir()
    (run / "checkpoints/ckpt_100.pt").write_bytes(b"x" * 1000)
    (run / "checkpoints/ckpt_100.json").write_text(
        json.dumps({"step": 100, "sha256": "ab12", "parent_run": "exp0"})
    )
    (run / "checkpoints/step_200.pt").write_bytes(b"y" * 10)
    ingest_paths(store, tmp_path / "r")
    rows = store.query("SELECT run_id, step, kind, size, metadata FROM checkpoints ORDER BY step").rows()
    assert [r[:4] for r in rows] == [("exp", 100, "torch", 1000), ("exp", 200, "torch", 10)]
    assert json.loads(rows[0][4]) == {"parent_run": "exp0", "sha256": "ab12", "step": 100}
    (run / "checkpoints/ckpt_100.pt").unlink()  # rotated away
    (run / "checkpoints/ckpt_100.json").unlink()
    ingest_paths(store, tmp_path / "r")
    assert store.query("SELECT step FROM checkpoints")["step"].to_list() == [200]


D01 = "defects/d01_checkpoints_output_dir"


def test_a_run_written_into_a_checkpoints_folder_is_a_run_with_its_checkpoints(tmp_path_factory):
    """HF `Trainer(output_dir="checkpoints")` (tests/data/real/defects/d01): its trainer_state.json,
    results and `runs/<stamp>/` event file are one run, the `checkpoint-N/` beside them its
    checkpoints, never the run's metrics."""
    store = real_tree_store(tmp_path_factory, {"sft": D01})
    run = "sft/checkpoints"
    assert store.query("SELECT run_id, formats, files FROM runs").rows() == [
        (run, "hf_trainer,tensorboard", 4)
    ]
    ckpts = store.query("SELECT run_id, step, kind FROM checkpoints ORDER BY step").rows()
    assert ckpts == [(run, 20, "hf"), (run, 40, "hf"), (run, 60, "hf")]
    state = expected(f"{D01}/checkpoints/trainer_state.json")
    assert_matches(store, run, {k: state[k] for k in ("loss", "grad_norm", "learning_rate", "eval_loss")})
    tb = expected(f"{D01}/checkpoints/runs")
    assert_matches(store, run, tb, {k: k.split("/", 1)[1] for k in tb if not k.startswith("_")})
    # a checkpoint's own trainer_state.json is no source of the run's points
    sources = store.query("SELECT DISTINCT source_file FROM scalars_all")["source_file"].to_list()
    assert not any("/checkpoint-" in s for s in sources)


def test_a_checkpoint_folder_whose_run_left_no_log_is_read_as_a_run(tmp_path_factory):
    """`checkpoint-40/` copied on its own (d06): its trainer_state.json is all there is of the run."""
    store = real_tree_store(tmp_path_factory, {"d06": "defects/d06_checkpoint_alone"})
    run = "d06/checkpoint-40"
    runs = store.query("SELECT run_id, formats FROM runs ORDER BY run_id").rows()
    assert runs == [(run, "hf_trainer"), ("d06/hub_repo_root", "hf_trainer")]
    assert store.query("SELECT run_id, step FROM checkpoints").rows() == [(run, 40)]
    state = expected("defects/d06_checkpoint_alone/checkpoint-40/trainer_state.json")
    assert_matches(store, run, {k: state[k] for k in ("loss", "grad_norm", "eval_loss")})


def test_a_git_lfs_pointer_is_named_as_such_and_read_once_pulled(tmp_path_factory):
    """d09: HF output cloned without its LFS objects: `runs/<stamp>/events.out.tfevents.*` is a
    129-byte pointer. It is listed with its run and a problem that says what it is and what to
    do (not "record length corrupt"); once `git lfs pull` puts the content there, it is read."""
    store = real_tree_store(tmp_path_factory, {"hf": "defects/d09_lfs_pointer"})
    pointer = "runs/Dec01_22-21-04_vm/events.out.tfevents.1796163664.vm.15059.0"
    lfs = expected(f"defects/d09_lfs_pointer/{pointer}")["_lfs"]
    problems = store.query("SELECT path, run_id, kind, message FROM problems").rows()
    assert len(problems) == 1 and problems[0][0].endswith(pointer) and problems[0][1] == "hf"
    assert f"Git LFS pointer ({lfs['oid']}, {int(lfs['size']):,} bytes)" in problems[0][3]
    assert "git lfs pull" in problems[0][3] and "corrupt" not in problems[0][3]
    row = store.query("SELECT run_id, format, status FROM files WHERE path LIKE '%tfevents%'").rows()
    assert row == [("hf", None, "error")]
    again = ingest_paths(store, store.root.parent / "runs")  # reported once, not once per ingest
    assert again.files_read == 0 and store.query("SELECT count(*) n FROM problems")["n"][0] == 1
    pulled = REAL / "defects/d01_checkpoints_output_dir/checkpoints" / pointer  # the object it names
    (store.root.parent / "runs/hf" / pointer).write_bytes(pulled.read_bytes())
    ingest_paths(store, store.root.parent / "runs")
    assert store.query("SELECT count(*) n FROM problems")["n"][0] == 0
    tb = expected("defects/d01_checkpoints_output_dir/checkpoints/runs")
    assert_matches(store, "hf", tb, {k: k.split("/", 1)[1] for k in tb if not k.startswith("_")})


def test_a_log_known_unchanged_is_not_opened_again_and_a_changed_one_is(tmp_path):
    """Discovery takes a file's format from what the store knows while its size and mtime are
    those it was read at (a re-ingest of 10k runs opens no head), and looks again once either
    moved."""
    import os

    from ingest.discover import discover
    from ingest.registry import make_ingestors

    log = tmp_path / "run/metrics.jsonl"
    log.parent.mkdir()
    log.write_text('{"step": 1, "loss": 0.5}\n')
    ingestors = make_ingestors()
    st = log.stat()
    assert [f.format for f in discover(tmp_path / "run", ingestors).files] == ["jsonl"]
    # a format only the record can give: proof that the file was not sniffed
    known = {str(log): (st.st_size, st.st_mtime_ns, "keras_csv")}
    assert [f.format for f in discover(tmp_path / "run", ingestors, known).files] == ["keras_csv"]
    os.utime(log, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert [f.format for f in discover(tmp_path / "run", ingestors, known).files] == ["jsonl"]


# MLflow's and W&B's run folders are found from a path's names (every folder of an ingest asks);
# the reference below walks the parents as `Path`s, as the definitions read
_NAMES = ["metrics", "params", "tags", "files", "logs", "tmp", "x", "offline-run-20240101_000000-abc12345"]


def _mlflow_by_parents(folder: Path) -> Path | None:
    for d in (folder, *folder.parents):
        if d.name in ("metrics", "params", "tags") and (d.parent / "meta.yaml").is_file():
            return d.parent
    return None


def _wandb_by_parents(folder: Path) -> Path | None:
    if RUN_DIR.fullmatch(folder.name):
        return folder
    for up in folder.parents:
        if RUN_DIR.fullmatch(up.name) and folder.relative_to(up).parts[0] in ("files", "logs", "tmp"):
            return up
    return None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    names=st.lists(st.sampled_from(_NAMES), min_size=0, max_size=6),
    absolute=st.booleans(),
    meta_at=st.sets(st.integers(0, 6), max_size=3),
)
def test_run_folders_from_names_match_the_walk_over_parents(tmp_path, monkeypatch, names, absolute, meta_at):
    base = tmp_path / "t"
    shutil.rmtree(base, ignore_errors=True)
    (base / Path(*names) if names else base).mkdir(parents=True)
    for i in meta_at:  # an MLflow run's meta.yaml in some of the folders on the way
        if i <= len(names):
            (base / Path(*names[:i]) / "meta.yaml").write_text("status: 3\n")
    monkeypatch.chdir(base)
    folder = (base if absolute else Path()) / Path(*names)
    assert mlflow_run_dir(folder) == _mlflow_by_parents(folder)
    assert WandbRunIngestor().run_folder(folder) == _wandb_by_parents(folder)
