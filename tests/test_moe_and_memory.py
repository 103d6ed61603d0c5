"""The guides' MoE and memory rules on real runs that route tokens through experts and report
memory against a budget (sample_runs: torch on CPU; counts checked with tbparse/json)."""

from __future__ import annotations

import json

import pytest
from conftest import ingest_paths
from real_samples import SAMPLES, sample_store
from tbparse import SummaryReader

from detectors.builtins.memory import MemoryPressure
from detectors.builtins.moe import BalanceLossShare, MoeImbalance
from detectors.replay import default_rules, replay
from workbench.store import Store

RUNS = [
    "healthy_moe_top1",
    "healthy_moe_top2",
    "moe_router_collapse",
    "moe_balance_loss_dominates",
    "healthy_memory_budget",
    "memory_leak_oom",
]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return sample_store(tmp_path_factory, RUNS)


def fired(store, detector) -> dict[str, int]:
    """First firing step per run of one built-in."""
    result = replay(store, [detector.rule()], None)
    alerts = result.alerts.group_by("run_id").agg(first=result.alerts["step_fired"].min())
    return dict(alerts.rows())


def test_moe_and_memory_tags_resolve_to_the_guides_names(store):
    metrics = dict(store.query("SELECT DISTINCT tag, metric FROM scalars WHERE metric IS NOT NULL").rows())
    assert metrics["moe/layer_0/max_load"] == "moe_max_load"
    assert metrics["moe/layer_0/mean_load"] == "moe_mean_load"
    assert metrics["moe/balance_loss"] == "balance_loss"
    assert metrics["memory/rss_pct_of_budget"] == "memory_reserved_pct"
    assert metrics["train/loss"] == "loss"  # the LM loss, not moe/total_loss


def first_streak(steps: list[int], flags: list[bool], k: int) -> int | None:
    """The step where `flags` has been true on k consecutive logged steps for the first time."""
    run = 0
    for step, flag in zip(steps, flags, strict=True):
        run = run + 1 if flag else 0
        if run == k:
            return step
    return None


def test_imbalance_fires_on_the_collapsed_router_only(store):
    detector = MoeImbalance()
    first = fired(store, detector)
    assert set(first) == {"moe_router_collapse"}
    # independently: max/mean load above 5 in any layer on for_steps consecutive steps
    rows = [
        json.loads(line) for line in (SAMPLES / "moe_router_collapse/metrics.jsonl").read_text().splitlines()
    ]
    expected = min(
        first_streak(
            [r["step"] for r in rows],
            [r[f"moe/layer_{i}/max_load"] / r[f"moe/layer_{i}/mean_load"] > 5 for r in rows],
            detector.for_steps,
        )
        for i in (0, 1)
    )
    assert first["moe_router_collapse"] == expected


def test_balance_share_fires_on_the_over_weighted_run(store):
    detector = BalanceLossShare()
    first = fired(store, detector)
    assert not {"healthy_moe_top1", "healthy_moe_top2"} & set(first)
    tb = SummaryReader(str(SAMPLES / "moe_balance_loss_dominates/tb")).scalars
    bal = tb[tb["tag"] == "moe/balance_loss"].sort_values("step")
    total = tb[tb["tag"] == "moe/total_loss"].sort_values("step")
    share = bal["value"].to_numpy() / total["value"].to_numpy()
    expected = first_streak(bal["step"].tolist(), list(share > 0.3), detector.for_steps)
    assert first["moe_balance_loss_dominates"] == expected and expected < 50  # the coefficient jumps at 40


def test_memory_rule_fires_before_the_out_of_memory_kill(store):
    first = fired(store, MemoryPressure())
    assert set(first) == {"memory_leak_oom"}
    tb = SummaryReader(str(SAMPLES / "memory_leak_oom/tb")).scalars
    pct = tb[tb["tag"] == "memory/rss_pct_of_budget"].sort_values("step")
    assert first["memory_leak_oom"] == int(pct[pct["value"] > 90]["step"].iloc[0]) == 225
    assert first["memory_leak_oom"] < int(pct["step"].max())  # before the last step it logged
    status = store.query("SELECT status, evidence FROM runs WHERE run_id = 'memory_leak_oom'").row(0)
    assert status[0] == "crashed" and "out of memory" in status[1]


def test_every_guide_and_built_in_rule_is_evaluable_on_the_samples(tmp_path):
    store = Store(tmp_path / "store")
    ingest_paths(store, SAMPLES)
    result = replay(store, None, None)
    assert result.skipped == {}
    assert {r.id for r in default_rules()} == set(result.evaluable)
    # an eval accuracy: only the Keras sample logs one (val_accuracy)
    assert result.evaluable["P3_eval_accuracy_stalled"] == ["keras_csvlogger_appended"]
    assert (
        min(len(runs) for rule, runs in result.evaluable.items() if rule != "P3_eval_accuracy_stalled") >= 2
    )


def test_memory_percentage_is_derived_from_reserved_and_total(tmp_path):
    """A run that logs torch.cuda-style reserved memory and the device total, no percentage."""
    from writers import tbx_scalars

    reserved = [(s, 20.0 + 0.5 * s) for s in range(60)]  # GB, creeping up to 49.5 of 50
    tbx_scalars(
        tmp_path / "r/gpu",
        {
            "gpu_memory/reserved_gb": reserved,
            "gpu_memory/total_gb": [(0, 50.0)],
            "loss": [(s, 1.0) for s in range(60)],
        },
    )
    s = Store(tmp_path / "store")
    ingest_paths(s, tmp_path / "r")
    first = fired(s, MemoryPressure())
    assert first == {"gpu": next(step for step, gb in reserved if 100 * gb / 50 > 90)}
