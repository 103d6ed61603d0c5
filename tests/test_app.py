"""Every page under Streamlit's AppTest, on a store built from sample_runs/ (and empty states):
what a user sets is what the URL says, x axes in wall time for runs whose current points carry
none, markers on each chart's own curve, backtest verdicts judged as the backtest judges."""

from __future__ import annotations

import base64
import fnmatch
import json
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from conftest import ingest_paths
from streamlit.testing.v1 import AppTest

from workbench.app import charts, data
from workbench.store import Store

ROOT = Path(__file__).parent.parent
APP = str(ROOT / "app.py")


@pytest.fixture(scope="module")
def sample_store(replayed_sample_runs):
    return replayed_sample_runs  # the app only reads


def app_pages(store: Store, monkeypatch):
    """Opens the app on `store` as a link would: the URL's query parameters, then `page`
    (workbench/app/pages/<page>.py; the start page when None). A page that raised fails."""
    monkeypatch.setenv("WORKBENCH_STORE", str(store.root))

    def open_page(page: str | None = None, **params) -> AppTest:
        at = AppTest.from_file(APP, default_timeout=120)
        for k, v in params.items():
            at.query_params[k] = v
        at.run()
        if page:
            at.switch_page(f"workbench/app/pages/{page}.py").run()
        assert not at.exception, [e.message for e in at.exception]
        return at

    return open_page


@pytest.fixture
def app(sample_store, monkeypatch):
    return app_pages(sample_store, monkeypatch)


def figures(at) -> dict[str, dict]:
    """Charts by title (the tag, before any metric in brackets)."""
    out = {}
    for chart in at.get("plotly_chart"):
        fig = json.loads(chart.proto.spec)
        out[(fig["layout"].get("title", {}).get("text") or "").split("  (")[0]] = fig
    return out


def values(arr) -> np.ndarray:
    """Plotly >= 6 sends arrays as base64 blocks."""
    if isinstance(arr, dict):
        return np.frombuffer(base64.b64decode(arr["bdata"]), dtype=np.dtype(arr["dtype"])).astype(float)
    return np.asarray(arr, dtype=float)


def plain(markdown: str) -> str:
    """What a user reads of a message the app escaped for markdown."""
    return re.sub(r"\\(.)", r"\1", markdown)


def line(fig: dict, name: str) -> dict:
    return next(t for t in fig["data"] if t.get("name") == name and t.get("mode") == "lines")


def test_runs_page_filters_config_and_opens_curves(app, sample_store):
    at = app()
    df = at.dataframe[0].value
    assert len(df) == sample_store.query("SELECT count(*) n FROM runs")["n"][0]
    assert {"status", "label", "alerts", "last_loss"} <= set(df.columns)
    at.text_input(key="runs_pattern").input("^healthy").run()
    healthy = sample_store.query("SELECT run_id FROM runs WHERE run_id LIKE 'healthy%' ORDER BY 1")["run_id"]
    assert sorted(at.dataframe[0].value["run_id"]) == healthy.to_list()
    assert at.query_params["q"] == "^healthy"  # the filter is in the URL
    at.text_input(key="runs_pattern").input("([").run()
    assert not at.exception and at.warning
    at.text_input(key="runs_pattern").input("").run()
    at.multiselect(key="runs_label").set_value(["failed"]).run()
    assert (
        len(at.dataframe[0].value)
        == sample_store.query("SELECT count(*) n FROM labels WHERE outcome = 'failed'")["n"][0]
    )
    # the config table: one column per key that differs between the runs shown
    at.multiselect(key="runs_label").set_value([]).run()  # none picked: all
    config = at.dataframe[1].value
    assert "results.all.train_loss" in config.columns
    assert all(config[c].dropna().nunique() > 1 for c in config.columns)
    at.toggle(key="runs_all_keys").set_value(True).run()
    assert "ds_config.fp16.enabled" in at.dataframe[1].value.columns  # the same in every run that has it
    assert at.get("plotly_chart")  # config against the outcome


