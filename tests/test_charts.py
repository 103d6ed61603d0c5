"""Pure chart functions: TensorBoard-identical smoothing, spike-preserving downsampling, colours
that stay apart, group bands, and what each figure puts where."""

from __future__ import annotations

import itertools
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


def test_smoothing_fixed_values_and_long_series():
    assert charts.tb_smooth(np.array([1.0, 2.0, 3.0]), 0.5).tolist() == pytest.approx([1.0, 5 / 3, 17 / 7])
    assert charts.tb_smooth(np.array([4.0, 4.0, 4.0]), 0.9).tolist() == [
        4.0,
        4.0,
        4.0,
    ]  # constant: unsmoothed
    out = charts.tb_smooth(np.array([1.0, math.nan, 3.0]), 0.5)
    assert out[0] == 1.0 and math.isnan(out[1]) and out[2] == pytest.approx(7 / 3)  # NaN does not advance
    # past where weight**n vanishes the debiasing stops; the values still match the reference
    values = list(np.random.default_rng(1).normal(size=60_000))
    ref = tensorboard_smoothing(values, 0.999)
    ours = charts.tb_smooth(np.array(values), 0.999)
    assert ours[[0, 999, 41_000, 59_999]] == pytest.approx(
        [ref[i] for i in (0, 999, 41_000, 59_999)], rel=1e-9
    )


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
    assert dx[0] == 0 and dx[-1] == 999_999  # the line reaches both ends
    small = np.arange(100.0)
    assert charts.downsample(small, small, 2000)[0].tolist() == small.tolist()


@settings(deadline=None, max_examples=100)
@given(n=st.integers(1, 5000), buckets=st.integers(1, 300), seed=st.integers(0, 10))
def test_every_bucket_keeps_its_extremes(n, buckets, seed):
    y = np.random.default_rng(seed).normal(size=n)
    keep = charts.keep_index(y, buckets)
    assert np.all(np.diff(keep) > 0) and keep[0] == 0 and keep[-1] == n - 1
    width = -(-n // buckets)
    for start in range(0, n, width) if n > 4 * buckets else ():
        part = y[start : start + width]
        assert start + int(part.argmin()) in keep and start + int(part.argmax()) in keep


def _lab(hex_colour: str) -> np.ndarray:
    rgb = np.array([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)]) / 255
    lin = np.where(rgb > 0.04045, ((rgb + 0.055) / 1.055) ** 2.4, rgb / 12.92)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ lin
    f = np.cbrt(xyz / [0.95047, 1, 1.08883])
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def test_palette_colours_are_distinguishable():
    closest = min(np.linalg.norm(_lab(a) - _lab(b)) for a, b in itertools.combinations(charts.PALETTE, 2))
    assert len(set(charts.PALETTE)) == 20 and closest > 25  # CIELAB ΔE76: clearly different side by side


def test_run_colours_follow_the_name_not_the_selection():
    runs = [f"run{i}" for i in range(30)]
    styles = charts.line_styles(runs)
    assert all(styles[r][0] == charts.colour_of(r) for r in runs)
    # removing a run, or picking others beside it, never recolours a run
    for removed in runs[:5]:
        rest = charts.line_styles([r for r in runs if r != removed])
        assert all(rest[r][0] == styles[r][0] for r in rest)
    assert charts.line_styles(["run7"])["run7"][0] == styles["run7"][0]
    # two names of one colour differ in dash, in any order
    a, b = next((a, b) for a, b in itertools.combinations(runs, 2) if styles[a][0] == styles[b][0])
    pair = charts.line_styles([a, b])
    assert pair[a][0] == pair[b][0] and pair[a][1] != pair[b][1]


def test_band_is_mean_and_min_max_per_bucket():
    x = np.arange(10.0)
    a, b = np.zeros(10), np.r_[np.full(9, 2.0), 10.0]
    band = charts.band([x, x], [a, b], buckets=10)
    assert band["mean"].tolist() == [1.0] * 9 + [5.0]
    assert band["lo"].tolist() == [0.0] * 10 and band["hi"].tolist() == [2.0] * 9 + [10.0]
    shorter = charts.band([x, x[:5]], [a, b[:5]], buckets=10)  # a run that stopped early leaves the mean
    assert shorter["mean"].tolist()[5:] == [0.0] * 5
    assert charts.band([x], [np.full(10, np.nan)]) is None


