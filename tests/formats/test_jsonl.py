"""JSON Lines metric logs: malformed lines, numbers as strings, bare NaN/Infinity."""

from __future__ import annotations

from conftest import ingest_paths


def test_malformed_jsonl_lines_are_reported_with_line_numbers(store, tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        '{"step": 0, "loss": 1.0}\n{"step": 1, "loss": NaN}\nnot json at all\n[1, 2]\n{"step": 3, "loss": "0.50", "lr": Infinity}\n'
    )
    r = ingest_paths(store, run)
    assert [(p.offset, p.kind) for _, p in r.problems] == [(3, "bad_json"), (4, "bad_json")]
    df = store.query("SELECT tag, step, value FROM scalars ORDER BY tag, step")
    rows = df.rows()
    assert rows[0] == ("loss", 0, 1.0) and rows[1][:2] == ("loss", 1) and rows[1][2] != rows[1][2]
    assert rows[2] == ("loss", 3, 0.5) and rows[3] == ("lr", 3, float("inf"))