def test_runs_selection_from_the_url_opens_curves(app):
    at = app(run=["diverge_nan", "healthy_seed0"])
    at.button(key="runs_open_curves").click().run()
    assert not at.exception and at.title[0].value == "Curves"
    assert at.multiselect(key="curves_runs").value == ["diverge_nan", "healthy_seed0"]
    assert at.query_params["run"] == ["diverge_nan", "healthy_seed0"]
    names = {t.get("name") for f in figures(at).values() for t in f["data"]}
    assert {"diverge_nan", "healthy_seed0"} <= names


def test_curves_view_comes_from_the_url_and_goes_back_to_it(app):
    at = app(
        "curves",
        run=["healthy_seed0", "diverge_nan"],
        tags="^train/(loss|grad_norm)$",
        smooth="0.9",
        x="relative time",
        logy="1",
    )
    assert sorted(at.multiselect(key="curves_runs").value) == ["diverge_nan", "healthy_seed0"]
    assert (
        at.slider(key="curves_smoothing").value == 0.9 and at.radio(key="curves_x").value == "relative time"
    )
    figs = figures(at)
    assert sorted(figs) == ["train/grad_norm", "train/loss"]  # one chart per matching tag
    assert figs["train/loss"]["layout"]["yaxis"]["type"] == "log"
    assert figs["train/loss"]["layout"]["xaxis"]["title"]["text"].startswith("relative time")
    at.checkbox(key="curves_log").uncheck().run()
    at.radio(key="curves_x").set_value("step").run()
    assert "logy" not in at.query_params and "x" not in at.query_params  # defaults stay out of the URL
    assert at.query_params["smooth"] == "0.9" and at.query_params["tags"] == "^train/(loss|grad_norm)$"
    smoothed = values(line(figures(at)["train/loss"], "healthy_seed0")["y"])
    at.slider(key="curves_smoothing").set_value(0.0).run()
    raw = values(line(figures(at)["train/loss"], "healthy_seed0")["y"])
    assert not np.allclose(smoothed[: len(raw)], raw[: len(smoothed)])
    at.button(key="curves_export").click().run()
    assert len(at.get("download_button")) == 2


def test_wall_time_comes_from_another_source_of_the_same_step(app, sample_store):
    # attention_collapse: its current points come from JSONL (no wall times); TensorBoard logged
    # the same steps with times. keras_csvlogger_appended: no source has a time at all.
    at = app(
        "curves",
        run=["attention_collapse", "keras_csvlogger_appended", "healthy_seed1_wide"],
        tags="^train/loss$|^loss$",
        x="wall time",
        smooth="0",
    )
    fig = figures(at)["train/loss"]
    assert fig["layout"]["xaxis"]["type"] == "date"
    tb = sample_store.query(
        "SELECT step, wall_time FROM scalars_all WHERE run_id = 'attention_collapse' AND tag = 'train/loss' "
        "AND source = 'tensorboard' ORDER BY step",
    )
    x = values(line(fig, "attention_collapse")["x"])
    offset = x[0] - tb["wall_time"][0] * 1000  # the local-time shift, the same for every point
    assert len(x) == tb.height and np.allclose(x - offset, tb["wall_time"].to_numpy() * 1000, atol=1)
    own = sample_store.query(
        "SELECT wall_time FROM scalars WHERE run_id = 'healthy_seed1_wide' AND tag = 'train/loss' ORDER BY step",
    )
    assert np.allclose(
        values(line(fig, "healthy_seed1_wide")["x"]) - offset, own["wall_time"].to_numpy() * 1000, atol=1
    )
    assert "keras_csvlogger_appended" in plain(
        at.warning[0].value
    )  # named, not drawn by step under a time title
    assert "take their wall time from another source" in at.caption[-1].value
    at.radio(key="curves_x").set_value("relative time").run()
    fig = figures(at)["train/loss"]
    rel = values(line(fig, "attention_collapse")["x"])
    assert fig["layout"]["xaxis"]["title"]["text"] == "relative time (s)"
    assert rel.min() >= 0 and np.all(np.diff(rel) >= 0) and rel.max() > 1


