"""Fault injection: one bad file never costs the rest.

Every case of the bad-input corpus is generated here (no binary blobs in the repository), each in
a run folder of its own, beside good runs whose points the generator counts itself. One CLI
ingest of the whole corpus must exit 0 with no traceback, leave a `problems` row naming each bad
file (or, for the valid-but-odd logs, read it), and store every good point of every other file.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import struct
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import ingest_paths
from tensorboard.compat.proto import event_pb2
from tensorboardX.record_writer import masked_crc32c
from writers import tbx_scalars

import ingest.lines
import ingest.pipeline
from workbench.store import Store

HOUR_AGO = 3600


@dataclass
class Case:
    path: Path  # the bad (or odd) file
    kind: str | None  # the problem kind it must leave; None: a valid log that must be read
    points: set = field(default_factory=set)  # (tag, step, value) its run must hold exactly
    prefix_of: list | None = None  # or: its run holds a non-empty prefix of these (cut streams)


def _jsonl(path: Path, records: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))


def _records(path: Path) -> list[tuple[int, bytes]]:
    """(offset, payload) of each TFRecord, walked with the format's own framing."""
    data, out, p = path.read_bytes(), [], 0
    while p + 12 <= len(data):
        (n,) = struct.unpack_from("<Q", data, p)
        out.append((p, data[p + 12 : p + 12 + n]))
        p += 16 + n
    return out


def _scalars_of(payload: bytes) -> set:
    ev = event_pb2.Event()
    ev.ParseFromString(payload)
    return {(v.tag, ev.step, v.simple_value) for v in ev.summary.value}


def _tb_with_bad_length(folder: Path, length: int, which: int | None) -> tuple[Path, set]:
    """A real event file whose record `which` (None: the last) declares `length` bytes, under a
    valid length CRC; returns it and the points of every other record."""
    f = tbx_scalars(folder, {"loss": [(s, s / 4) for s in range(40)]})
    recs = _records(f)
    which = len(recs) - 1 if which is None else which
    data = bytearray(f.read_bytes())
    off = recs[which][0]
    head = struct.pack("<Q", length)
    data[off : off + 12] = head + struct.pack("<I", masked_crc32c(head))
    f.write_bytes(bytes(data))
    return f, set().union(*(_scalars_of(p) for i, (_, p) in enumerate(recs) if i != which))


