"""Pure chart functions: TensorBoard-identical smoothing, spike-preserving downsampling, colours, traces."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.app import charts


def tensorboard_smoothing(values, weight):
    """TensorBoard's vz_line_chart2 `resmoothDataset`, line by line."""
    last = 0.0 if values else math.nan
    num_accum = 0
    is_constant = all(v == values[0] for v in values)
    out = []
    for v in values:
        if is_constant or not math.isfinite(v):
            out.append(v)
        else:
            last = last * weight + (1 - weight) * v
            num_accum += 1
            debias = 1 - weight**num_accum if weight != 1 else 1
            out.append(last / debias)
    return out


@settings(deadline=None, max_examples=200)
@given(
    values=st.lists(
        st.one_of(st.floats(-1e6, 1e6), st.just(math.nan), st.just(math.inf)), min_size=1, max_size=80
    ),
    weight=st.sampled_from([0.0, 0.3, 0.6, 0.9, 0.999]),
)
def test_smoothing_matches_tensorboard(values, weight):
    ours = charts.tb_smooth(np.array(values), weight)
    ref = tensorboard_smoothing(values, weight) if weight > 0 else values
    for a, b in zip(ours, ref, strict=True):
        assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-9, abs=1e-9)


def test_smoothing_fixed_values():
    assert charts.tb_smooth(np.array([1.0, 2.0, 3.0]), 0.5).tolist() == pytest.approx([1.0, 5 / 3, 17 / 7])
    assert charts.tb_smooth(np.array([4.0, 4.0, 4.0]), 0.9).tolist() == [
        4.0,
        4.0,
        4.0,
    ]  # constant: unsmoothed
    out = charts.tb_smooth(np.array([1.0, math.nan, 3.0]), 0.5)
    assert out[0] == 1.0 and math.isnan(out[1]) and out[2] == pytest.approx(7 / 3)  # NaN does not advance


def test_downsampling_keeps_spikes_nans_and_order():
    rng = np.random.default_rng(0)
    x = np.arange(1_000_000)
    y = rng.normal(size=x.size)
    y[123_457] = 1e6
    y[700_001] = -1e6
    y[[10, 999_999]] = np.nan
    dx, dy = charts.downsample(x, y, buckets=2000)
    assert len(dx) <= 4 * 2000 + 2 and np.all(np.diff(dx) > 0)
    assert (
        123_457 in dx and 700_001 in dx and np.isnan(dy[dx == 10]).all() and np.isnan(dy[dx == 999_999]).all()
    )
    assert dy[np.isfinite(dy)].max() == 1e6 and dy[np.isfinite(dy)].min() == -1e6
    small = np.arange(100.0)
    assert charts.downsample(small, small, 2000)[0] is small


def test_run_colours_are_stable_whatever_the_selection():
    a = [charts.run_color(r) for r in ["exp1", "exp2", "exp3"]]
    b = [charts.run_color(r) for r in ["exp3", "exp2", "exp1"]][::-1]
    assert a == b and charts.run_color("exp1") == charts.run_color("exp1")


def test_curves_figure_traces_colours_alerts_log():
    s = [
        {"run_id": "a", "tag": "loss", "x": np.arange(10), "y": np.r_[np.linspace(3, 1, 9), np.nan]},
        {"run_id": "b", "tag": "loss", "x": np.arange(10), "y": np.linspace(3, 2, 10)},
    ]
    alerts = [
        {
            "run_id": "a",
            "rule": "nan",
            "tag": "",
            "x_start": 9,
            "x_fired": 9,
            "x_end": 9,
            "y": 1.0,
            "message": "nan: loss=nan",
        }
    ]
    fig = charts.curves_figure(s, smoothing=0.6, alerts=alerts, log_y=True)
    names = [t.name for t in fig.data]
    assert names.count("a") == 2 and names.count("b") == 2  # faint raw + smoothed per run
    assert {t.line.color for t in fig.data if t.name == "a"} == {charts.run_color("a")}
    assert "a NaN/Inf" in names and "alert nan" in names
    alert = next(t for t in fig.data if t.name == "alert nan")
    assert alert.text == ("nan: loss=nan",) and len(fig.layout.shapes) == 1
    assert fig.layout.yaxis.type == "log"
    two = charts.curves_figure(
        [*s, {"run_id": "a", "tag": "lr", "x": np.arange(3), "y": np.ones(3)}], smoothing=0.0
    )
    assert [a.text for a in two.layout.annotations] == ["loss", "lr"]  # one subplot per tag


def test_sweep_and_lineage_figures():
    rows = [
        {"rule": "s", "params": "k=3", "recall": 0.5, "false_alarms_per_1k": 2.0},
        {"rule": "s", "params": "k=5", "recall": 0.4, "false_alarms_per_1k": 0.1},
        {"rule": "t", "params": "", "recall": None, "false_alarms_per_1k": None},
    ]
    fig = charts.sweep_figure(rows)
    assert [t.name for t in fig.data] == ["s"] and list(fig.data[0].x) == [0.1, 2.0]
    edges = [
        {"child_run": "b", "parent_run": "a", "parent_step": 100, "kind": "recovery", "evidence": "meta"},
        {"child_run": "a", "parent_run": "a", "parent_step": 50, "kind": "resume", "evidence": "seg"},
    ]
    runs = [
        {"run_id": "a", "status": "recovered", "first_step": 0, "last_step": 200},
        {"run_id": "b", "status": "completed", "first_step": 100, "last_step": 300},
    ]
    lf = charts.lineage_figure(runs, edges)
    nodes = lf.data[-1]
    assert list(nodes.text) == ["a (+1 resume)", "b"] and list(nodes.x) == [0, 1]