def test_replaced_points_are_resumes_only(app, sample_store):
    at = app("curves", run=["resumed_after_kill", "attention_collapse"], tags="^train/loss$", replaced="1")
    fig = figures(at)["train/loss"]
    replaced = next(t for t in fig["data"] if t.get("name") == "replaced by a resume")
    resumed = sample_store.query(
        "SELECT count(*) n FROM scalars_all WHERE run_id = 'resumed_after_kill' AND tag = 'train/loss' AND superseded",
    )["n"][0]
    duplicates = sample_store.query(
        "SELECT count(*) n FROM scalars_all WHERE run_id = 'attention_collapse' AND tag = 'train/loss' AND superseded",
    )["n"][0]
    assert (
        len(values(replaced["x"])) == resumed > 0
    )  # attention_collapse's TensorBoard copies are not among them
    caption = at.caption[-1].value
    assert f"{resumed:,} points replaced by a resume" in caption
    assert f"{duplicates:,} points are the same step logged by another source" in caption


def test_alerts_sit_on_the_chart_of_the_metric_that_fired(app, sample_store):
    at = app("curves", run=["attention_collapse"], tags="^train/(loss|grad_norm)$", smooth="0")
    reads_of = data.rule_metrics()
    drawn = {}
    for tag, fig in figures(at).items():
        curve = line(fig, "attention_collapse")
        x, y = values(curve["x"]), values(curve["y"])
        for t in fig["data"]:
            if not (t.get("name") or "").startswith("alert "):
                continue
            rule = t["name"].removeprefix("alert ")
            metric = tag.split("/")[-1]  # not a loss alert on grad_norm (a glob rule: each tag it fired on)
            assert any(fnmatch.fnmatchcase(metric, m) for m in reads_of[rule]), (rule, tag)
            family = data.rule_families()[rule]  # one marker per rule family, named in the legend
            assert (
                t["marker"]["symbol"] == charts.alert_symbol(family)
                and t["legendgroup"] == f"alerts: {family}"
            )
            drawn.setdefault(rule, set()).add(tag)
            for ax, ay in zip(t["x"], t["y"], strict=True):
                assert ay == pytest.approx(np.interp(ax, x, y), rel=1e-4), tag  # on this chart's curve
    stored = sample_store.query("SELECT DISTINCT rule FROM alerts WHERE run_id = 'attention_collapse'")
    assert drawn and set(drawn) <= set(stored["rule"])
    assert all(len(tags) == 1 for rule, tags in drawn.items() if reads_of[rule] != ["*"])


def test_samples_series_is_drawn_in_steps_with_its_events(app):
    # deepspeed_default_log_level has no train_batch_size: its monitor logs x in samples (32 a
    # step), which ingest puts on optimizer steps (micro batch x gradient accumulation); there it
    # agrees with the JSONL's train/lr, so the two are one series, drawn once
    run = "deepspeed_default_log_level"
    at = app("curves", run=[run], tags="^Train/Samples/lr$|^train/lr$")
    figs = figures(at)
    steps = values(line(figs["train/lr"], run)["x"])
    assert steps.max() == 400 and steps.min() == 1 and len(steps) == 400  # 12800 samples / 32
    assert "Train/Samples/lr" not in figs
    assert figs["train/lr"]["layout"]["xaxis"]["title"]["text"] == "step"


def test_groups_by_name_pattern_draw_mean_and_band(app):
    at = app(
        "curves",
        run=["healthy_seed0", "healthy_seed1_wide", "diverge_nan"],
        tags="^train/loss$",
        group="name",
        by="^(healthy)",
    )
    fig = figures(at)["train/loss"]
    names = [t.get("name") for t in fig["data"] if t.get("mode") == "lines"]
    assert names == ["diverge_nan (1 run)", "healthy (2 runs)"]
    assert sum(t.get("fill") == "toself" for t in fig["data"]) == 2


def test_live_refresh_toggle(app):
    at = app("curves", run=["healthy_seed0"], live="1")
    assert any(c.value.startswith("Live: store generation") for c in at.caption)