def test_group_mean_of_runs_on_different_step_grids_is_the_true_mean():
    # one run logs every step, the other every 10th (as two JSONL runs grouped by name):
    # the mean is taken on one grid, each run interpolated onto it, so it does not zig-zag
    every = np.arange(0, 101)
    tenth = np.arange(0, 101, 10)
    band = charts.band([every, tenth], [every * 1.0, 100.0 - tenth], buckets=500)
    mean = dict(zip(band["x"].tolist(), band["mean"].tolist(), strict=True))
    for step in tenth:  # logged by both: exactly the mean of the two logged values
        assert mean[float(step)] == 50.0
    assert np.allclose(band["mean"], 50.0)  # in between too (the 10-step run interpolated)
    assert band["runs"].min() == 2
    # a long grid is evened out to 4 x buckets points, still the mean of the lines
    long = np.arange(0, 100_000)
    wide = charts.band([long, long[::7]], [long * 1.0, 100_000.0 - long[::7]], buckets=100)
    assert len(wide["x"]) == 400 and np.allclose(wide["mean"][wide["x"] <= long[::7][-1]], 50_000.0)


def test_a_sweep_is_drawn_in_one_trace_per_colour_with_names_in_the_hover():
    runs = [f"run_{i:03d}" for i in range(200)]
    lines = [
        {**_line(r, np.arange(50), np.linspace(3, 1, 50) + i / 100), "color": charts.colour_of(r)}
        for i, r in enumerate(runs)
    ]
    fig = charts.curve_figure("loss", lines)
    traces = [t for t in fig.data if t.mode == "lines"]
    assert len(traces) == len({charts.colour_of(r) for r in runs}) <= 20  # not 400 (raw lines too)
    assert fig.layout.hovermode == "closest"
    assert {n for t in traces for n in t.text} == set(runs)  # the hover names the nearest run
    assert sum(int(np.isnan(np.asarray(t.x, float)).sum()) for t in traces) == len(runs)  # lines apart
    few = charts.curve_figure("loss", lines[:5], legend_lines=True)
    named = [t for t in few.data if t.name in runs[:5]]
    assert len(named) == 5 and all(t.showlegend for t in named)  # a legend to hide or solo a run
    assert all(t.legendgroup == t.name for t in named)  # its raw line hides with it


def test_names_and_titles_are_text_in_plotly():
    evil = '<a href="http://host/">CLICKME</a>'
    fig = charts.curve_figure(
        evil, [_line(evil + " %{y}", np.arange(10), np.arange(10.0))], legend_lines=True
    )
    assert "<a" not in fig.layout.title.text and "&lt;a href" in fig.layout.title.text
    smooth = next(t for t in fig.data if t.mode == "lines" and t.showlegend)
    assert "<a" not in smooth.name and "<a" not in smooth.hovertemplate
    assert "%{y}" not in smooth.hovertemplate.split(":")[0]  # the name's %{y} is not a template field


def test_time_unit_keeps_numbers_readable():
    assert charts.time_unit(90) == ("s", 1)
    assert charts.time_unit(3000) == ("min", 60)
    assert charts.time_unit(20 * 3600) == ("h", 3600)
    assert charts.time_unit(30 * 86400) == ("days", 86400)


def _line(name, x, y, smoothing=0.6, **kw):
    return {
        **charts.prepare_curve(np.asarray(x), np.asarray(y, float), smoothing),
        "name": name,
        "color": "#000000",
        **kw,
    }


