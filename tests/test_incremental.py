"""Re-ingest: unchanged files decode nothing, grown files resume, rewritten files re-read alone."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from conftest import DATA, ingest_paths
from real_samples import HELLO
from tensorboardX import SummaryWriter
from writers import tbx_scalars

from ingest import lines, manifest
from workbench.store import Store


def _snapshot(store):
    return store.query("SELECT run_id, tag, step, value, superseded FROM scalars_all ORDER BY ALL")


def test_reingest_unchanged_tree_reads_nothing_and_changes_nothing(store, data_copy):
    first = ingest_paths(store, data_copy)
    before = _snapshot(store)
    gen_before = store.current_generation()
    again = ingest_paths(store, data_copy)
    assert again.files_read == 0 and again.bytes_read == 0 and again.points == 0
    assert again.files_unchanged == first.files_read
    assert _snapshot(store).equals(before)
    assert store.current_generation() != gen_before  # a commit happened, with the same content
    dupes = store.query("SELECT run_id, tag, step, count(*) n FROM scalars GROUP BY ALL HAVING n > 1")
    assert dupes.height == 0


def test_growing_file_resumes_from_saved_offset(store, tmp_path):
    w = SummaryWriter(str(tmp_path / "run"))
    for s in range(50):
        w.add_scalar("loss", float(s), s)
    w.flush()
    first = ingest_paths(store, tmp_path / "run")  # tensorboardX flushes asynchronously: some of 50
    size_1 = store.query("SELECT consumed FROM files")["consumed"][0]
    for s in range(50, 120):
        w.add_scalar("loss", float(s), s)
    w.close()
    r = ingest_paths(store, tmp_path / "run")
    assert r.files_read == 1 and r.points == 120 - first.points
    assert r.bytes_read == (tmp_path / "run").glob("*tfevents*").__next__().stat().st_size - size_1
    df = store.query("SELECT step, value FROM scalars ORDER BY step")
    assert df["step"].to_list() == list(range(120))
    assert store.query("SELECT count(*) n FROM scalars_all")["n"][0] == 120


def test_unfinished_record_completed_later(store, tmp_path):
    src = DATA / "generated/tbx_run/run_a/events.out.tfevents.1796036286.vm"
    run = tmp_path / "run"
    run.mkdir()
    full = src.read_bytes()
    (run / src.name).write_bytes(full[:-7])
    ingest_paths(store, run)
    assert store.query("SELECT count(*) n FROM events WHERE kind = 'text'")["n"][0] == 0
    (run / src.name).write_bytes(full)
    r = ingest_paths(store, run)
    assert r.bytes_read == 87 + 16  # just the completed record
    assert store.query("SELECT count(*) n FROM events WHERE kind = 'text'")["n"][0] == 1
    assert store.query("SELECT count(*) n FROM scalars")["n"][0] == 40


def test_rewritten_file_is_reread_alone(store, tmp_path):
    f = tbx_scalars(tmp_path / "run", {"loss": [(s, 1.0) for s in range(30)]})
    tbx_scalars(tmp_path / "other", {"loss": [(s, 2.0) for s in range(10)]})
    ingest_paths(store, tmp_path)
    # replace the first file with different content under the same name
    tmp = tbx_scalars(tmp_path / "scratch", {"loss": [(s, 3.0) for s in range(5)]})
    shutil.copy(tmp, f)
    shutil.rmtree(tmp_path / "scratch")
    r = ingest_paths(store, tmp_path)
    assert r.files_read == 1
    df = store.query(
        "SELECT run_id, count(*) n, max(value) v FROM scalars_all GROUP BY run_id ORDER BY run_id"
    )
    assert df.rows() == [("other", 10, 2.0), ("run", 5, 3.0)]


def test_deleted_file_keeps_its_points(store, tmp_path):
    f = tbx_scalars(tmp_path / "run", {"loss": [(s, 1.0) for s in range(30)]})
    ingest_paths(store, tmp_path)
    f.unlink()
    tbx_scalars(tmp_path / "run2", {"loss": [(0, 1.0)]})
    ingest_paths(store, tmp_path)
    assert store.query("SELECT count(*) n FROM scalars WHERE run_id = 'run'")["n"][0] == 30


def test_run_ids_stay_stable_when_a_subfolder_is_ingested(store, tmp_path):
    tbx_scalars(tmp_path / "group/exp1", {"loss": [(0, 1.0)]})
    tbx_scalars(tmp_path / "group/exp2", {"loss": [(0, 1.0)]})
    ingest_paths(store, tmp_path)
    tbx_scalars(tmp_path / "group/exp3", {"loss": [(0, 1.0)]})
    ingest_paths(store, tmp_path / "group")
    runs = store.query("SELECT run_id FROM runs ORDER BY run_id")["run_id"].to_list()
    assert runs == ["group/exp1", "group/exp2", "group/exp3"]


def test_same_step_twice_in_one_file_keeps_the_last(store, tmp_path):
    tbx_scalars(tmp_path / "run", {"loss": [(0, 1.0), (1, 2.0), (2, 3.0), (1, 20.0), (2, 30.0), (3, 4.0)]})
    ingest_paths(store, tmp_path / "run")
    assert store.query("SELECT step, value FROM scalars ORDER BY step").rows() == [
        (0, 1.0),
        (1, 20.0),
        (2, 30.0),
        (3, 4.0),
    ]
    assert store.query("SELECT count(*) n FROM scalars_all WHERE superseded")["n"][0] == 2


def _rewrite_in_place(path, old: bytes, new: bytes, at: int | None = None) -> None:
    """Same size, new bytes in the middle, a newer mtime: what an editor or a resumed job does."""
    data = path.read_bytes()
    at = data.index(old) if at is None else at
    assert len(old) == len(new) and data[at : at + len(old)] == old
    st = path.stat()
    path.write_bytes(data[:at] + new + data[at + len(old) :])
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_a_same_size_rewrite_in_the_middle_is_read_again(store, tmp_path):
    # changed outside the first 4 KB and the 4 KB before the old end: only a content check sees it
    run = tmp_path / "run"
    run.mkdir()
    f = run / "metrics.jsonl"
    f.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(2000)))
    ingest_paths(store, run)
    _rewrite_in_place(f, b'{"step": 1000, "loss": 1.0}', b'{"step": 1000, "loss": 7.0}')
    r = ingest_paths(store, run)
    assert r.files_read == 1
    assert store.query("SELECT value FROM scalars WHERE step = 1000")["value"].to_list() == [7.0]
    assert store.query("SELECT count(*) n FROM scalars_all")["n"][0] == 2000


def test_a_big_event_file_rewritten_in_the_middle_is_read_again(store, tmp_path):
    # past FULL_HASH_BYTES the check samples windows, the middle one among them
    f = tbx_scalars(tmp_path / "run", {"loss": [(s, 1.0) for s in range(2000)]})
    data = f.read_bytes()
    first = 16 + int.from_bytes(data[:8], "little")  # the file_version record, then 2000 scalars
    copies = manifest.FULL_HASH_BYTES // (len(data) - first) + 1
    f.write_bytes(data[:first] + data[first:] * copies)  # the same records again: resumed writers
    ingest_paths(store, tmp_path / "run")
    data = f.read_bytes()
    recs, p = [], 0
    while p < len(data):
        n = int.from_bytes(data[p : p + 8], "little")
        recs.append((p, 16 + n))
        p += 16 + n
    off, n = next((o, n) for o, n in recs if o <= len(data) // 2 < o + n)
    record = data[off : off + n]
    _rewrite_in_place(f, record, record[:-1] + bytes([record[-1] ^ 0xFF]), at=off)
    r = ingest_paths(store, tmp_path / "run")
    assert r.files_read == 1 and r.points == 2000 * copies - 1  # the damaged record is reported
    # read again from the start (a rewrite is a problem row of its own), the damage reported
    assert [x.kind for _, x in r.problems] == ["rewritten", "bad_data_crc"]


def test_a_touched_file_is_checked_not_read(store, tmp_path):
    f = tbx_scalars(tmp_path / "run", {"loss": [(s, 1.0) for s in range(100)]})
    ingest_paths(store, tmp_path / "run")
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    r = ingest_paths(store, tmp_path / "run")
    assert r.files_read == 0 and r.files_unchanged == 1
    assert store.query("SELECT mtime FROM files")["mtime"][0].timestamp() == pytest.approx(
        st.st_mtime + 1, abs=1e-5
    )
    assert ingest_paths(store, tmp_path / "run").files_unchanged == 1  # its new mtime was kept


def _views(store) -> dict:
    """What a user sees of a store (ingest times and file times left out)."""
    sql = {
        "scalars_all": "SELECT run_id, tag, step, value, superseded FROM scalars_all",
        "events": 'SELECT run_id, step, kind, message, attrs, "offset" FROM events',
        "runs": "SELECT run_id, status, evidence, points, first_step, last_step FROM runs",
        "problems": "SELECT path, kind, message FROM problems",
        "files": "SELECT path, consumed, records, points, problems, note, contents FROM files",
    }
    return {name: store.query(f"{query} ORDER BY ALL") for name, query in sql.items()}


def _differ(a, b) -> list[str]:
    """The views in which two stores differ."""
    return [name for name in a if not a[name].equals(b[name])]


def _cut_consoles() -> dict[str, str]:
    """The HelloDeepSpeed console cut as a killed or still running job leaves it, by run: its
    last line without a newline (at step 40), or ending in OVERFLOW notices (after step 10)."""
    lines = HELLO.splitlines(keepends=True)
    at40 = next(i for i, line in enumerate(lines) if "] step=40," in line)
    at20 = next(i for i, line in enumerate(lines) if "] step=20," in line)
    assert "OVERFLOW" in lines[at20 - 1]
    return {
        "cut_mid_line": "".join(lines[:at40]) + lines[at40].rstrip("\n"),
        "ends_in_overflows": "".join(lines[:at20]),
    }


def test_a_log_first_read_while_written_converges_to_a_fresh_ingest(tmp_path, monkeypatch):
    """A console ingested within a minute of its last write holds back what may still change
    (an unfinished last line; OVERFLOW notices waiting for the next step line); once it has
    settled, an ingest takes it though the file did not change, and equals a fresh ingest."""
    texts = _cut_consoles()
    for run, text in texts.items():
        (tmp_path / "runs" / run).mkdir(parents=True)
        (tmp_path / "runs" / run / "stdout.log").write_text(text)  # just written: may still grow
    store = Store(tmp_path / "store")
    ingest_paths(store, tmp_path / "runs")
    last_step = "SELECT max(step) s FROM scalars WHERE run_id = 'cut_mid_line' AND tag = 'skipped'"
    overflows = "SELECT count(*) n FROM events WHERE run_id = 'ends_in_overflows' AND kind = 'overflow'"
    assert store.query(last_step)["s"][0] == 30  # the step-40 line is not whole yet
    assert store.query(overflows)["n"][0] == 10  # the 7 notices after step 10 wait for step 20
    monkeypatch.setattr(lines, "SETTLED_S", -1)  # a minute later, the files untouched: settled now
    again = ingest_paths(store, tmp_path / "runs")
    assert again.files_read == 2
    fresh = Store(tmp_path / "fresh")
    ingest_paths(fresh, tmp_path / "runs")
    assert _differ(_views(store), _views(fresh)) == []
    assert store.query(last_step)["s"][0] == 40
    assert store.query(overflows)["n"][0] == texts["ends_in_overflows"].count("OVERFLOW!") == 17
    third = ingest_paths(store, tmp_path / "runs")
    assert third.files_read == 0 and _differ(_views(store), _views(fresh)) == []
