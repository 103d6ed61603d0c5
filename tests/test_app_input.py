"""What the app did not write (the URL, run names, tags, uploads) under Streamlit's AppTest:
regular expressions that would backtrack for minutes finish at once, markdown and HTML from
them are shown as text, numbers a widget cannot take are clamped with a message."""

from __future__ import annotations

import json
import time

import pytest
from conftest import ingest_paths
from test_app import app_pages, figures, plain

from workbench.app import untrusted
from workbench.store import Store

EVIL_TAG = '<a href="http://host/">CLICKME</a>'
EVIL_RUN = "![t](http:host.x.png)"
IMAGE = "![t](http://host/x.png)"
BACKTRACKS = r"(\w+)+!"  # exponential in Python's re on a long word without '!'


@pytest.fixture(scope="module")
def hostile_store(tmp_path_factory) -> Store:
    """A JSONL run whose key is a link, one whose folder name is a markdown image."""
    root = tmp_path_factory.mktemp("hostile")
    for run in ("sweep_a", EVIL_RUN):
        (root / "runs" / run).mkdir(parents=True)
        rows = [{"step": s, "loss": 1 / (s + 1), EVIL_TAG: s * 1.0, "plain": 2.0} for s in range(50)]
        (root / "runs" / run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    store = Store(root / "store")
    ingest_paths(store, *(root / "runs").iterdir())
    return store


@pytest.fixture
def page(hostile_store, monkeypatch):
    return app_pages(hostile_store, monkeypatch)


def test_patterns_run_in_linear_time():
    long = "a" * 100_000  # Python's re would take longer than the age of the universe
    t0 = time.perf_counter()
    assert untrusted.matches(BACKTRACKS, [long, "x!"]) == [False, True]
    assert untrusted.names(BACKTRACKS, [long]) == [None]
    assert untrusted.names(r"(.*)_seed\d", ["a_seed1", "b"]) == ["a", None]
    assert untrusted.names(r"seed\d", ["a_seed1"]) == ["seed1"]  # no group: the whole match
    assert not untrusted.glob_match("`*" * 50 + "b", long)
    assert time.perf_counter() - t0 < 2
    with pytest.raises(untrusted.BadPattern, match="look-around"):
        untrusted.matches("(?=a)", ["a"])


def test_a_backtracking_pattern_in_every_field_finishes(page):
    t0 = time.perf_counter()
    at = page("curves", run=["sweep_a"], tags=BACKTRACKS, group="name", by=BACKTRACKS)
    assert "No tag matches" in at.info[0].value
    at = page(q=BACKTRACKS)
    assert len(at.dataframe[0].value) == 0
    at = page("curves", run=["sweep_a"], tags="(?<=x)loss")  # refused with why, not a traceback
    assert "look-around" in plain(at.warning[0].value)
    assert time.perf_counter() - t0 < 60


def test_markdown_and_html_from_the_url_and_the_logs_are_text(page):
    at = page("curves", run=["sweep_a", EVIL_RUN], tags=".*")
    figs = figures(at)
    titles = [f["layout"]["title"]["text"] for f in figs.values()]
    assert any("&lt;a href" in t for t in titles) and not any("<a" in t for t in titles)
    names = [t.get("name") or "" for f in figs.values() for t in f["data"]]
    assert "<a" not in " ".join(names) and any("![t]" in n for n in names)  # a name, never an image
    markdown = [e.value for kind in ("markdown", "caption", "warning", "info") for e in getattr(at, kind)]
    assert not any("](" in m for m in markdown), markdown  # no link or image survives into markdown
    at = page(q=IMAGE + "(")  # an unfinished regex echoed back in the warning
    assert IMAGE in plain(at.warning[0].value) and IMAGE not in at.warning[0].value
    at = page("curves", run=["sweep_a"], tags=IMAGE + "(")
    assert IMAGE in plain(at.warning[0].value) and IMAGE not in at.warning[0].value


@pytest.mark.parametrize(
    ("params", "slider", "said"),
    [
        ({"smooth": "1e999"}, 0.999, "above 0.999"),
        ({"smooth": "nan"}, 0.6, "not a number"),
        ({"smooth": "-3"}, 0.0, "below 0.0"),
        ({"cols": "99"}, 0.6, "not one of 1, 2, 3"),
    ],
)
def test_url_numbers_a_widget_cannot_take_are_clamped_with_a_message(page, params, slider, said):
    at = page("curves", run=["sweep_a"], **params)
    assert at.slider(key="curves_smoothing").value == slider
    assert said in plain(at.warning[0].value)
    assert figures(at)  # the chart is drawn


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (b'{"rules": [', "not a JSON file"),
        (b"[1,2,3]", "not backtest results"),
        (b'{"rules": [1, 2]}', "something other than rows"),
        (b'{"rules": [{"rule": "r", "recall": "high"}]}', "holds numbers"),
        (b"\xff\xfe", "not a JSON file"),
        (json.dumps({"error": IMAGE}).encode(), "the file holds an error"),
    ],
)
def test_a_malformed_upload_is_a_message(raw, said):
    res = untrusted.backtest_results(raw)
    assert said in res["error"]
    assert IMAGE not in untrusted.md(res["error"])  # shown as text


def test_saved_results_keep_their_rows():
    rows = {"rules": [{"rule": "r", "params": "{}", "recall": 0.5, "false_alarms_per_1k": 1.0}]}
    assert untrusted.backtest_results(json.dumps(rows).encode())["rules"] == rows["rules"]


def test_markdown_and_plotly_escaping():
    assert plain(untrusted.md(IMAGE)) == IMAGE and "![" not in untrusted.md(IMAGE)
    assert untrusted.plotly(EVIL_TAG) == '&lt;a href="http://host/"&gt;CLICKME&lt;/a&gt;'
    assert untrusted.plotly("%{y}") == "&#37;{y}"