def test_curve_figure_markers_legend_and_axes():
    y = np.r_[np.geomspace(1000, 0.1, 99), np.inf]
    lines = [_line("a", np.arange(100), y), _line("b", np.arange(100), np.geomspace(500, 0.5, 100))]
    alerts = [
        {
            "x": 50,
            "y": 3.2,
            "x0": 45,
            "x1": 60,
            "color": "#111111",
            "run": "a",
            "rule": "spike",
            "message": "m",
        }
    ]
    events = [{"x": 10, "y": 7.0, "kind": "overflow", "run": "b", "color": "#222222", "message": "OVERFLOW"}]
    fig = charts.curve_figure("loss", lines, log_y=True, alerts=alerts, events=events, ignore_outliers=False)
    by_name = {t.name: t for t in fig.data if t.name}
    assert {"a", "b", "NaN/Inf", "alert spike", "overflow"} <= set(by_name)
    nan = by_name["NaN/Inf"]
    assert nan.showlegend and nan.cliponaxis is False and list(nan.x) == [99]
    assert nan.y[0] == pytest.approx(1000)  # pinned to the top of the drawn values, not clipped off
    assert list(by_name["alert spike"].y) == [3.2] and list(by_name["overflow"].y) == [7.0]
    assert len(fig.layout.shapes) == 1  # the alert's interval
    assert fig.layout.legend.y < 0 and fig.layout.legend.yanchor == "top"  # below, clear of the title
    assert fig.layout.hovermode == "x unified" and fig.layout.hoversort == "value descending"
    assert fig.layout.yaxis.type == "log" and fig.layout.yaxis.dtick == 1  # decades only across 4 decades
    assert [t.showlegend for t in fig.data if t.name in ("a", "b")] == [
        False,
        False,
    ]  # runs: in the legend only when asked
    short = charts.curve_figure("lr", [_line("a", np.arange(20), np.linspace(2, 3, 20))], log_y=True)
    assert short.layout.yaxis.dtick == "D2"  # within a decade: 2 and 5 only


def test_outlier_range_ignores_spikes():
    v = np.r_[np.linspace(1, 2, 1000), 1e6]
    lo, hi = charts.outlier_range(v)
    assert 0.9 < lo < 1.1 and 1.9 < hi < 2.2
    fig = charts.curve_figure("loss", [_line("a", np.arange(1001), v, smoothing=0.0)])
    assert fig.layout.yaxis.range == pytest.approx((lo, hi))


def test_group_band_and_vlines():
    x = np.arange(10.0)
    band = charts.band([x, x], [np.zeros(10), np.ones(10)], buckets=5)
    line = {
        "name": "g (2 runs)",
        "color": "#123456",
        "smooth_x": band["x"],
        "smooth_y": band["mean"],
        "band": band,
    }
    fig = charts.curve_figure("loss", [line], vlines=[(4.0, "a resumed @ 4")])
    fill = [t for t in fig.data if t.fill == "toself"]
    assert len(fill) == 1 and fig.layout.shapes[0].x0 == 4.0
    assert fig.layout.annotations[0].text == "a resumed @ 4"


def test_sweep_lineage_and_parallel_figures():
    rows = [
        {"rule": "s", "params": "k=3", "recall": 0.5, "false_alarms_per_1k": 2.0},
        {"rule": "s", "params": "k=5", "recall": 0.4, "false_alarms_per_1k": 0.1},
        {"rule": "t", "params": "", "recall": None, "false_alarms_per_1k": None},
    ]
    fig = charts.sweep_figure(rows)
    assert [t.name for t in fig.data] == ["s"] and list(fig.data[0].x) == [0.1, 2.0]
    edges = [
        {"child_run": "b", "parent_run": "a", "parent_step": 100, "kind": "recovery", "evidence": "meta"},
        {
            "child_run": "a",
            "parent_run": "a",
            "child_segment": 1,
            "parent_step": 50,
            "kind": "resume",
            "evidence": "seg",
        },
    ]
    runs = [
        {"run_id": "a", "status": "recovered", "first_step": 0, "last_step": 200},
        {"run_id": "b", "status": "completed", "first_step": 100, "last_step": 300},
    ]
    lf = charts.lineage_figure(runs, edges)
    nodes = next(t for t in lf.data if t.mode == "markers+text" and len(t.x) > 1)
    assert list(nodes.text) == [
        "a · segment 0",
        "segment 1",
        "b",
    ]  # a resumed itself: a chain, not a lone dot
    assert any(t.text == ("resume @ 50",) for t in lf.data)
    assert sorted(t.name for t in lf.data if t.showlegend is not False and t.name) == [
        "completed",
        "recovered",
    ]
    par = charts.parallel_figure(
        [{"lr": 0.1, "opt": "adam", "last_loss": 1.0}, {"lr": 0.3, "opt": "sgd", "last_loss": 2.0}],
        ["lr", "opt"],
        "last_loss",
    )
    dims = par.data[0].dimensions
    assert [d.label for d in dims] == ["lr", "opt", "last_loss"] and list(dims[1].ticktext) == ["adam", "sgd"]


