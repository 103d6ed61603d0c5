"""The README documents the whole surface: every CLI command and every public store view.

(Each command's `--help` ending with an example is checked in test_cli.py.)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import DATA, ingest_paths

from workbench.cli import main

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("cmd", sorted(main.commands))
def test_every_command_is_in_the_readme(cmd):
    assert re.search(rf"\bworkbench {re.escape(cmd)}\b", README), f"README never shows `workbench {cmd}`"


def test_every_view_is_in_the_readme(store):
    ingest_paths(store, DATA / "generated" / "tbx_run")
    con = store.connect()  # every view
    views = con.sql("SELECT view_name FROM duckdb_views() WHERE NOT internal ORDER BY view_name").fetchall()
    public = [v for (v,) in views if not v.startswith("_")]
    assert {"runs", "scalars", "scalars_all", "events", "alerts", "labels"} <= set(public)
    assert [v for v in public if f"`{v}`" not in README] == []