def test_backtest_page_scores_in_percent_and_judges_by_onset(app):
    at = app("backtest")  # results on arrival, as `workbench backtest` prints them
    scores = at.dataframe[0].value
    # what a user decides by first; the wide params last, the intervals on request
    assert list(scores.columns[:4]) == [
        "rule",
        "trigger_rate_failed",
        "trigger_rate_healthy",
        "false_alarms_per_1k",
    ]
    assert "params" not in scores.columns and not any("_ci_" in c for c in scores.columns)
    p1 = scores[scores["rule"] == "P1_attention_collapse"].iloc[0]
    assert 1 < p1["recall"] <= 100  # a percentage, as the CLI prints it (P1 detects attention_collapse)
    verdict_chart, sweep = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]  # the verdict first
    assert sweep["layout"]["xaxis"]["title"]["text"] == "false alarms per 1k steps"
    failed, healthy = (
        next(t for t in verdict_chart["data"] if t["name"].startswith(w)) for w in ("failed", "healthy")
    )
    by_rule = dict(zip(failed["y"], zip(failed["x"], healthy["x"], strict=True), strict=True))
    shown = (p1["trigger_rate_failed"] / 100, p1["trigger_rate_healthy"] / 100)
    assert by_rule["P1_attention_collapse"] == pytest.approx(shown) and shown[0] > 0
    separation = [f - h for f, h in zip(failed["x"], healthy["x"], strict=True)]
    assert separation == sorted(separation)  # best separation on top (plotly draws the first at the bottom)
    at.toggle(key="bt_params").set_value(True).run()
    assert at.dataframe[0].value.columns[-1] == "params"  # the wide params on request, last
    at.selectbox(key="bt_rule").set_value("P1_attention_collapse").run()
    table = at.dataframe(key="bt_runs_table").value
    verdict = dict(zip(table["run_id"], table["verdict"], strict=True))
    assert verdict["attention_collapse"] == "detected" and verdict["diverge_nan"] == "missed"
    assert verdict["healthy_seed0"] == "quiet"
    lead = table[table["run_id"] == "attention_collapse"]["lead"].iloc[0]
    assert (
        lead == table[table["run_id"] == "attention_collapse"]["onset"].iloc[0] - 214
    )  # onset − first alarm
    at.number_input(key="bt_horizon").set_value(0).run()
    at.number_input(key="bt_lead").set_value(0).run()
    at.button(key="bt_run").click().run()
    table = at.dataframe(key="bt_runs_table").value
    assert dict(zip(table["run_id"], table["verdict"], strict=True))["attention_collapse"] != "detected"
    at.button(key="bt_open_curves").click().run()
    assert at.title[0].value == "Curves" and not at.exception
    names = {t.get("name") for f in figures(at).values() for t in f["data"]}
    assert any(n and n.startswith("alert ") for n in names)  # stored alerts, one legend entry per rule
    assert "Drawing the alarms of" in plain(at.caption[0].value)  # the backtest's, open markers
    assert "grad_norm" in at.query_params["tags"]  # the chart of the metric the rule reads is shown
    grad = figures(at)["train/grad_norm"]
    marks = next(t for t in grad["data"] if t.get("name") == "P1_attention_collapse (backtest)")
    assert marks["marker"]["symbol"].endswith("-open")  # apart from the stored alerts' filled markers


def test_the_apps_verdict_per_run_is_the_backtests(sample_store, monkeypatch):
    # the backtest page's per-run table, counted up, gives the backtest's own figures for the
    # same rules and settings (a short lead and horizon, so that every verdict occurs)
    from dataclasses import replace

    from detectors.backtest import Settings, backtest
    from detectors.replay import default_rules
    from workbench.app import data

    monkeypatch.setenv("WORKBENCH_STORE", str(sample_store.root))
    ids = ("guides_loss_drop", "guides_loss_spike", "P1_attention_collapse")
    rules = [replace(r, sweep={}) for r in default_rules() if r.id in ids]  # their own parameters
    res = backtest(sample_store, rules, None, Settings(horizon=50, lead=20, bootstrap=0), predictors=False)
    assert sorted(r["rule"] for r in res.rules) == sorted(ids)
    seen = set()
    for row in res.rules:
        table, _ = data.rule_verdicts(data.generation(), None, None, 50, 20, 0, row["rule"], row["params"])
        seen |= set(table["verdict"])
        judged = table.filter(~pl.col("verdict").is_in(["not evaluable", "unlabelled"]))
        failed, healthy = (
            judged.filter(pl.col("label") == "failed"),
            judged.filter(pl.col("label") == "healthy"),
        )
        assert (judged.height, failed.height) == (row["runs_evaluable"], row["evaluable_failed"])
        verdicts = failed["verdict"].to_list()
        detected = verdicts.count("detected")
        assert row["recall"] == detected / failed.height
        early = verdicts.count("false alarm (before the window)")
        assert row["trigger_rate_failed"] == (detected + early) / failed.height
        assert (
            row["trigger_rate_healthy"] == healthy["verdict"].to_list().count("false alarm") / healthy.height
        )
        alarmed = judged["verdict"].str.starts_with("false alarm").sum()
        assert row["precision"] == (detected / (detected + alarmed) if detected + alarmed else None)
        assert row["never_fired"] == verdicts.count("missed") == (failed["alarms"] == 0).sum()
        leads, firsts = failed["lead"].drop_nulls(), failed["first_alarm"].drop_nulls()
        assert row["lead_time_median"] == (pytest.approx(leads.median()) if leads.len() else None)
        assert row["first_trigger_mean"] == (pytest.approx(firsts.mean()) if firsts.len() else None)
    assert seen == {
        "detected",
        "missed",
        "late",
        "false alarm (before the window)",
        "quiet",
        "false alarm",
        "not evaluable",
    }


