"""TensorBoard histogram summaries: stored at ingest as TensorBoard's own reader reads them, and
drawn as its Distributions and Histograms dashboards draw them (the Histograms page)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import ingest_paths
from hypothesis import given, settings
from hypothesis import strategies as st
from test_app import app_pages, values

from workbench.app import histograms
from workbench.store import Store

DATA = Path(__file__).parent / "data" / "histograms"  # written by real writers: make_histograms.py


def tensorboard_histograms(run_dir: Path) -> dict[tuple[str, int], np.ndarray]:
    """What TensorBoard's own reader gives its histogram dashboards: per (tag, step), the
    [left, right, count] rows (legacy protos migrated by its data_compat)."""
    from tensorboard.backend.event_processing import plugin_event_accumulator as pea
    from tensorboard.util import tensor_util

    acc = pea.EventAccumulator(str(run_dir), size_guidance={pea.TENSORS: 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags()["tensors"]:
        if acc.SummaryMetadata(tag).plugin_data.plugin_name != "histograms":
            continue
        for ev in acc.Tensors(tag):
            out[(tag, ev.step)] = tensor_util.make_ndarray(ev.tensor_proto).astype(np.float64)
    return out


def tensorboardx_run(folder: Path) -> Path:
    """A third writer: tensorboardX's add_histogram, run here."""
    from tensorboardX import SummaryWriter

    rng = np.random.default_rng(2)
    w = SummaryWriter(str(folder))
    for step in range(5):
        w.add_histogram("fc/weight", rng.uniform(-1, 1, 400) * (step + 1), step, walltime=1.7e9 + step)
    w.close()
    return folder


@pytest.fixture(scope="module")
def hist_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("histograms")
    shutil.copytree(DATA, root / "runs", ignore=shutil.ignore_patterns("*.py"))
    tensorboardx_run(root / "runs" / "tbx_run")
    store = Store(root / "store")
    ingest_paths(store, root / "runs")
    return store, root / "runs"


@pytest.mark.parametrize("run", ["torch_run", "tb_v2_run", "tbx_run"])
def test_every_histogram_stored_as_tensorboard_reads_it(hist_store, run):
    store, runs = hist_store
    expected = tensorboard_histograms(runs / run)
    assert len(expected) >= 5
    got = store.histograms(run)
    assert got.height == len(expected)  # none lost, none doubled
    for row in got.iter_rows(named=True):
        rows = expected[(row["tag"], row["step"])]
        np.testing.assert_allclose(row["left"], rows[:, 0], rtol=1e-6)
        np.testing.assert_allclose(row["right"], rows[:, 1], rtol=1e-6)
        assert row["count"] == rows[:, 2].tolist()
        assert row["num"] == rows[:, 2].sum()
        assert row["source_file"].startswith(str(runs / run))


def test_histograms_beside_scalars_and_apart_from_events(hist_store):
    store, _ = hist_store
    loss = store.scalars("torch_run", metric="loss")
    assert loss["step"].to_list() == list(range(0, 100, 10))  # the scalars of the same file, all there
    assert store.events().filter(store.events()["kind"] == "histogram").is_empty()
    tags = store.query("SELECT run_id, tag, count(*) AS n FROM histograms GROUP BY ALL ORDER BY ALL")
    assert tags.rows() == [
        ("tb_v2_run", "activations/layer_0", 8),
        ("tb_v2_run", "constant", 8),
        ("tbx_run", "fc/weight", 5),
        ("torch_run", "grads/layer_1", 10),
        ("torch_run", "weights/layer_0", 10),
    ]
    contents = dict(store.query("SELECT run_id, contents FROM files WHERE format IS NOT NULL").rows())
    assert json.loads(contents["tb_v2_run"]) == {"histograms": 16}  # TF2 tensors count as histograms


def test_a_second_ingest_adds_no_histogram(hist_store):
    store, runs = hist_store
    before = store.histograms().height
    ingest_paths(store, runs)
    assert store.histograms().height == before


