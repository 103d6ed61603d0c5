"""The scale-free built-ins and the published alarms on the real runs of the diverse corpus
(tests/data/diverse): each fires on a run of the kind it targets and stays quiet on the hard
negatives (heavy clipping, warm restarts, noisy small batches, fp16 skips, a resumed run, a
recovered one-step spike); the rule language's median, mad and peer_z on real series."""

from __future__ import annotations

import tomllib

import numpy as np
import polars as pl
import pytest
from conftest import DATA, ingest_paths

from detectors.builtins import BUILTINS, ensemble_builtins
from detectors.language import Name
from detectors.replay import batches, default_rules, load, needs_peers, replay_batches, select_runs
from detectors.rules import rules_from_text
from detectors.series import peer_group
from workbench.store import Store

DIVERSE = DATA / "diverse"
LABELS: dict[str, dict] = tomllib.loads((DIVERSE / "labels.toml").read_text())["runs"]
HARD = {e["hard_negative"]: r for r, e in LABELS.items() if e.get("hard_negative")}
KIND = {e["kind"]: r for r, e in LABELS.items() if e["outcome"] == "failed"}


@pytest.fixture(scope="module")
def diverse(tmp_path_factory) -> Store:
    store = Store(tmp_path_factory.mktemp("transfer") / "store")
    ingest_paths(store, DIVERSE)
    return store


@pytest.fixture(scope="module")
def first_alarms(diverse) -> dict[str, dict[str, int]]:
    """rule id -> {run: first alarm step} for every default rule evaluable somewhere."""
    rules = default_rules()
    done = replay_batches(diverse, rules, batches(diverse, None))
    out = {}
    for rule, d in zip(rules, done, strict=True):
        if d.error is None:
            first = d.alerts.group_by("run_id").agg(pl.col("step_fired").min())
            out[rule.id] = dict(first.iter_rows())
    return out


# (rule, failure kind of the run it must catch, labelled onset, first alarm no earlier / later than onset + ...)
PINS = [
    ("loss_robust_spike", "divergence_nan", 128, -30, 0),  # the loss climbs before it is NaN
    ("grad_robust_spike", "divergence_nan", 128, -60, 0),
    ("hf_nan_filtered", "divergence_nan_filtered", 100, 0, 5),  # HF logs loss 0.0, grad_norm NaN
    ("non_finite_grad_norm", "divergence_nan_filtered", 100, 0, 0),
    ("non_finite_grad_norm", "divergence_nan", 128, -10, 0),  # past the GradScaler's first skips
    ("clip_saturation", "loss_spike", 82, 0, 20),
    ("memory_jump", "memory_blowup", 125, 25, 50),  # logged every 25 steps: the third point up
    ("clip_saturation", "divergence_nan", 128, -10, 10),  # a rise of 0.8: a few steps past the first NaN
    ("zclip", "loss_spike", 82, -5, 5),
    ("lightning_spike", "loss_spike_unrecovered", 102, 0, 0),
    ("wandb_threshold", "loss_spike_unrecovered", 102, 0, 0),
    ("wandb_peer_z", "loss_spike_unrecovered", 102, 0, 0),
    ("guides_loss_zero", "divergence_nan_filtered", 100, 0, 5),
    ("guides_eval_not_falling", "overfitting", 20, 100, 200),
]


@pytest.mark.parametrize("rule, kind, onset, lo, hi", PINS, ids=[f"{p[0]}-{p[1]}" for p in PINS])
def test_rule_fires_on_a_real_run_of_its_kind(first_alarms, rule, kind, onset, lo, hi):
    run = KIND[kind]
    assert LABELS[run]["onset"] == onset
    assert run in first_alarms[rule], f"{rule} never fired on {run}"
    assert onset + lo <= first_alarms[rule][run] <= onset + hi


@pytest.mark.parametrize("det", ensemble_builtins(), ids=lambda d: d.id)
def test_ensemble_members_stay_quiet_on_the_hard_negatives(first_alarms, det):
    """Heavy clipping (max_norm 0.25 clips most steps), warm restarts, noisy batches of 2, fp16
    skips (a GradScaler started at 2^24 skips its first steps), a resumed DeepSpeed run and a
    one-step spike from a corrupt batch: no member of the ensemble fires on any of them."""
    fired = set(first_alarms.get(det.id, {}))
    assert not fired & set(HARD.values()), f"{det.id} fired on {sorted(fired & set(HARD.values()))}"


def test_the_one_step_spike_is_real_and_single_point_rules_see_it(diverse, first_alarms):
    """The recovered spike is no artefact: a one-point 5σ rule fires on it; the shipped spike
    rules need two points (a failure's loss stays up) and stay quiet."""
    from detectors.builtins.loss import SigmaSpike

    run = HARD["recovered_spike"]
    (one,) = replay_batches(diverse, [SigmaSpike(for_steps=1).rule()], batches(diverse, None))
    assert one.alerts.filter(pl.col("run_id") == run)["step_fired"].to_list() == [99]
    assert run not in first_alarms.get("loss_spike", {}) and run not in first_alarms.get(
        "loss_robust_spike", {}
    )


