"""Detectors and the replay engine: truth tables (values -> alert intervals), edge cases, and
the causality property (truncating a run never changes what fired before the cut)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import polars as pl
import pytest
from conftest import DATA, ingest_paths
from hypothesis import given, settings
from hypothesis import strategies as st

from detectors.builtins import BUILTINS, builtin_rules
from detectors.builtins.base import lr_warmup_end
from detectors.builtins.gradients import EmaGradSpike, GradientFlow, VanishingGradients
from detectors.builtins.loss import LlmFoundrySpike, LossDivergence, MegatronSpike, SigmaSpike
from detectors.builtins.memory import MemoryPressure
from detectors.builtins.moe import BalanceLossShare, MoeImbalance
from detectors.builtins.nonfinite import LossScaleCollapse, NonFinite, NonFiniteGradNorm
from detectors.builtins.patterns import PatternP1, PatternP3Accuracy
from detectors.builtins.plateaus import LrCollapse, Plateau
from detectors.engine import evaluate
from detectors.replay import batches, replay_batches
from detectors.rules import Rule
from detectors.series import ReplayError, SeriesData
from workbench.store import Store

NAN, INF = float("nan"), float("inf")


def data(runs: dict, metrics: dict | None = None, events: list | None = None) -> SeriesData:
    """runs: {run: {tag: [values at steps 0.. ] or [(step, value), ...]}}"""
    rows = []
    for run, tags in runs.items():
        for tag, pts in tags.items():
            pts = list(enumerate(pts)) if pts and not isinstance(pts[0], tuple) else pts
            rows += [
                {"run_id": run, "tag": tag, "metric": (metrics or {}).get(tag), "step": s, "value": float(v)}
                for s, v in pts
            ]
    frame = pl.DataFrame(
        rows,
        schema={
            "run_id": pl.String,
            "tag": pl.String,
            "metric": pl.String,
            "step": pl.Int64,
            "value": pl.Float64,
        },
    )
    ev = pl.DataFrame(
        events or [], schema={"run_id": pl.String, "step": pl.Int64, "kind": pl.String, "attrs": pl.String}
    )
    return SeriesData(frame, ev, sorted(runs))


def fired(rule, d) -> list[tuple]:
    alerts, _ = evaluate(rule, d)
    return [
        (r["run_id"], r["step_start"], r["step_fired"], r["step_end"]) for r in alerts.iter_rows(named=True)
    ]


def test_threshold_for_steps_truth_table():
    d = data({"r": {"x": [0, 5, 5, 5, 0, 5, 5, 5, 5, 0, 5]}})
    assert fired(Rule("t", "x > 4"), d) == [("r", 1, 1, 3), ("r", 5, 5, 8), ("r", 10, 10, 10)]
    assert fired(Rule("t", "x > 4", for_steps=3), d) == [("r", 1, 3, 3), ("r", 5, 7, 8)]
    assert fired(Rule("t", "x > 4", for_steps=4), d) == [("r", 5, 8, 8)]
    assert fired(Rule("t", "x > 4", warmup=2), d) == [("r", 2, 2, 3), ("r", 5, 5, 8), ("r", 10, 10, 10)]


def test_cooldown_merges_alerts():
    d = data({"r": {"x": [5, 0, 5, 0, 0, 0, 0, 5]}})
    assert fired(Rule("t", "x > 4"), d) == [("r", 0, 0, 0), ("r", 2, 2, 2), ("r", 7, 7, 7)]
    assert fired(Rule("t", "x > 4", cooldown=2), d) == [("r", 0, 0, 2), ("r", 7, 7, 7)]
    assert fired(Rule("t", "x > 4", cooldown=5), d) == [("r", 0, 0, 7)]


def test_nan_compares_false_and_not_catches_it():
    d = data({"r": {"x": [1, NAN, INF, -INF, 2]}})
    assert fired(Rule("t", "x > 0"), d) == [("r", 0, 0, 0), ("r", 2, 2, 2), ("r", 4, 4, 4)]
    assert fired(Rule("t", "x < 1e30"), d) == [("r", 0, 0, 0), ("r", 3, 3, 4)]
    assert fired(Rule("t", "not (x < 1e30)"), d) == [("r", 1, 1, 2)]
    assert fired(NonFinite(metric="x").rule(), d) == [("r", 1, 1, 3)]


def test_missing_metric_is_null_and_sparse_metric_is_as_of():
    # eval logged every 3 steps: carried forward; y starts at step 2: null (false) before
    d = data(
        {
            "r": {
                "loss": [1, 1, 1, 1, 1, 1],
                "eval_loss": [(0, 5), (3, 1)],
                "y": [(2, 1), (3, 1), (4, 1), (5, 1)],
            }
        }
    )
    assert fired(Rule("t", "eval_loss > loss"), d) == [("r", 0, 0, 2)]
    assert fired(Rule("t", "y > 0 or loss > 5"), d) == [("r", 2, 2, 5)]
    assert fired(Rule("t", "not (y > 5)"), d) == [("r", 2, 2, 5)]
    # on = eval_loss: evaluated only at eval steps
    assert fired(Rule("t", "eval_loss > 0", on="eval_loss"), d) == [("r", 0, 0, 3)]


def test_windows_use_only_past_values():
    d = data({"r": {"loss": [1.0] * 10 + [1.5, 0.5, 1.0]}})
    assert fired(Rule("t", "loss > mean(loss, 5)"), d) == [("r", 10, 10, 10)]
    assert fired(Rule("t", "loss > max(loss, 3)"), d) == [("r", 10, 10, 10)]
    assert fired(Rule("t", "loss < min(loss, 3)"), d) == [("r", 11, 11, 11)]
    # constant series: std 0, a sigma spike needs strictly more than the mean
    assert fired(SigmaSpike(window=5, k=3, for_steps=1).rule(), data({"r": {"loss": [2.0] * 20}})) == []


def test_ema_delta_pct_change_slope_max_first():
    d = data({"r": {"g": [1, 1, 1, 1, 10, 1]}})
    assert fired(Rule("t", "g > 5 * ema(g, 0.9)"), d) == [("r", 4, 4, 4)]
    assert fired(Rule("t", "delta(g, 1) > 5"), d) == [("r", 4, 4, 4)]
    assert fired(Rule("t", "pct_change(g, 1) < -0.5"), d) == [("r", 5, 5, 5)]
    # slope per step, on irregular steps
    lin = data({"r": {"x": [(0, 0.0), (10, 1.0), (30, 3.0), (31, 3.1)]}})
    frame, _, _ = __import__("detectors.compiler", fromlist=["conditions"]).conditions(
        Rule("t", "slope(x, 3) > 0.099"), lin
    )
    assert frame["cond"].to_list() == [False, False, True, True]
    # Megatron: |x| >= 10 x max of the first 3 finite values, known only after them
    m = data({"r": {"gn": [1, NAN, 2, 3, 25, 31, 100]}})
    assert fired(MegatronSpike(metric="gn", baseline=3).rule(), m) == [("r", 5, 5, 6)]


def test_empty_and_single_point_runs():
    d = data({"one": {"loss": [3.0]}, "two": {"loss": [1.0, 100.0]}})
    assert fired(Rule("t", "loss > 2"), d) == [("one", 0, 0, 0), ("two", 1, 1, 1)]
    assert fired(SigmaSpike(window=100, for_steps=1).rule(), d) == []


def test_glob_evaluates_each_tag_and_alerts_carry_it():
    d = data({"r": {"gn/layer_0": [1, 1e-9, 1e-9], "gn/layer_1": [1, 1, 1e-9], "loss": [1, 1, 1]}})
    alerts, runs = evaluate(Rule("t", "`gn/layer_*` < 1e-8 and loss > 0"), d)
    assert [(r["tag"], r["step_start"]) for r in alerts.iter_rows(named=True)] == [
        ("gn/layer_0", 1),
        ("gn/layer_1", 2),
    ]
    assert "gn/layer_0" in alerts["message"][0] or "`gn/layer_*`" in alerts["message"][0]


def test_glob_rule_takes_a_plain_series_as_of_each_step_for_every_matched_tag():
    # every matched tag sees loss as logged at or before its own step, never a later value
    loss = [(s, s + 0.5) for s in range(1, 60, 3)]  # steps 1, 4, 7, ...
    run = {"gn/layer_0": list(range(60)), "gn/layer_1": list(range(60)), "loss": loss}
    d = data({"a": run, "b": run})
    alerts, _ = evaluate(Rule("t", "`gn/layer_*` >= 0 and loss < 4"), d)
    assert [
        (r["run_id"], r["tag"], r["step_start"], r["step_end"]) for r in alerts.iter_rows(named=True)
    ] == [(run_id, tag, 1, 3) for run_id in "ab" for tag in ("gn/layer_0", "gn/layer_1")]


def test_metric_names_resolve_through_aliases_and_absence_rules():
    d = data({"a": {"train/loss": [1, 9]}, "b": {"other": [1, 2]}}, metrics={"train/loss": "loss"})
    alerts, runs = evaluate(Rule("t", "loss > 5"), d)
    assert runs == ["a"] and alerts["run_id"].to_list() == ["a"]  # b is not evaluable, counted
    with pytest.raises(ReplayError, match="grad_norm found in no selected run.*Available metrics: loss"):
        evaluate(Rule("t", "grad_norm > 5"), d)
    slash = data({"a": {"grad_norm/layer_0": [1, 2]}})
    with pytest.raises(ReplayError, match=r"Did you mean `grad_norm/layer_0`\?"):
        evaluate(Rule("t", "grad_norm/layer_0 > 5"), slash)


def test_p1_truth_table():
    gn = [1.0] * 5 + [1e-6] * 6 + [1.0]
    ent = [2.0] * 3 + [0.1] * 9
    d = data({"r": {"grad_norm": gn, "attn_entropy": ent}})
    assert fired(PatternP1().rule(), d) == [("r", 5, 9, 10)]


def test_sigma_spike_with_flagged_points_kept_out_of_the_baseline():
    base = [1.0, 1.1, 0.9, 1.05, 0.95] * 4
    vals = base + [5.0, 5.0, 5.0] + [1.0]
    d = data({"r": {"loss": vals}})
    plain = fired(SigmaSpike(window=10, k=3, for_steps=1).rule(), d)
    kept_out = fired(SigmaSpike(window=10, k=3, exclude_flagged=True, for_steps=1).rule(), d)
    assert plain == [("r", 20, 20, 20)]  # the first spike inflates the window: the next two pass
    assert kept_out == [("r", 20, 20, 22)]


def test_plateau_reduce_lr_on_plateau_semantics():
    # improvements until 4, then within the 10 % threshold: counter 1, 2, 3 -> fires when > 2
    d = data({"r": {"eval_loss": [10, 8, 6, 5, 4, 3.9, 3.8, 3.7, 3.0, 2.9]}})
    assert fired(Plateau(threshold=0.1, patience=2).rule(), d) == [("r", 7, 7, 7)]
    # absolute threshold: 3.9 -> 3.8 is an improvement of 0.1 from the best (4), so no plateau
    assert fired(Plateau(threshold=0.1, patience=2, relative=False).rule(), d) == []


def test_gradient_flow_uses_first_and_last_layer_per_run():
    d = data(
        {
            "r": {
                "grad_norm/layer_0": [1, 1e-5, 1e-5],
                "grad_norm/layer_3": [1, 1, 1e-8],
                "grad_norm/layer_1": [9, 9, 9],
            }
        }
    )
    # vanishing at step 1 (1e-5 / 1), exploding at step 2 (1e-5 / 1e-8): one interval
    assert fired(GradientFlow().rule(), d) == [("r", 1, 1, 2)]


def test_loss_scale_collapse_from_events():
    ev = [{"run_id": "r", "step": s, "kind": "overflow", "attrs": "{}"} for s in (10, 20, 30, 31, 32, 33, 34)]
    ev.append({"run_id": "r", "step": 90, "kind": "min_loss_scale", "attrs": "{}"})
    d = data({"r": {"loss": [1.0] * 100}}, events=ev)
    assert fired(LossScaleCollapse(overflows=5, window=50).rule(), d) == [
        ("r", 32, 32, 34),
        ("r", 90, 90, 90),
    ]


def test_llmfoundry_persistent_spike():
    vals = [1.0] * 100 + [2.5] * 4 + [1.0] + [2.5] * 5
    d = data({"r": {"loss": vals}})
    assert fired(LlmFoundrySpike().rule(), d) == [("r", 105, 109, 109)]


def fired_before(cut):
    def pick(alerts):
        return sorted(
            (r["step_start"], r["step_fired"]) for r in alerts.iter_rows(named=True) if r["step_fired"] < cut
        )

    return pick


# --- causality ----------------------------------------------------------------------------------
CAUSAL_RULES = [
    Rule("spike", "x > mean(x, 8) + 2 * std(x, 8)", cooldown=3),
    Rule("ema", "x > 1.5 * ema(x, 0.8)", for_steps=2),
    Rule("slope", "slope(x, 5) < -0.1 and delta(y, 2) > 0"),
    Rule("first", "abs(x) > 2 * max_first(x, 5)"),
    Rule("sparse", "y > x", on="y", for_steps=2),
    SigmaSpike(metric="x", window=6, k=2, exclude_flagged=True, for_steps=1).rule(),
    SigmaSpike(metric="x", window=4, k=1, for_steps=1).rule(),  # gated by the lr warm-up of `lr`
    Plateau(metric="x", threshold=0.01, patience=3).rule(),
    NonFiniteGradNorm(metric="x", consecutive=2).rule(),
    LossDivergence(metric="x", rise=0.1, for_steps=2).rule(),
    EmaGradSpike(metric="x", k=1.5, warmup=0).rule(),
    VanishingGradients(metric="x", window=4, for_steps=2).rule(),
]
series = st.lists(st.one_of(st.floats(-5, 5), st.just(NAN), st.just(INF)), min_size=1, max_size=60)


@settings(deadline=None, max_examples=60)
@given(x=series, y=series, cut=st.integers(1, 60), stride=st.integers(1, 4))
def test_truncating_a_run_never_changes_what_fired_before_the_cut(x, y, cut, stride):
    xs = [(i * stride, v) for i, v in enumerate(x)]
    ys = [(i * stride * 2, v) for i, v in enumerate(y)]
    full = data({"r": {"x": xs, "y": ys, "lr": ys}})
    cut_ys = [p for p in ys if p[0] < cut]
    part = data({"r": {"x": [p for p in xs if p[0] < cut], "y": cut_ys, "lr": cut_ys}})
    for rule in CAUSAL_RULES:
        try:
            a_full, _ = evaluate(rule, full)
            a_part, _ = evaluate(rule, part)
        except ReplayError:
            continue  # a metric absent from the truncated run
        before = fired_before(cut)
        assert before(a_full) == before(a_part), rule.id


def test_alert_fields_and_message():
    d = data({"r": {"loss": [1, 1, 7]}})
    alerts, _ = evaluate(Rule("t", "loss > k", params={"k": 5}, severity="critical"), d)
    row = alerts.row(0, named=True)
    assert row["value"] == 7 and row["severity"] == "critical" and json.loads(row["params"]) == {"k": 5}
    assert row["message"] == "t: loss=7.0" and not math.isnan(row["value"])


# --- detectors that know training: truth tables ------------------------------------------------
def test_non_finite_grad_norm_excuses_fp16_skips_but_not_storms_or_the_scale_floor():
    gn = [1, INF, INF, 1, INF, INF, INF, 1, NAN, 1]
    scale = [2.0**16] * 8 + [1.0, 1.0]  # the scale reaches DeepSpeed's floor at step 8
    fp16 = data({"r": {"grad_norm": gn, "loss_scale": scale}})
    # two skips in a row (DeepSpeed's hysteresis) are normal; the third in a row and the floor are not
    assert fired(NonFiniteGradNorm().rule(), fp16) == [("r", 6, 6, 6), ("r", 8, 8, 8)]
    # without dynamic loss scaling every non-finite norm alarms (as the plain NonFinite does)
    fp32 = data({"r": {"grad_norm": gn}})
    assert fired(NonFiniteGradNorm().rule(), fp32) == fired(NonFinite(metric="grad_norm").rule(), fp32)
    assert fired(NonFiniteGradNorm().rule(), fp32) == [("r", 1, 1, 2), ("r", 4, 4, 6), ("r", 8, 8, 8)]
    # OVERFLOW notices are evidence of dynamic loss scaling too, from their step on; a
    # minimum-loss-scale exit is the floor
    ev = [{"run_id": "r", "step": 3, "kind": "overflow", "attrs": "{}"}]
    noticed = data({"r": {"grad_norm": gn}}, events=ev)
    assert fired(NonFiniteGradNorm().rule(), noticed) == [("r", 1, 1, 2), ("r", 6, 6, 6)]
    ev.append({"run_id": "r", "step": 8, "kind": "min_loss_scale", "attrs": "{}"})
    exited = data({"r": {"grad_norm": gn}}, events=ev)
    assert fired(NonFiniteGradNorm().rule(), exited) == [("r", 1, 1, 2), ("r", 6, 6, 6), ("r", 8, 8, 8)]


def test_lr_warmup_end_is_the_first_lr_not_above_the_largest_before():
    d = data(
        {
            "warm": {"lr": [0.1, 0.2, 0.3, 0.3, 0.2]},  # linear warm-up to step 2, then flat
            "flat": {"lr": [1.0, 1.0, 1.0]},
            "rising": {"lr": [1, 2, 3]},  # never done warming up
            "once": {"lr": [(5, 3e-4)]},  # a constant, logged once
            "no_lr": {"loss": [1, 2]},
        }
    )
    ends = {d.run_name[rid]: end for rid, end in lr_warmup_end(d).iter_rows()}
    assert ends == {"warm": 3, "flat": 1, "rising": None, "once": 5}


def test_sigma_rules_wait_for_the_window_and_the_lr_warmup():
    noise = [1.0, 1.1, 0.9, 1.05, 0.95] * 8  # 40 steps
    loss = noise[:25] + [3.0] + noise[25:] + [3.0] + [1.0] * 4  # spikes at 25 and 41
    lr = [i / 30 for i in range(30)] + [1.0] * 16  # the warm-up ends at step 30
    rule = SigmaSpike(window=20, k=3, cooldown=0, for_steps=1).rule()
    assert fired(rule, data({"r": {"loss": loss}})) == [("r", 25, 25, 25), ("r", 41, 41, 41)]
    assert fired(rule, data({"r": {"loss": loss, "lr": lr}})) == [("r", 41, 41, 41)]
    # the window must have filled: 20 finite values before the first spike at 10
    early = noise[:10] + [3.0] + noise[:10]
    assert fired(rule, data({"r": {"loss": early}})) == []


def test_sigma_spike_skips_non_finite_values_in_its_window():
    noise = [1.0, 1.1, 0.9, 1.05, 0.95] * 6
    loss = noise[:15] + [INF, NAN] + noise[15:] + [3.0]
    assert fired(SigmaSpike(window=20, k=3, for_steps=1).rule(), data({"r": {"loss": loss}})) == [
        ("r", 32, 32, 32)
    ]


def test_loss_divergence_tells_a_spike_that_recovers_from_one_that_does_not():
    base = [2.0 - 0.01 * i for i in range(50)]  # falling: the best keeps improving
    recovers = base + [3.0] * 5 + [1.5] * 40
    stays = base + [3.0] * 45
    rule = LossDivergence(rise=0.2, for_steps=10, weight=0.5).rule()
    assert fired(rule, data({"r": {"loss": recovers}})) == []
    # the EMA crosses 1.2 x its best at step 50, so the 10th step above is 59
    assert fired(rule, data({"r": {"loss": stays}})) == [("r", 50, 59, 94)]


def test_ema_grad_spike_skips_fp16_skips_and_keeps_spikes_out_of_its_ema():
    g = [1.0] * 10 + [INF] + [1.0] * 5 + [10.0, 10.0] + [1.0] * 5
    rule = EmaGradSpike(k=3, warmup=0, cooldown=0).rule()
    # the Inf neither alarms nor poisons the EMA; the second 10 still alarms (clipped feed)
    assert fired(rule, data({"r": {"grad_norm": g}})) == [("r", 16, 16, 17)]


def test_vanishing_gradients_relative_to_the_runs_own_level():
    g = [0.4] * 20 + [0.01] * 6 + [0.4]
    assert fired(VanishingGradients(window=10, for_steps=5).rule(), data({"r": {"grad_norm": g}})) == [
        ("r", 20, 24, 25)
    ]
    # a run at a tiny but steady gradient norm is not vanishing
    steady = data({"r": {"grad_norm": [1e-6] * 40}})
    assert fired(VanishingGradients(window=10).rule(), steady) == []


def test_lr_collapse_fires_after_for_steps_below_the_fraction_of_the_peak():
    lr = [1.0] * 5 + [0.5**i for i in range(1, 20)]  # below 2 % from 0.5**6
    assert fired(LrCollapse(fraction=0.02, for_steps=3).rule(), data({"r": {"lr": lr}})) == [
        ("r", 10, 12, 23)
    ]


def test_memory_and_moe_detectors_find_their_tags():
    d = data(
        {
            "gpu": {"memory_reserved_pct": [50, 96, 97]},
            "cpu": {"memory/rss_pct_of_budget": [30, 60, 91], "memory_reserved_pct": []},
            "moe": {
                "moe/layer_0/max_load": [130, 400, 500],
                "moe/layer_0/mean_load": [64, 64, 64],
                "moe/layer_1/max_load": [120, 120, 120],
                "moe/layer_1/mean_load": [64, 64, 64],
                "moe/balance_loss": [0.02, 0.02, 900.0],
                "moe/total_loss": [3.0, 2.0, 901.0],
            },
        }
    )
    assert sorted(fired(MemoryPressure().rule(), d)) == [("cpu", 2, 2, 2), ("gpu", 1, 1, 2)]
    alerts, runs = evaluate(MoeImbalance(for_steps=1).rule(), d)
    assert runs == ["moe"] and [(r["tag"], r["step_start"]) for r in alerts.iter_rows(named=True)] == [
        ("moe/layer_0/max_load", 1)
    ]
    assert fired(BalanceLossShare(for_steps=1).rule(), d) == [("moe", 2, 2, 2)]


def test_megatron_spike_leaves_non_finite_values_to_non_finite():
    g = [1.0] * 5 + [INF, 50.0]
    assert fired(MegatronSpike(baseline=5).rule(), data({"r": {"grad_norm": g}})) == [("r", 6, 6, 6)]


# --- every built-in on real runs: the kind it targets, and quiet on healthy fp16 with skips -----
ROOT = Path(__file__).parent.parent
REAL_RUNS = [
    ROOT / "sample_runs" / r
    for r in (
        "healthy_deepspeed_fp16",
        "healthy_seed0",
        "fp16_overflow_storm",
        "diverge_nan",
        "hf_diverge_nan_filtered",
        "spike_recovers",
        "spike_no_recovery",
        "attention_collapse",
        "representation_collapse",
        "overfit",
        "plateau",
        "memory_jump",
    )
] + sorted(p for p in (DATA / "detector_runs").iterdir() if p.is_dir())
HEALTHY = ["healthy_deepspeed_fp16", "healthy_seed0", "moe_healthy"]


@pytest.fixture(scope="module")
def real_alarms(tmp_path_factory):
    """First alarm step per built-in and run, over real runs of every failure kind."""
    root = tmp_path_factory.mktemp("real") / "runs"
    for run in REAL_RUNS:
        shutil.copytree(run, root / run.name)
    store = Store(root.parent / "store")
    ingest_paths(store, root)
    rules = builtin_rules()
    done = replay_batches(store, rules, batches(store, None))
    out = {}
    for rule, d in zip(rules, done, strict=True):
        first = d.alerts.group_by("run_id").agg(pl.col("step_fired").min())
        out[rule.id] = dict(first.iter_rows()), set(d.evaluable)
    return out, store


# (built-in, run of the kind it targets, labelled onset, first alarm no earlier / later than onset + ...)
PINS = [
    ("non_finite_loss", "diverge_nan", 179, 0, 0),
    ("non_finite_grad_norm", "hf_diverge_nan_filtered", 185, 0, 0),  # the logged loss stays finite
    ("non_finite_grad_norm", "fp16_overflow_storm", 61, 1, 5),  # the third skip in a row
    (
        "hf_nan_filtered",
        "hf_diverge_nan_filtered",
        185,
        5,
        5,
    ),  # the first logged 0.0 (185 averages finite steps)
    ("loss_robust_spike", "spike_no_recovery", 151, 1, 1),  # the second point above z 6
    ("grad_robust_spike", "spike_no_recovery", 151, 1, 1),
    ("zclip", "spike_recovers", 151, 0, 0),
    ("loss_scale_collapse", "fp16_overflow_storm", 61, 0, 10),
    ("loss_spike", "spike_recovers", 151, 1, 1),  # two points: a one-step spike is no alarm
    ("olmo_spike", "spike_no_recovery", 151, 0, 0),
    ("loss_divergence", "spike_no_recovery", 151, 45, 55),  # 50 steps without coming back
    ("llmfoundry_loss_spike", "spike_no_recovery", 151, 0, 5),
    ("megatron_unexpectedly_large", "spike_no_recovery", 151, 0, 2),
    ("ema_grad_spike", "spike_no_recovery", 151, 0, 0),  # k 5: the recovered spike stays under
    ("vanishing_gradients", "attention_collapse", 153, 0, 20),
    ("gradient_flow", "attention_collapse", 153, 100, 160),  # only once the gradients are gone
    ("clip_saturation", "spike_no_recovery", 151, 0, 30),
    ("P1_attention_collapse", "attention_collapse", 153, 50, 70),
    ("P2_dead_ffn", "representation_collapse", 159, 40, 55),
    ("P4_memory_jump", "memory_jump", 200, 20, 40),
    ("plateau", "overfit", 60, 100, 130),
    ("lr_collapse", "plateau", 123, 40, 50),  # 0.5 % of its peak: later, but quiet on cosine to 0
    ("overfitting", "overfit", 60, 50, 70),
    ("overfit_gap", "overfit", 60, 0, 0),
    ("memory_pressure", "memory_leak_oom", 102, 50, 65),
    ("memory_growth", "memory_leak_oom", 102, 5, 15),
    ("memory_growth", "memory_jump", 200, 0, 5),
    ("memory_jump", "memory_jump", 200, 0, 5),
    ("moe_imbalance", "moe_router_collapse", 81, 5, 20),
    ("balance_loss_share", "moe_balance_loss_dominates", 30, 0, 5),
]


@pytest.mark.parametrize("rule, run, onset, lo, hi", PINS, ids=[f"{p[0]}-{p[1]}" for p in PINS])
def test_builtin_fires_on_a_real_run_of_the_kind_it_targets(real_alarms, rule, run, onset, lo, hi):
    first, _ = real_alarms[0][rule]
    assert run in first, f"{rule} never fired on {run}"
    assert onset + lo <= first[run] <= onset + hi


@pytest.mark.parametrize("rule", [d.id for d in BUILTINS])
def test_builtin_stays_quiet_on_healthy_runs_fp16_skips_included(real_alarms, rule):
    first, evaluable = real_alarms[0][rule]
    if rule == "zclip":  # a clipping rule at its published z 2.5, out of the ensemble: it fires there
        assert {"healthy_seed0", "healthy_deepspeed_fp16"} <= set(first)
    else:
        assert not set(first) & set(HEALTHY)
    assert rule in {p[0] for p in PINS} or rule in (
        "loss_drop",
        "P3_eval_stalled",
        "P3_eval_accuracy_stalled",
    )


def test_the_healthy_fp16_run_really_skips_steps(real_alarms):
    """The quiet fp16 pin means something: the run has non-finite gradient norms on skipped
    steps, and a plain non-finite rule alarms on them."""
    _, store = real_alarms
    bad = (
        store.connect()
        .execute(
            "SELECT list(step ORDER BY step) FROM scalars WHERE run_id = 'healthy_deepspeed_fp16' "
            "AND metric = 'grad_norm' AND NOT isfinite(value)"
        )
        .fetchone()[0]
    )
    assert bad == [252, 253, 305, 307, 360, 361]
    naive = replay_batches(
        store, [NonFinite(metric="grad_norm").rule()], batches(store, "healthy_deepspeed_fp16")
    )
    assert naive[0].alerts["step_fired"].to_list() == [252, 305, 307, 360]


def test_rules_without_a_corpus_run_of_their_kind_stay_quiet_where_they_do_not_apply(real_alarms):
    """loss_drop targets data leaks and resets, P3 a flat eval while train falls: no real run
    here has either; on the overfit run the eval loss moves, so P3 stays quiet."""
    assert real_alarms[0]["loss_drop"][0] == {} and real_alarms[0]["P3_eval_stalled"][0] == {}


def test_p3_reads_an_eval_accuracy_where_one_is_logged(tmp_path):
    """P3 on `eval_accuracy` (HF's eval_accuracy, Keras' val_accuracy): the train loss falls
    while the accuracy stands still for 10 evals; a rising accuracy is quiet, and so is a run
    with no accuracy."""
    for run, flat_from in (("stalls", 100), ("learns", None), ("no_accuracy", None)):
        lines = []
        for step in range(0, 400):
            rec = {"step": step, "train/loss": 3.0 - step / 200}
            if step % 10 == 0 and run != "no_accuracy":
                acc = 0.5 + min(step, flat_from or 10**9) / 1000
                rec["eval/accuracy" if run == "stalls" else "val_accuracy"] = round(acc, 6)
            lines.append(json.dumps(rec))
        (tmp_path / run).mkdir()
        (tmp_path / run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    store = Store(tmp_path / "store")
    ingest_paths(store, tmp_path / "stalls", tmp_path / "learns", tmp_path / "no_accuracy")
    (done,) = replay_batches(store, [PatternP3Accuracy().rule()], batches(store, None))
    first = done.alerts.group_by("run_id").agg(pl.col("step_fired").min())
    # flat from the eval at step 100 on: the 10th unchanged eval (delta over one eval) is step 200
    assert dict(first.iter_rows()) == {"stalls": 200}