def test_percentiles_of_real_histograms_match_the_values(hist_store):
    # torch's writer kept 2000 normal values per step in exponential buckets: the distribution's
    # median and quartiles fall within a bucket of the sample's
    store, _ = hist_store
    rng = np.random.default_rng(0)  # the generator make_histograms.py drew from, in its order
    stored = store.histograms("torch_run", "weights/layer_0")
    for step in range(0, 100, 10):
        values = rng.normal(0.0, 1.0 + step / 50, 2000)
        rng.standard_t(3, 500)
        h = stored.filter(step=step).row(0, named=True)
        got = histograms.percentiles(h["left"], h["right"], h["count"], [0, 2500, 5000, 7500, 10000])
        want = np.quantile(values, [0, 0.25, 0.5, 0.75, 1])
        widths = np.diff(h["right"]).max()
        assert np.all(np.abs(got - want) <= widths)
        assert got[0] == pytest.approx(values.min()) and got[-1] == pytest.approx(values.max())


buckets = st.lists(
    st.tuples(st.floats(-1e3, 1e3), st.floats(0, 10), st.integers(0, 50)), min_size=1, max_size=30
)


@settings(max_examples=200, deadline=None)
@given(buckets)
def test_percentiles_rise_from_the_lowest_to_the_highest_value(spec):
    left = np.cumsum([0.0] + [w for _, w, _ in spec[:-1]]) + spec[0][0]
    right = left + np.array([w for _, w, _ in spec])
    count = np.array([c for *_, c in spec], dtype=float)
    p = histograms.percentiles(left, right, count)
    if count.sum() == 0:
        assert np.isnan(p).all()
        return
    assert np.all(np.diff(p) >= -1e-9 * max(1.0, np.abs(p).max()))
    assert p[0] == left[count > 0][0] and p[-1] == pytest.approx(right[count > 0][-1])


@settings(max_examples=200, deadline=None)
@given(buckets, st.integers(1, 40))
def test_rebinning_keeps_every_count(spec, bins):
    left = np.cumsum([0.0] + [w for _, w, _ in spec[:-1]]) + spec[0][0]
    right = left + np.array([w for _, w, _ in spec])
    count = np.array([c for *_, c in spec], dtype=float)
    edges = np.linspace(left.min(), max(right.max(), left.min() + 1), bins + 1)
    assert histograms.rebin(left, right, count, edges).sum() == pytest.approx(count.sum())
    if bins == len(spec) and np.allclose(edges[:-1], left) and np.allclose(edges[1:], right):
        np.testing.assert_allclose(histograms.rebin(left, right, count, edges), count)


def test_the_histograms_page_draws_each_runs_distribution(hist_store, monkeypatch):
    store, _ = hist_store
    open_page = app_pages(store, monkeypatch)
    at = open_page("histograms", run=["torch_run", "tbx_run"], tag="weights/layer_0", steps="4")
    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert [c["layout"]["title"]["text"] for c in charts] == [
        "weights/layer_0: distribution",
        "weights/layer_0: histograms",
    ]  # tbx_run has no such tag: said, not drawn
    assert any("tbx" in c.value and "no weights/layer" in c.value.replace("\\", "") for c in at.caption)
    dist, hist = charts
    median = next(t for t in dist["data"] if t.get("name") == "median")
    rows = store.histograms("torch_run", "weights/layer_0")
    want = [histograms.percentiles(r["left"], r["right"], r["count"])[4] for r in rows.iter_rows(named=True)]
    assert values(median["x"]).tolist() == rows["step"].to_list()
    assert values(median["y"]) == pytest.approx(want)
    assert len(dist["data"]) == 5  # four nested bands and the median
    drawn = [t["name"] for t in hist["data"]]
    assert drawn == ["step 0", "step 30", "step 60", "step 90"]  # 4 of 10 steps, evenly spread
    assert all(t["fill"] == "toself" for t in hist["data"])  # offset: each step its own outline
    at.radio(key="hist_mode").set_value("overlay").run()
    assert at.query_params["mode"] == "overlay"
    hist = json.loads(at.get("plotly_chart")[1].proto.spec)
    assert all(t.get("fill") is None for t in hist["data"])
    total = sum(values(t["y"]).sum() for t in hist["data"])
    assert total == pytest.approx(4 * 2000)  # every value of the 4 drawn steps, on the common bins


def test_the_histograms_page_says_when_there_are_none(tmp_path, monkeypatch):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 0, "loss": 1.0}\n{"step": 1, "loss": 0.9}\n')
    store = Store(tmp_path / "store")
    ingest_paths(store, tmp_path / "run")
    at = app_pages(store, monkeypatch)("histograms")
    assert "No histogram summaries in this store" in at.info[0].value
