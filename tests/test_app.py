"""Every page under Streamlit's AppTest, on a store built from sample_runs/ (and empty states)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import ingest_paths
from streamlit.testing.v1 import AppTest

from workbench.store import Store

ROOT = Path(__file__).parent.parent
APP = str(ROOT / "app.py")


@pytest.fixture(scope="module")
def sample_store(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("app") / "store")
    ingest_paths(store, ROOT / "sample_runs")
    return store


@pytest.fixture
def app(sample_store, monkeypatch):
    monkeypatch.setenv("WORKBENCH_STORE", str(sample_store.root))

    def open_page(page: str | None = None) -> AppTest:
        at = AppTest.from_file(APP, default_timeout=60).run()
        if page:
            at.switch_page(f"workbench/app/pages/{page}.py").run()
        assert not at.exception, [e.message for e in at.exception]
        return at

    return open_page


def figure(at, i=0) -> dict:
    return json.loads(at.get("plotly_chart")[i].proto.spec)


def values(arr) -> np.ndarray:
    """Plotly >= 6 sends arrays as base64 blocks."""
    if isinstance(arr, dict):
        return np.frombuffer(base64.b64decode(arr["bdata"]), dtype=np.dtype(arr["dtype"]))
    return np.asarray(arr, dtype=float)


def test_runs_page_lists_and_filters(app):
    at = app()
    df = at.dataframe[0].value
    assert len(df) == 20 and {"status", "label", "alerts", "last_loss"} <= set(df.columns)
    at.text_input(key="runs_pattern").input("^healthy").run()
    assert sorted(at.dataframe[0].value["run_id"]) == [
        "healthy_deepspeed_fp16",
        "healthy_hf_trainer",
        "healthy_seed0",
        "healthy_seed1_wide",
    ]
    at.text_input(key="runs_pattern").input("([").run()
    assert not at.exception and at.warning
    at.text_input(key="runs_pattern").input("").run()
    at.multiselect(key="runs_label").set_value(["failed"]).run()
    assert len(at.dataframe[0].value) == 10


def test_curves_page_smoothing_log_tags(app):
    at = app("curves")
    at.multiselect(key="curves_runs").set_value(["diverge_nan", "healthy_seed0"]).run()
    fig = figure(at)
    names = [t.get("name") for t in fig["data"]]
    assert "diverge_nan" in names and "healthy_seed0" in names and "diverge_nan NaN/Inf" in names
    smoothed = [t for t in fig["data"] if t.get("name") == "healthy_seed0" and t["line"]["width"] == 2][0]
    at.slider(key="curves_smoothing").set_value(0.0).run()
    raw = [t for t in figure(at)["data"] if t.get("name") == "healthy_seed0" and t["line"]["width"] == 2][0]
    assert not np.allclose(values(smoothed["y"]), values(raw["y"]))
    at.checkbox(key="curves_log").check().run()
    assert figure(at)["layout"]["yaxis"]["type"] == "log"
    at.multiselect(key="curves_tags").set_value(["train/loss", "train/grad_norm"]).run()
    assert [a["text"] for a in figure(at)["layout"]["annotations"]] == ["train/loss", "train/grad_norm"]
    at.button(key="curves_export").click().run()
    assert len(at.get("download_button")) == 2


def test_curves_show_stored_alerts_and_events(app, sample_store):
    from detectors.replay import replay

    replay(sample_store, None, None)
    at = app("curves")
    at.multiselect(key="curves_runs").set_value(["fp16_overflow_storm", "attention_collapse"]).run()
    names = [t.get("name") for t in figure(at)["data"]]
    assert any(n.startswith("alert P1_attention_collapse") for n in names if n)
    assert "overflow" in names and "min_loss_scale" in names


def test_backtest_page_runs_scores_and_drilldown(app):
    at = app("backtest")
    assert any("Run backtest" in i.value for i in at.info)
    at.button(key="bt_run").click().run()
    assert not at.exception
    scores = at.dataframe[0].value
    assert "guides_P1" in set(scores["rule"]) and "recall" in scores.columns
    assert len(at.get("plotly_chart")) == 1  # the sweep chart
    at.button(key="bt_replay").click().run()
    assert "alerts from" in at.caption[0].value
    at.selectbox(key="bt_rule").set_value("P1_attention_collapse").run()
    verdicts = dict(zip(at.dataframe[-1].value["run_id"], at.dataframe[-1].value["verdict"], strict=True))
    assert (
        verdicts["attention_collapse"] == "fired"
        and verdicts["diverge_nan"] == "missed"
        and verdicts["healthy_seed0"] == "quiet"
    )


def test_lineage_page_graph_and_stitched_curve(app):
    at = app("lineage")
    edges = at.dataframe[0].value
    assert set(edges["kind"]) == {"recovery", "resume"}
    stitched = figure(at, 1)
    assert sorted(t["name"] for t in stitched["data"]) == [
        "attention_collapse · loss",
        "attention_collapse_recovery · loss",
    ]


@pytest.mark.parametrize("page", [None, "curves", "backtest", "lineage"])
def test_every_page_without_a_store_says_how_to_make_one(tmp_path, monkeypatch, page):
    monkeypatch.setenv("WORKBENCH_STORE", str(tmp_path / "none"))
    at = AppTest.from_file(APP, default_timeout=60).run()
    if page:
        at.switch_page(f"workbench/app/pages/{page}.py").run()
    assert not at.exception and "workbench ingest" in at.info[0].value


def test_store_without_labels_alerts_or_lineage_shows_empty_states(tmp_path, monkeypatch):
    from writers import tbx_scalars

    tbx_scalars(tmp_path / "runs/a", {"loss": [(s, 1.0 / (s + 1)) for s in range(20)]})
    store = Store(tmp_path / "s")
    ingest_paths(store, tmp_path / "runs")
    monkeypatch.setenv("WORKBENCH_STORE", str(store.root))
    for page, text in (("backtest", "No labelled runs"), ("lineage", "No lineage")):
        at = AppTest.from_file(APP, default_timeout=60).run()
        at.switch_page(f"workbench/app/pages/{page}.py").run()
        assert not at.exception and text in at.info[0].value