def test_backtest_rule_errors_name_the_rule_text(app):
    at = app("backtest")
    at.radio(key="bt_source").set_value("my rules (TOML)").run()
    at.text_area(key="bt_rules_text").input('[[rule]]\nid = "x"\nwhen = "loss >"').run()
    at.button(key="bt_run").click().run()
    message = plain(at.error[0].value)
    assert message.startswith("the rule text: rule #1 (x)") and "/tmp" not in message


def test_lineage_page_resumes_and_stitched_curve(app):
    at = app("lineage", run="resumed_after_kill")
    assert set(at.dataframe[0].value["kind"]) == {"recovery", "resume"}
    graph, stitched = (json.loads(c.proto.spec) for c in at.get("plotly_chart"))
    texts = [x for t in graph["data"] for x in (t.get("text") or []) if isinstance(x, str)]
    assert "resumed_after_kill · segment 0" in texts and "resume @ 200" in texts
    assert {t.get("name") for t in graph["data"]} >= {"unknown", "recovered"}  # the status legend
    assert [a["text"] for a in stitched["layout"]["annotations"]] == ["resumed_after_kill resumed @ 200"]
    at.selectbox(key="lineage_run").set_value("attention_collapse_recovery").run()
    stitched = json.loads(at.get("plotly_chart")[1].proto.spec)
    assert sorted(t["name"] for t in stitched["data"] if t.get("mode") == "lines") == [
        "attention_collapse",
        "attention_collapse_recovery",
    ]
    assert [a["text"] for a in stitched["layout"]["annotations"]] == [
        "continued by attention_collapse_recovery"
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
    for page, text in (
        ("backtest", "No labelled runs"),
        ("lineage", "No lineage"),
        ("runs", "logged a config"),
    ):
        at = AppTest.from_file(APP, default_timeout=60).run()
        at.switch_page(f"workbench/app/pages/{page}.py").run()
        assert not at.exception and text in at.info[0].value
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.switch_page("workbench/app/pages/curves.py").run()
    assert not at.exception and figures(at)["loss"]  # a store without alerts still draws


def test_export_is_one_row_per_step_with_the_runs_wall_times(sample_store, monkeypatch):
    import io

    monkeypatch.setenv("WORKBENCH_STORE", str(sample_store.root))
    pair = (("attention_collapse", "train/loss"),)  # logged by TensorBoard and JSONL (no wall times)
    gen = data.generation()
    rows = pl.read_csv(io.BytesIO(data.export(gen, pair, "csv")))
    current = sample_store.query(
        "SELECT count(*) n FROM scalars WHERE run_id = 'attention_collapse' AND tag = 'train/loss'"
    )["n"][0]
    assert rows.height == current and rows["step"].is_unique().all()
    assert rows["wall_time"].null_count() == 0  # taken from the source that logged the step
    everything = pl.read_csv(io.BytesIO(data.export(gen, pair, "csv", True)))
    assert everything.height > rows.height and everything.filter(~pl.col("superseded")).height == rows.height