def test_layer_heatmap_marks_the_cells_past_a_threshold():
    steps = np.arange(10.0)
    layers = {
        0: (steps, np.full(10, 2.0)),
        1: (steps, np.r_[np.full(5, 2.0), np.full(5, 0.1)]),
        2: (steps, np.full(10, 1.5)),
    }
    plain = charts.layer_heatmap("attn_entropy/layer_*", layers, bins=10)
    assert [t.type for t in plain.data] == ["heatmap"] and not plain.layout.showlegend
    entropy = {"rule": "guides_P1", "op": "<", "value": 0.3, "text": "guides_P1: attn_entropy < 0.3"}
    fig = charts.layer_heatmap("attn_entropy/layer_*", layers, bins=10, thresholds=[entropy])
    heat, mark = fig.data
    assert list(mark.y) == [1] * 5 and list(mark.x) == pytest.approx(heat.x[5:])  # layer 1's last 5 steps
    assert mark.name == "guides_P1: attn_entropy &lt; 0.3 (5 cells)" and fig.layout.showlegend
    assert 0.3 in heat.colorbar.tickvals and "◀ guides_P1" in heat.colorbar.ticktext


def test_alerts_take_one_marker_per_rule_family_with_the_family_in_the_legend():
    lines = [_line("a", np.arange(100), np.linspace(2, 1, 100))]

    def alert(rule, family, x):
        return {
            "x": x,
            "y": 1.5,
            "color": "#111111",
            "run": "a",
            "rule": rule,
            "family": family,
            "message": "",
        }

    marks = [
        alert("loss_spike", "loss", 10),
        alert("olmo_spike", "loss", 20),
        alert("ema_grad_spike", "gradients", 30),
    ]
    fig = charts.curve_figure("loss", lines, alerts=marks, ignore_outliers=False)
    by_name = {t.name: t for t in fig.data if t.name and t.name.startswith("alert ")}
    assert set(by_name) == {"alert loss_spike", "alert olmo_spike", "alert ema_grad_spike"}
    symbol = {n: t.marker.symbol for n, t in by_name.items()}
    assert symbol["alert loss_spike"] == symbol["alert olmo_spike"] == charts.FAMILY_SYMBOLS["loss"]
    assert symbol["alert ema_grad_spike"] == charts.FAMILY_SYMBOLS["gradients"]
    assert {t.legendgroup for t in by_name.values()} == {"alerts: loss", "alerts: gradients"}
    titles = [t.legendgrouptitle.text for t in by_name.values() if t.legendgrouptitle.text]
    assert sorted(titles) == ["alerts: gradients", "alerts: loss"]  # one title per family
    assert charts.alert_symbol("loss", backtest=True) == "triangle-up-open"


def test_layer_heatmap_marks_a_ratio_of_two_layers_on_the_first():
    steps = np.arange(10.0)
    layers = {
        0: (steps, np.r_[np.ones(6), np.full(4, 5000.0)]),
        1: (steps, np.ones(10)),
        2: (steps, np.ones(10)),
    }
    ratio = {"rule": "r", "op": ">", "value": 1000.0, "text": "r: a / b > 1000", "ratio": (0, 1)}
    _, mark = charts.layer_heatmap("g/layer_*", layers, bins=10, thresholds=[ratio]).data
    assert list(mark.y) == [0] * 4 and mark.name == "r: a / b &gt; 1000 (4 cells)"
