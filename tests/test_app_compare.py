"""The run comparer under Streamlit's AppTest, on the sample_runs store: the config keys that
differ between two real runs (and all of them on request), one line per run on every chart of a
tag both logged, their alerts counted side by side, reached from the Runs page's ticked rows.
About 25 s on 2 busy cores, most of it the first app run."""

from __future__ import annotations

import json

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest
from test_app import APP, app_pages, figures, plain, values

from workbench.app import compare

PAIR = ["healthy_moe_top1", "healthy_moe_top2"]  # the same model, other MoE hparams


@pytest.fixture
def page(replayed_sample_runs, monkeypatch):
    open_page = app_pages(replayed_sample_runs, monkeypatch)
    return lambda **params: open_page("compare", **params)


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def test_config_diff_lists_exactly_the_keys_that_differ(page, replayed_sample_runs):
    stored = replayed_sample_runs.query(
        "SELECT run_id, config FROM runs WHERE run_id IN ('healthy_moe_top1', 'healthy_moe_top2')"
    )
    cfg = {r: _flat(json.loads(c)) for r, c in stored.iter_rows()}
    a, b = cfg[PAIR[0]], cfg[PAIR[1]]
    differ = {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
    assert differ == {
        f"hparams.{k}" for k in ("aux_loss_coef", "d_model", "lr", "num_experts", "seed", "top_k")
    }

    at = page(run=PAIR)
    table = at.dataframe[0].value
    assert list(table.columns) == [compare.KEY, *PAIR]
    assert set(table[compare.KEY]) == differ
    row = table.set_index(compare.KEY).loc["hparams.d_model"]
    assert row.tolist() == ["32", "48"]  # hparams hold floats; shown as the whole numbers they are

    at.toggle(key="compare_all_keys").set_value(True).run()
    every = at.dataframe[0].value
    assert set(every[compare.KEY]) == a.keys() | b.keys()
    assert every.set_index(compare.KEY).loc["hparams.batch_size"].tolist() == ["16", "16"]
    assert at.query_params["allkeys"] == "1"  # the toggle is in the URL


def test_curves_overlaid_one_line_per_run_for_each_shared_tag(page, replayed_sample_runs):
    shared = replayed_sample_runs.query(
        "SELECT tag FROM scalars WHERE run_id IN ('healthy_moe_top1', 'healthy_moe_top2') "
        "GROUP BY tag HAVING count(DISTINCT run_id) = 2"
    )["tag"].to_list()
    at = page(run=PAIR)
    figs = figures(at)
    assert len(figs) == min(len(shared), 12) and set(figs) <= set(shared)
    for title, fig in figs.items():
        lines = [t["name"] for t in fig["data"] if t.get("mode") == "lines"]
        assert sorted(lines) == PAIR, title

    at = page(run=PAIR, tags="^train/loss$", smooth="0")
    (fig,) = figures(at).values()
    for run in PAIR:  # unsmoothed, the line ends on the run's last logged loss
        line = next(t for t in fig["data"] if t.get("name") == run)
        last = replayed_sample_runs.query(
            f"SELECT value FROM scalars WHERE run_id = '{run}' AND tag = 'train/loss' ORDER BY step DESC LIMIT 1"
        )["value"][0]
        assert values(line["y"])[-1] == pytest.approx(last, rel=1e-6)


def test_alerts_side_by_side_and_three_runs(page, replayed_sample_runs):
    runs = [*PAIR, "moe_router_collapse"]
    at = page(run=runs)
    config = at.dataframe[0].value  # a run without a config: an empty column that makes no key differ
    assert len(config) == 6 and (config["moe_router_collapse"] == compare.MISSING).all()
    assert any("No config logged by moe_router_collapse" in plain(c.value) for c in at.caption)
    counts = at.dataframe[1].value
    assert list(counts.columns) == ["rule", *runs]
    stored = replayed_sample_runs.query(
        "SELECT rule, run_id, count(*) n FROM alerts WHERE run_id IN ('healthy_moe_top1', "
        "'healthy_moe_top2', 'moe_router_collapse') GROUP BY ALL"
    )
    want = {(r, run): n for r, run, n in stored.iter_rows()}
    got = {(row["rule"], run): row[run] for row in counts.to_dict("records") for run in runs}
    assert {k: v for k, v in got.items() if v} == want
    per_run = {run: at.dataframe[2 + i].value for i, run in enumerate(runs)}
    for run in runs:
        assert len(per_run[run]) == sum(n for (_, r), n in want.items() if r == run)
    names = {t["name"] for f in figures(at).values() for t in f["data"] if t.get("mode") == "lines"}
    assert names == set(runs)


def test_many_runs_have_their_alerts_in_one_table(page, replayed_sample_runs):
    runs = replayed_sample_runs.query("SELECT DISTINCT run_id FROM alerts ORDER BY 1 LIMIT 7")[
        "run_id"
    ].to_list()
    at = page(run=runs)
    table = at.dataframe[2].value
    stored = replayed_sample_runs.query(
        f"SELECT count(*) n FROM alerts WHERE run_id IN ({', '.join(repr(r) for r in runs)})"
    )["n"][0]
    assert len(table) == stored and set(table["run_id"]) == set(runs)
    assert len(at.dataframe) == 3  # config, counts, the alerts: no table per run


def test_runs_page_ticked_rows_open_the_comparer(page):
    at = AppTest.from_file(APP, default_timeout=60)  # the Runs page, its rows ticked by a shared link
    at.query_params["run"] = PAIR
    at.run()
    at.button(key="runs_compare").click().run()
    assert not at.exception and at.title[0].value == "Compare runs"
    assert at.multiselect(key="compare_runs").value == PAIR
    assert at.query_params["run"] == PAIR


def test_fewer_than_two_runs_asks_for_more(page):
    at = page(run=["healthy_seed0"])
    assert "two or more" in at.info[0].value and not at.get("plotly_chart")


def test_without_a_store_it_says_how_to_make_one(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_STORE", str(tmp_path / "none"))
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.switch_page("workbench/app/pages/compare.py").run()
    assert not at.exception and "workbench ingest" in at.info[0].value


def test_shared_tags_and_counts_as_tables():
    import polars as pl

    tags = pl.DataFrame({"tag": ["loss", "lr", "only_a"], "metric": ["loss", None, None], "runs": [2, 2, 1]})
    assert compare.shared_tags(tags, 2) == ["loss", "lr"]
    cfg = pl.DataFrame({"run_id": ["a", "b"], "x": [1.0, 1.0], "y": ["p", None]})
    assert compare.config_diff(cfg, ["a", "b"]).rows() == [("y", "p", compare.MISSING)]
    assert compare.config_diff(cfg, ["a", "b", "c"]).rows() == [("y", "p", compare.MISSING, compare.MISSING)]
    assert compare.without_config(cfg, ["a", "c"]) == ["c"]  # c's column makes no key differ
    assert compare.config_diff(cfg, ["a", "c"], all_keys=True).rows() == [
        ("x", "1", compare.MISSING),
        ("y", "p", compare.MISSING),
    ]
    assert np.array_equal(compare.alert_counts(pl.DataFrame(), ["a"]).columns, ["rule", "a"])


def test_curves_page_opens_its_runs_in_the_comparer(page):
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["run"] = PAIR
    at.run()
    at.switch_page("workbench/app/pages/curves.py").run()
    at.button(key="curves_compare").click().run()
    assert not at.exception and at.title[0].value == "Compare runs"
    assert at.multiselect(key="compare_runs").value == PAIR
