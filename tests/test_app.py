"""The app's pages under Streamlit's AppTest, on a real store."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import DATA, ingest_paths
from streamlit.testing.v1 import AppTest

from workbench.store import Store

APP = str(Path(__file__).parent.parent / "app.py")


@pytest.fixture
def app_store(tmp_path, monkeypatch):
    store = Store(tmp_path / "store")
    ingest_paths(store, DATA / "generated")
    monkeypatch.setenv("WORKBENCH_STORE", str(store.root))
    return store


def test_runs_page_lists_runs_and_filters(app_store):
    at = AppTest.from_file(APP, default_timeout=30).run()
    assert not at.exception
    df = at.dataframe[0].value
    assert sorted(df["run_id"]) == ["broken", "tb_native_run", "tbx_run/run_a"]
    at.text_input(key="runs_pattern").input("^tb").run()
    assert sorted(at.dataframe[0].value["run_id"]) == ["tb_native_run", "tbx_run/run_a"]
    at.text_input(key="runs_pattern").input("([").run()
    assert not at.exception and at.warning


def test_runs_page_without_a_store_says_how_to_make_one(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_STORE", str(tmp_path / "none"))
    at = AppTest.from_file(APP, default_timeout=30).run()
    assert not at.exception
    assert "workbench ingest" in at.info[0].value