def build_corpus(root: Path) -> tuple[dict[str, Case], dict[str, set]]:
    """(bad cases by name, good runs' points by run id)."""
    rng = random.Random(17)
    good = {
        "good_jsonl": {(t, s, s * m) for s in range(500) for t, m in (("loss", 0.5), ("lr", 0.25))},
        "good_tb": {("loss", s, s / 8) for s in range(300)},
    }
    _jsonl(
        root / "good_jsonl/metrics.jsonl",
        [{"step": s, "loss": s * 0.5, "lr": s * 0.25} for s in range(500)],
    )
    tbx_scalars(root / "good_tb", {"loss": [(s, s / 8) for s in range(300)]})

    cases: dict[str, Case] = {}

    def jsonl_case(name: str, bad, kind="bad_record", **extra) -> None:
        path = root / name / "metrics.jsonl"
        _jsonl(path, [{"step": 1, "a": 1.0}, bad, {"step": 3, "a": 3.0}])
        cases[name] = Case(path, kind, {("a", 1, 1.0), ("a", 3, 3.0)}, **extra)

    jsonl_case("jsonl_step_nan", '{"step": NaN, "a": 2}')
    jsonl_case("jsonl_step_inf", '{"step": Infinity, "a": 2}')
    jsonl_case("jsonl_step_1e30", '{"step": 1e30, "a": 2}')
    jsonl_case("jsonl_step_12abc", '{"step": "12abc", "a": 2}')
    jsonl_case("jsonl_step_true", '{"step": true, "a": 2}')
    jsonl_case("jsonl_nested_arrays_2000", '{"step": 2, "a": ' + "[" * 2000 + "]" * 2000 + "}", "bad_json")
    jsonl_case(
        "jsonl_nested_objects_990", '{"step": 2, "a": ' + '{"a": ' * 990 + "1" + "}" * 990 + "}", "bad_json"
    )
    jsonl_case("jsonl_line_17MiB", json.dumps({"step": 2, "a": 2, "pad": "x" * (17 << 20)}), "line_too_long")
    # a .jsonl.gz cut in the middle of its compressed stream: the lines before the cut are read
    lines = [{"step": s, "a": float(s)} for s in range(2000)]
    blob = gzip.compress("".join(json.dumps(r) + "\n" for r in lines).encode(), mtime=0)
    (root / "jsonl_gz_truncated").mkdir()
    (root / "jsonl_gz_truncated/metrics.jsonl.gz").write_bytes(blob[: len(blob) * 3 // 5])
    cases["jsonl_gz_truncated"] = Case(
        root / "jsonl_gz_truncated/metrics.jsonl.gz",
        "bad_gzip",
        prefix_of=[("a", r["step"], r["a"]) for r in lines],
    )
    (root / "jsonl_gz_not_gzip").mkdir()
    (root / "jsonl_gz_not_gzip/metrics.jsonl.gz").write_bytes(b'{"step": 1, "a": 1}\n')
    cases["jsonl_gz_not_gzip"] = Case(root / "jsonl_gz_not_gzip/metrics.jsonl.gz", "not_read")
    # a JSON array of records with a NaN step
    path = root / "json_array_nan_step/metrics.json"
    path.parent.mkdir()
    path.write_text('[{"step": NaN, "a": 1}, {"step": 2, "a": 2}]')
    cases["json_array_nan_step"] = Case(path, "bad_record", {("a", 2, 2.0)})
    # HF trainer_state.json: binary, NaN steps, nested too deep
    path = root / "trainer_state_binary/trainer_state.json"
    path.parent.mkdir()
    path.write_bytes(b'{"log_history": [' + rng.randbytes(4096))
    cases["trainer_state_binary"] = Case(path, "bad_json")
    path = root / "trainer_state_nan_step/trainer_state.json"
    path.parent.mkdir()
    path.write_text(
        '{"global_step": NaN, "max_steps": 10, "log_history": '
        '[{"step": NaN, "loss": 1.0}, {"step": 1e30, "loss": 1.5}, {"step": 5, "loss": 2.0}]}'
    )
    cases["trainer_state_nan_step"] = Case(path, "bad_step", {("loss", 5, 2.0)})
    path = root / "trainer_state_nested_5000/trainer_state.json"
    path.parent.mkdir()
    path.write_text('{"log_history": ' + "[" * 5000 + "]" * 5000 + "}")
    cases["trainer_state_nested_5000"] = Case(path, "bad_json")
    path = root / "ds_config_binary/ds_config.json"
    path.parent.mkdir()
    path.write_bytes(b"{" + rng.randbytes(2048))
    cases["ds_config_binary"] = Case(path, "bad_json")
    # TensorBoard: the least int64 step (valid, read); length fields with valid CRCs past the end
    f = tbx_scalars(root / "tb_step_min_int64", {"loss": [(-(2**63), 1.0), (5, 2.0)]})
    cases["tb_step_min_int64"] = Case(f, None, {("loss", -(2**63), 1.0), ("loss", 5, 2.0)})
    for name, length in (("tb_length_2_40_mid", 2**40), ("tb_length_2_63_mid", 2**63)):
        f, pts = _tb_with_bad_length(root / name, length, which=20)
        cases[name] = Case(f, "bad_length", pts)
    f, pts = _tb_with_bad_length(root / "tb_length_2_40_last_settled", 2**40, which=None)
    os.utime(f, (f.stat().st_atime - HOUR_AGO, f.stat().st_mtime - HOUR_AGO))  # the writer is gone
    cases["tb_length_2_40_last_settled"] = Case(f, "bad_length", pts)
    # not regular files: reading them would block or never end
    (root / "tb_fifo").mkdir()
    os.mkfifo(root / "tb_fifo/events.out.tfevents.1.host")
    cases["tb_fifo"] = Case(root / "tb_fifo/events.out.tfevents.1.host", "not_read")
    (root / "tb_symlink_dev_zero").mkdir()
    (root / "tb_symlink_dev_zero/events.out.tfevents.2.host").symlink_to("/dev/zero")
    cases["tb_symlink_dev_zero"] = Case(root / "tb_symlink_dev_zero/events.out.tfevents.2.host", "not_read")
    # valid logs whose first line a strict sniff would refuse
    path = root / "jsonl_bom/metrics.jsonl"
    path.parent.mkdir()
    path.write_bytes(b"\xef\xbb\xbf" + b'{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n')
    cases["jsonl_bom"] = Case(path, None, {("a", 1, 1.0), ("a", 2, 2.0)})
    path = root / "jsonl_latin1/metrics.jsonl"
    path.parent.mkdir()
    path.write_bytes(b'{"step": 1, "note": "caf\xe9", "a": 1}\n{"step": 2, "a": 2}\n')
    cases["jsonl_latin1"] = Case(path, None, {("a", 1, 1.0), ("a", 2, 2.0)})
    # a run id that is Rich markup, with a problem to print
    path = root / "exp[" / "]" / "metrics.jsonl"
    _jsonl(path, [{"step": 1, "a": 1.0}, '{"step": NaN}'])
    cases["markup_run_id"] = Case(path, "bad_record", {("a", 1, 1.0)})
    # a console log whose step does not fit 64 bits
    path = root / "text_log_huge_step/train.log"
    path.parent.mkdir()
    path.write_text(
        "step:1/10 train_loss:2.5000 train_time:10ms step_avg:10.00ms\n"
        "step:99999999999999999999999/10 train_loss:2.4000 train_time:20ms step_avg:10.00ms\n"
        "step:3/10 train_loss:2.3000 train_time:30ms step_avg:10.00ms\n"
    )
    cases["text_log_huge_step"] = Case(path, "bad_record")
    # an unreadable labels.toml beside the runs
    (root / "labels.toml").write_bytes(b"\xff\xfe" + rng.randbytes(64))
    cases["labels_binary"] = Case(root / "labels.toml", "bad_toml")
    return cases, good


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("fault") / "runs"
    root.mkdir()
    cases, good = build_corpus(root)
    store = Store(root.parent / "store")
    env = {**os.environ, "WORKBENCH_STORE": str(store.root)}
    p = subprocess.run(
        [sys.executable, "-m", "workbench", "ingest", str(root)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,  # a FIFO read would block forever
    )
    return root, cases, good, store, p


def test_one_ingest_of_the_whole_corpus_exits_0_without_a_traceback(corpus):
    *_, p = corpus
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""


def test_every_good_point_of_every_good_file_is_stored(corpus):
    _, _, good, store, _ = corpus
    for run_id, points in good.items():
        got = store.query(f"SELECT tag, step, value FROM scalars_all WHERE run_id = '{run_id}'").rows()
        assert len(got) == len(points) and set(got) == points, run_id


CASES = [
    "jsonl_step_nan",
    "jsonl_step_inf",
    "jsonl_step_1e30",
    "jsonl_step_12abc",
    "jsonl_step_true",
    "jsonl_nested_arrays_2000",
    "jsonl_nested_objects_990",
    "jsonl_line_17MiB",
    "jsonl_gz_truncated",
    "jsonl_gz_not_gzip",
    "json_array_nan_step",
    "trainer_state_binary",
    "trainer_state_nan_step",
    "trainer_state_nested_5000",
    "ds_config_binary",
    "tb_step_min_int64",
    "tb_length_2_40_mid",
    "tb_length_2_63_mid",
    "tb_length_2_40_last_settled",
    "tb_fifo",
    "tb_symlink_dev_zero",
    "jsonl_bom",
    "jsonl_latin1",
    "markup_run_id",
    "text_log_huge_step",
    "labels_binary",
]


def test_the_case_list_is_the_corpus(corpus):
    assert sorted(CASES) == sorted(corpus[1])


@pytest.fixture(scope="module")
def stored(corpus):
    """The corpus store's problem rows, and its points by source file (asked once for every case)."""
    store = corpus[3]
    points: dict[str, list] = {}
    for path, *point in store.query("SELECT source_file, tag, step, value FROM scalars_all").rows():
        points.setdefault(path, []).append(tuple(point))
    return store.query("SELECT path, kind, message FROM problems").rows(), points


@pytest.mark.parametrize("name", CASES)
def test_each_bad_file_is_a_problem_row_and_keeps_its_good_points(corpus, stored, name):
    root, cases, *_ = corpus
    case = cases[name]
    problems, points = stored
    mine = [(k, m) for path, k, m in problems if path == str(case.path)]
    if case.kind is None:
        assert mine == []
    else:
        assert case.kind in [k for k, _ in mine], (name, mine)
    if case.path.name == "labels.toml":
        return
    run_id = case.path.parent.relative_to(root).as_posix()
    got = points.get(str(case.path), [])
    assert len(got) == len(set(got))
    if case.prefix_of is not None:
        assert (
            0 < len(got) < len(case.prefix_of)
            and sorted(got, key=lambda r: r[1]) == case.prefix_of[: len(got)]
        )
    elif case.points:
        assert set(got) == case.points, (name, run_id)


def test_the_printed_report_escapes_markup_in_paths(corpus):
    *_, p = corpus
    assert "exp[/]" in p.stderr.replace("\n", "")


def test_a_file_that_vanishes_after_discovery_is_a_problem_and_the_rest_is_stored(tmp_path, monkeypatch):
    """The race of a file deleted mid-ingest, made deterministic: discovery really finds it,
    then it is gone before it is read."""
    tbx_scalars(tmp_path / "runs/keep", {"loss": [(s, s / 2) for s in range(50)]})
    gone = tbx_scalars(tmp_path / "runs/gone", {"loss": [(s, 1.0) for s in range(50)]})
    real = ingest.pipeline.discover

    def discover_then_delete(root, ingestors, *known):
        found = real(root, ingestors, *known)
        gone.unlink()
        return found

    monkeypatch.setattr(ingest.pipeline, "discover", discover_then_delete)
    store = Store(tmp_path / "store")
    report = ingest_paths(store, tmp_path / "runs")
    assert [(p, x.kind) for p, x in report.problems] == [(str(gone), "not_read")]
    assert store.query("SELECT count(*) n FROM scalars WHERE run_id = 'keep'")["n"][0] == 50
    assert store.query("SELECT path FROM problems")["path"].to_list() == [str(gone)]


def test_a_gz_bomb_stops_at_its_cap_with_the_lines_before_kept(tmp_path, monkeypatch):
    # records of 1 MB compress ~1000x: the cap is the ratio (the 1 GiB floor lowered for the test)
    monkeypatch.setattr(ingest.lines, "GZ_MIN_CAP", 0)
    line = json.dumps({"step": 0, "a": 1.0, "pad": "a" * (1 << 20)})
    body = "".join(line.replace('"step": 0', f'"step": {s}') + "\n" for s in range(100))  # cap: ~20 lines
    (tmp_path / "run").mkdir()
    (tmp_path / "run/metrics.jsonl.gz").write_bytes(gzip.compress(body.encode(), mtime=0))
    store = Store(tmp_path / "store")
    report = ingest_paths(store, tmp_path / "run")
    assert [x.kind for _, x in report.problems] == ["gz_too_large"]
    steps = store.query("SELECT step FROM scalars ORDER BY step")["step"].to_list()
    assert 0 < len(steps) < 100 and steps == list(range(len(steps)))


@pytest.mark.slow
def test_a_7MB_gz_bomb_and_a_200MB_line_keep_memory_bounded(tmp_path):
    """The issue's two blow-ups (6.3 GB and 1.2 GB of RSS), ingested in a child process whose
    peak RSS the kernel reports, after a warm-up ingest (imports, compiled kernels) set its floor."""
    run = tmp_path / "run"
    run.mkdir()
    # ~7 MB that expands to 7 GB: a JSON line, then zeros (gzip members concatenate)
    first = gzip.compress(b'{"step": 1, "a": 1}\n', mtime=0)
    zeros = gzip.compress(b"\0" * (64 << 20), compresslevel=9, mtime=0)
    (run / "bomb.jsonl.gz").write_bytes(first + zeros * 110)
    with open(run / "long.jsonl", "wb") as f:
        f.write(b'{"step": 1, "a": 1}\n{"step": 2, "pad": "')
        for _ in range(200):
            f.write(b"x" * (1 << 20))
        f.write(b'"}\n{"step": 3, "a": 3}\n')
    warm = tmp_path / "warm"
    tbx_scalars(warm, {"loss": [(0, 1.0)]})
    (warm / "m.jsonl").write_text('{"step": 1, "a": 1}\n')
    code = (
        "import resource; from pathlib import Path; from ingest.pipeline import ingest; "
        "from workbench.store import Store; peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss; "
        f"ingest([Path({str(warm)!r})], Store({str(tmp_path / 'w')!r})); before = peak(); "
        f"r = ingest([Path({str(run)!r})], Store({str(tmp_path / 's')!r})); "
        "print(peak() - before, sorted(p.kind for _, p in r.problems))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    grew_kb, kinds = out.split(" ", 1)
    assert "gz_too_large" in kinds and "line_too_long" in kinds
    assert int(grew_kb) < 300_000, f"peak RSS grew by {int(grew_kb) / 1e6:.2f} GB"


def test_a_file_not_read_is_one_problem_row_until_it_goes(tmp_path):
    tbx_scalars(tmp_path / "runs/a", {"loss": [(0, 1.0)]})
    fifo = tmp_path / "runs/a/events.out.tfevents.9.host"
    os.mkfifo(fifo)
    store = Store(tmp_path / "store")
    for _ in range(2):
        ingest_paths(store, tmp_path / "runs")
        assert store.query("SELECT path, kind FROM problems").rows() == [(str(fifo), "not_read")]
    fifo.unlink()
    ingest_paths(store, tmp_path / "runs")
    assert store.query("SELECT count(*) n FROM problems")["n"][0] == 0
