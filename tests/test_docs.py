"""The README documents the whole surface: every CLI command and every public store view; the
Python API page (docs/python-api.md) every name of `workbench` and every read method of the
store, with examples that run.

(Each command's `--help` ending with an example is checked in test_cli.py.)
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import DATA, ingest_paths

from workbench.cli import main

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
PYTHON_API = (ROOT / "docs" / "python-api.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("cmd", sorted(main.commands))
def test_every_command_is_in_the_readme(cmd):
    assert re.search(rf"\bworkbench {re.escape(cmd)}\b", README), f"README never shows `workbench {cmd}`"


def test_the_commands_workbench_help_lists_are_all_in_the_readme():
    """What a user sees listed, not only what the group holds: the two must be the same set."""
    out = CliRunner().invoke(main, ["--help"], prog_name="workbench").output
    listed = re.findall(r"^  (\w[\w-]*)  ", out.split("\nCommands:\n")[1], re.M)
    assert listed == sorted(main.commands)
    assert [c for c in listed if not re.search(rf"\bworkbench {re.escape(c)}\b", README)] == []


def test_every_view_is_in_the_readme(store):
    ingest_paths(store, DATA / "generated" / "tbx_run")
    con = store.connect()  # every view
    views = con.sql("SELECT view_name FROM duckdb_views() WHERE NOT internal ORDER BY view_name").fetchall()
    public = [v for (v,) in views if not v.startswith("_")]
    assert {"runs", "scalars", "scalars_all", "events", "alerts", "labels"} <= set(public)
    assert [v for v in public if f"`{v}`" not in README] == []


def test_the_readme_links_the_python_api_page():
    assert "(docs/python-api.md)" in README


def examples(page: str) -> list[tuple[str, str | None]]:
    """(code, the output the page shows right after it, or None) of each ```python block."""
    blocks = re.findall(r"^```(\w+)\n(.*?)^```$", page, re.S | re.M)
    return [
        (code, blocks[i + 1][1] if i + 1 < len(blocks) and blocks[i + 1][0] == "text" else None)
        for i, (lang, code) in enumerate(blocks)
        if lang == "python"
    ]


def test_the_python_api_page_documents_every_name_and_read_method():
    import workbench
    from workbench.store import Store

    headings = "\n".join(re.findall(r"^###? .*$", PYTHON_API, re.M))
    assert [n for n in workbench.__all__ if not n.endswith("Error") and f"`wb.{n}(" not in headings] == []
    reads = [
        "runs",
        "tags",
        "scalars",
        "events",
        "alerts",
        "labels",
        "lineage",
        "problems",
        "query",
        "connect",
    ]
    assert all(callable(getattr(Store, m)) for m in reads)
    assert [m for m in reads if f"`store.{m}(" not in headings] == []


def test_every_python_api_example_runs_and_prints_what_the_page_shows(
    sample_runs_store, tmp_path, monkeypatch, capsys
):
    """In order, in one namespace, in a folder whose .workbench is the sample runs' store."""
    shutil.copytree(sample_runs_store.root, tmp_path / ".workbench")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WORKBENCH_STORE", raising=False)
    blocks = examples(PYTHON_API)
    assert len(blocks) >= 16 and all(shown is not None for _, shown in blocks)  # each shows its output
    namespace: dict = {}
    for code, shown in blocks:
        exec(compile(code, "docs/python-api.md", "exec"), namespace)
        printed = capsys.readouterr().out
        if shown is not None:
            assert printed == shown, f"the page shows another output for:\n{code}"


# a measured figure: a speed, a speed-up, or a backtest score (each depends on the corpus and the
# machine it was measured on; the README's benchmark sections say which)
FIGURE = re.compile(
    r"\d[\d.,]*\s*(?:[kMG]\s*)?(?:points|records|rows|lines|B)/s\b"
    r"|\d[\d.]*\s*[x×]\s+(?:faster|slower|the|below|above)"
    r"|\b(?:recall|precision|FA/1k|false alarms?(?: per 1k)?)\s*(?:of\s*)?[=:]?\s*\d"
    r"|\b\d+ (?:of|in) \d+ (?:healthy |failed |labelled )?runs\b",
    re.I,
)


def test_no_docstring_quotes_a_measured_figure():
    """Docstrings say what code does; measured speeds and scores live in the README (and come from
    `benchmarks/`), where the corpus and the machine they were measured on are named."""
    import ast

    found = []
    for pkg in ("workbench", "ingest", "detectors"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                    doc = ast.get_docstring(node) or ""
                    found += [f"{path.relative_to(ROOT)}: {m[0]}" for m in FIGURE.finditer(doc)]
    assert found == []
