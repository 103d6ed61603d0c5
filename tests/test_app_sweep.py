"""The Curves page on a sweep (60 JSONL runs) under Streamlit's AppTest: one trace per colour
rather than one per run, alerts off at first with their count, colours that follow the run, and
a group mean of runs that logged at different steps equal to the true mean."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import ingest_paths
from streamlit.testing.v1 import AppTest
from test_app import APP, app_pages, figures, values

from workbench.app import charts
from workbench.store import Store

SWEEP = [f"lr{i:02d}" for i in range(60)]


@pytest.fixture(scope="module")
def sweep_store(tmp_path_factory) -> Store:
    root = tmp_path_factory.mktemp("sweep")
    for i, run in enumerate(SWEEP):
        (root / "runs" / run).mkdir(parents=True)
        rows = [{"step": s, "loss": 2 + i / 100 - s / 100} for s in range(100)]
        (root / "runs" / run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # two seeds of one config, one logging every step, one every 10th step
    for seed, every in (("grid_seed0", 1), ("grid_seed1", 10)):
        (root / "runs" / seed).mkdir(parents=True)
        rows = [{"step": s, "loss": float(s if every == 1 else 100 - s)} for s in range(0, 101, every)]
        (root / "runs" / seed / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # a model's per-layer gradient norms: layer 5 vanishes
    (root / "runs" / "layers").mkdir(parents=True)
    rows = [
        {"step": s, **{f"grad_norm/layer_{n}": (1e-6 if n == 5 else 1.0 + n) for n in range(8)}}
        for s in range(40)
    ]
    (root / "runs" / "layers" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    store = Store(root / "store")
    ingest_paths(store, root / "runs")
    return store


@pytest.fixture
def page(sweep_store, monkeypatch):
    open_page = app_pages(sweep_store, monkeypatch)
    return lambda **params: open_page("curves", **params)


def test_a_sweep_is_one_trace_per_colour_with_alerts_off_at_first(page):
    at = page(run=SWEEP, tags="^loss$")
    fig = figures(at)["loss"]
    lines = [t for t in fig["data"] if t.get("mode") == "lines"]
    assert len(lines) == len({charts.colour_of(r) for r in SWEEP}) <= 20
    names = {n for t in lines for n in t["text"]}
    assert names == set(SWEEP)  # the hover names each run
    assert at.checkbox(key="curves_alerts").value is False  # 60 runs: markers off at first
    assert "stored" in at.checkbox(key="curves_alerts").label  # with their count
    assert not at.get("html")  # no colour key of 60 names above the charts
    at.checkbox(key="curves_alerts").check().run()  # a user may still turn them on
    assert at.checkbox(key="curves_alerts").value is True and not at.exception


def test_runs_of_a_sweep_highlighted_with_a_legend_and_soloed(page):
    at = page(run=SWEEP, tags="^loss$", hl=["lr07", "lr42"])
    fig = figures(at)["loss"]
    own = {t["name"]: t for t in fig["data"] if t.get("showlegend")}
    assert set(own) == {"lr07", "lr42"}  # on top, each its own trace: click to hide, double-click to solo
    assert own["lr07"]["line"]["color"] == charts.colour_of("lr07")  # its colour, as everywhere
    assert values(own["lr42"]["y"])[0] == pytest.approx(
        2.42
    )  # its own curve (smoothing starts at the first point)
    faint = [t for t in fig["data"] if t.get("mode") == "lines" and "text" in t]  # bundles name each point
    assert faint and all(t["opacity"] == 0.3 for t in faint)  # the others, faint, still there
    assert {n for t in faint for n in t["text"]} == set(SWEEP) - {"lr07", "lr42"}
    at.checkbox(key="curves_only_highlighted").check().run()
    assert at.query_params["solo"] == "1" and at.query_params["hl"] == ["lr07", "lr42"]
    lines = [t for t in figures(at)["loss"]["data"] if t.get("mode") == "lines" and t.get("name")]
    assert [t["name"] for t in lines] == ["lr07", "lr42"]  # only these (and their raw lines)
    assert len(figures(at)["loss"]["data"]) == 4


def test_a_run_keeps_its_colour_when_another_is_removed(page):
    picked = SWEEP[:6]
    at = page(run=picked, tags="^loss$")
    before = {t["name"]: t["line"]["color"] for t in figures(at)["loss"]["data"] if t.get("showlegend")}
    assert set(before) == set(picked)  # a legend: click to hide, double-click to solo
    at.multiselect(key="curves_runs").unselect(picked[0]).run()
    after = {t["name"]: t["line"]["color"] for t in figures(at)["loss"]["data"] if t.get("showlegend")}
    assert after == {r: c for r, c in before.items() if r != picked[0]}


def test_group_mean_of_runs_on_different_step_grids(page):
    at = page(run=["grid_seed0", "grid_seed1"], tags="^loss$", smooth="0", group="name", by="(grid)_seed")
    fig = figures(at)["loss"]
    mean = next(t for t in fig["data"] if t.get("mode") == "lines")
    x, y = values(mean["x"]), values(mean["y"])
    assert mean["name"] == "grid (2 runs)"
    for step in range(0, 101, 10):  # logged by both runs: the mean of the two values, 50
        assert y[x == step] == pytest.approx([50.0])
    assert np.allclose(y, 50.0)  # and no zig-zag between them


def test_a_layer_family_is_drawn_as_a_heatmap(page):
    at = page(run=["layers"], tags="layer_0$")
    heat = next(f for t, f in figures(at).items() if t.startswith("grad_norm/layer_*"))
    trace = heat["data"][0]
    assert trace["type"] == "heatmap" and values(trace["y"]).tolist() == list(range(8))
    z = trace["z"]  # plotly sends a 2-D array as one base64 block with its shape
    z = (
        values(z).reshape([int(n) for n in str(z["shape"]).split(",")])
        if isinstance(z, dict)
        else np.array(z, float)
    )
    assert z.shape[0] == 8 and np.allclose(np.nanmax(z, axis=1)[:5], np.log10(1.0 + np.arange(5)))
    assert np.nanmax(z[5]) == pytest.approx(-6)  # the vanishing layer, on a log scale


def test_the_guides_thresholds_are_marked_on_a_layer_heatmap(page):
    import html

    from workbench.app import data

    at = page(run=["layers"], tags="layer_0$")
    heat = next(f for t, f in figures(at).items() if t.startswith("grad_norm/layer_*"))
    marks = {html.unescape(t["name"]).split(" (")[0]: t for t in heat["data"] if t["type"] == "scatter"}
    # the guides' gradient thresholds, as their rule file holds them: two levels and a layer ratio
    layers = tuple((n, f"grad_norm/layer_{n}") for n in range(8))
    want = data.layer_thresholds("grad_norm/layer_*", layers, (None,) * 8)
    assert [t["text"] for t in want] == list(marks)  # in the legend (plotly shows the entities as `<`)
    levels = [t["text"] for t in want if "ratio" not in t]
    assert levels and all(
        w.startswith(("guides_P1: grad_norm < ", "guides_P4: grad_norm < ")) for w in levels
    )
    for text in levels:  # every marked cell is the vanishing layer 5, in each of the 40 steps' bins
        assert set(values(marks[text]["y"])) == {5.0} and len(values(marks[text]["x"])) == 40
    ratio = next(t for t in want if "ratio" in t)
    no_cells = values(marks[ratio["text"]]["x"])  # layer 0 / layer 1 = 1/2: no explosion, yet in the legend
    assert ratio["ratio"] == (0, 1) and not np.isfinite(no_cells).any() and "(0 cells)" in marks_named(heat)


def marks_named(fig: dict) -> str:
    return " ".join(t["name"] for t in fig["data"] if t["type"] == "scatter")


def test_the_run_comparer_takes_a_sweep_as_one_trace_per_colour(page):
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["run"] = SWEEP
    at.run()
    at.switch_page("workbench/app/pages/compare.py").run()
    assert not at.exception, [e.message for e in at.exception]
    fig = figures(at)["loss"]
    lines = [t for t in fig["data"] if t.get("mode") == "lines"]
    assert len(lines) == len({charts.colour_of(r) for r in SWEEP})
    assert {n for t in lines for n in t["text"]} == set(SWEEP)  # every run drawn, named in the hover
    assert "None of these runs logged a config" in at.info[0].value  # page() set the store
