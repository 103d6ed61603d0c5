"""Canonical metrics by the meaning of a tag's words: case, separators,
train/val/eval parts, `_step`/`_epoch` suffixes, with the alias table as the override; tags
that look like a loss or a gradient norm but map to nothing are listed. Real files: the torch
SummaryWriter tutorial's names written by tests/data/real/custom_names/train_custom.py, and a
real Lightning CSVLogger file (tests/data/real/defects/d03_gz)."""

from __future__ import annotations

import duckdb
import pytest
from conftest import cli
from real_counts import assert_matches, expected, real_tree_store

from workbench.store import aliases


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return real_tree_store(
        tmp_path_factory,
        {"tutorial": "custom_names/tb_tutorial_names", "lightning": "defects/d03_gz/lightning_version_0"},
    )


def metric_of(*tags: str) -> dict[str, str | None]:
    sql = f"SELECT tag, {aliases.metric_case_sql('tag')} FROM (SELECT unnest(?::VARCHAR[]) AS tag)"
    return dict(duckdb.execute(sql, [list(tags)]).fetchall())


def test_the_summary_writer_tutorial_names_map_to_metrics(store):
    metrics = dict(store.query("SELECT DISTINCT tag, metric FROM scalars WHERE run_id = 'tutorial'").rows())
    assert metrics == {
        "Loss/train": "loss",
        "Loss/val": "eval_loss",
        "Grad/total_norm": "grad_norm",
        "training/loss_step": "loss",
        "LR/group0": "lr",
    }
    assert_matches(store, "tutorial", expected("custom_names/tb_tutorial_names"))
    assert store.query("SELECT count(*) n FROM unmapped_tags WHERE run_id = 'tutorial'")["n"][0] == 0


def test_meaning_whatever_the_case_separators_and_parts():
    assert metric_of(
        "Loss/Train", "TRAIN_LOSS", "train-loss", "loss/train_step", "train/batch_loss", "epoch_loss",
        "Loss/Val", "val/loss", "validation/epoch_loss", "eval-loss", "test_loss", "val_loss_epoch",
        "Grad/total_norm", "gradNorm", "optim/total_grad_norm", "grad-norm", "grad_2.0_norm_total",
    ) == {
        "Loss/Train": "loss", "TRAIN_LOSS": "loss", "train-loss": "loss", "loss/train_step": "loss",
        "train/batch_loss": "loss", "epoch_loss": "loss",
        "Loss/Val": "eval_loss", "val/loss": "eval_loss", "validation/epoch_loss": "eval_loss",
        "eval-loss": "eval_loss", "test_loss": "eval_loss", "val_loss_epoch": "eval_loss",
        "Grad/total_norm": "grad_norm", "gradNorm": "grad_norm", "optim/total_grad_norm": "grad_norm",
        "grad-norm": "grad_norm", "grad_2.0_norm_total": "grad_norm",
    }  # fmt: skip
    # other quantities stay apart: an epoch mean beside a `_step` series, per-token NLL, a
    # per-layer norm, a perplexity, a loss scale
    assert metric_of(
        "train_loss_epoch", "val_loss_step", "nll_loss", "grad_norm/layer_0", "val_ppl", "loss scale",
        "grad_2.0_norm/layer.0.weight",
    ) == {
        "train_loss_epoch": None, "val_loss_step": None, "nll_loss": None, "grad_norm/layer_0": None,
        "val_ppl": None, "loss scale": "loss_scale", "grad_2.0_norm/layer.0.weight": None,
    }  # fmt: skip


def test_tags_that_look_like_a_loss_but_map_to_nothing_are_listed(store):
    unmapped = store.query(
        "SELECT tag, looks_like, points FROM unmapped_tags WHERE run_id = 'lightning'"
    ).rows()
    assert unmapped == [
        (
            "train_loss_epoch",
            "loss",
            expected("defects/d03_gz/lightning_version_0/metrics.csv.gz")["train_loss_epoch"]["points"],
        )
    ]
    out = cli("tags", "lightning", "--format", "csv", store=store).stdout.splitlines()
    assert out[0].split(",")[-1] == "looks_like"
    assert next(line for line in out if line.startswith("train_loss_epoch,")).endswith(",loss")
    assert (
        next(line for line in out if line.startswith("train_loss_step,"))
        == "train_loss_step,loss,2814,49,140699,0,"
    )


def test_the_alias_table_overrides_the_meaning(store, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # workbench.toml in the working directory
    (tmp_path / "workbench.toml").write_text(
        '[aliases]\nloss = ["train_loss_epoch"]\neval_loss = ["Loss/train"]\n'
    )
    metrics = dict(store.query("SELECT DISTINCT tag, metric FROM scalars").rows())
    assert metrics["train_loss_epoch"] == "loss" and metrics["Loss/train"] == "eval_loss"
    assert store.query("SELECT count(*) n FROM unmapped_tags")["n"][0] == 0