def test_heavy_clipping_no_longer_reads_as_saturation(diverse):
    """The level form (share ≥ 20 % over 100 steps at max_norm 1.0) fired on the heavily clipped
    healthy run; the change in the share stays quiet there and fires on the diverging run."""
    level = rules_from_text(
        '[[rule]]\nid = "level"\nwhen = "grad_norm >= 1.0 and mean(grad_norm, 5) >= 1.0"\n'
    )
    done = replay_batches(diverse, level, batches(diverse, None))
    assert HARD["clip_0.25"] in set(done[0].alerts["run_id"])  # it clips on most steps
    clip = next(d for d in BUILTINS if d.id == "clip_saturation")
    (d,) = replay_batches(diverse, [clip.rule()], batches(diverse, None))
    assert HARD["clip_0.25"] not in set(d.alerts["run_id"])


def test_published_alarms_carry_their_origin():
    origins = {r.id: r.origin for r in default_rules()}
    assert origins["zclip"] == "zclip" and origins["olmo_spike"] == "olmo-core"
    assert (
        origins["llmfoundry_loss_spike"] == "llm-foundry"
        and origins["megatron_unexpectedly_large"] == "megatron"
    )
    assert origins["lightning_spike"] == "lightning"
    assert {origins[i] for i in ("wandb_threshold", "wandb_change", "wandb_peer_z")} == {"wandb"}
    assert (
        origins["guides_attention_entropy_drop"] == "guides" and origins["loss_robust_spike"] == "workbench"
    )
    ensemble = {d.id for d in ensemble_builtins()}
    assert "zclip" not in ensemble and "loss_robust_spike" in ensemble


def test_median_mad_and_peer_z_on_real_series(diverse):
    """median/mad are the numpy figures of the window before each step; peer_z compares a run
    with the other runs of its folder at the same step."""
    run = HARD["recovered_spike"]
    rules = rules_from_text(
        '[[rule]]\nid = "robust"\nwhen = "loss - median(loss, 10) > 6 * 1.4826 * mad(loss, 10)"\n'
        '[[rule]]\nid = "peer"\nwhen = "peer_z(loss) > 3"\n'
    )
    done = replay_batches(diverse, rules, batches(diverse, None))
    robust = done[0].alerts.filter(pl.col("run_id") == run)
    assert robust["step_fired"].to_list()[:1] == [99]  # the corrupt batch
    data = load(diverse, [run])
    loss = data.series(Name("loss", False, 0))["value"].to_numpy()
    w = loss[89:99]  # the 10 values before step 99 (logged every step from 0)
    z = (loss[99] - np.median(w)) / (1.4826 * np.median(np.abs(w - np.median(w))))
    assert z > 6
    peer_runs = set(done[1].alerts["run_id"])
    assert peer_runs <= {r for r in LABELS if r.startswith("loop/")} | {
        r for r in LABELS if r.startswith("hf/")
    }
    assert KIND["loss_spike_unrecovered"] in peer_runs  # its loss leaves the other loop runs'


def test_batches_keep_peer_groups_whole_only_for_rules_that_read_peers(diverse):
    """The bound on a batch's points cuts a folder of runs (one peer group) only when no rule
    compares a run with its peers: a plain rule finds the same alerts in small batches as in
    one, and with peer_z each folder stays in one batch."""
    peer, plain = rules_from_text(
        '[[rule]]\nid = "peer"\nwhen = "peer_z(loss) > 3"\n'
        '[[rule]]\nid = "robust"\nwhen = "loss - median(loss, 10) > 6 * 1.4826 * mad(loss, 10)"\n'
    )
    assert peer.compares_peers and not plain.compares_peers
    assert needs_peers([plain, peer]) and not needs_peers([plain])
    small = 2 * max(points for _, points in select_runs(diverse))  # two or three runs a batch

    def folders_cut(groups: list[list[str]]) -> set[str]:
        seen = [{peer_group(r) for r in g} for g in groups]
        return {f for f in set().union(*seen) if sum(f in s for s in seen) > 1}

    whole = batches(diverse, None, small, whole_groups=True)
    cut = batches(diverse, None, small, whole_groups=False)
    assert folders_cut(whole) == set() and "loop" in folders_cut(cut)
    assert sorted(r for g in cut for r in g) == sorted(r for g in whole for r in g)
    one = replay_batches(diverse, [plain], batches(diverse, None))[0].alerts.sort("run_id", "step_start")
    assert one.height > 0
    assert replay_batches(diverse, [plain], cut)[0].alerts.sort("run_id", "step_start").equals(one)
