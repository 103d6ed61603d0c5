"""Canonical metric names: which logged tags mean `loss`, `eval_loss`, `grad_norm`, `lr`, ...

`tag` always keeps the key as it was logged; the canonical name goes in the `metric` column,
resolved at query time so that editing `workbench.toml` applies to data already stored:

    [aliases]
    loss = ["my_model/train_xent", "train/*_loss"]   # globs over tags; they win over built-ins
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import duckdb

from workbench.store.sql import literal

# First match wins; patterns are matched against the lower-cased tag.
BUILTIN: list[tuple[str, str]] = [
    ("eval_loss", r"(eval|evaluation|val|valid|validation|test)[/_ -]?(lm[ _])?loss"),
    ("eval_loss", r"lm[ _-]loss[ _-]validation"),
    ("loss", r"((train|training)[/_ -]?)?(lm[ _-]|total[ _-])?loss(_step)?"),
    ("loss", r"train/samples/train_loss|epoch_loss|train/loss_step"),
    ("grad_norm", r"((train|training|optim)[/_])?(grad[_ -]?norm|gradient[_ ]norm|total_grad_norm|gnorm)"),
    ("lr", r"((train|training|optim)[/_])?(lr|learning[_ -]rate)(-?0|/group_?0|/pg0)?"),
    ("lr", r"train/samples/lr"),
    ("loss_scale", r"((train|training)[/_])?loss[_ -]scale|train/samples/loss_scale|derived/loss_scale"),
    (
        "samples_per_sec",
        r"((train|training)[/_])?samples[_ -]?per[_ -]?sec(ond)?|throughput|samples/sec(ond)?",
    ),
    ("samples_per_sec", r"(runningavg)?samplespersec"),
    ("memory_gb", r"memory/rss_gb|mem_gb|memory_gb"),  # the process's memory
    (
        "memory_allocated_gb",
        r"memallocated|memory[/_]allocated(_gb)?",
    ),  # the accelerator's (DeepSpeed, torch.cuda)
    ("memory_reserved_gb", r"(gpu_)?memory[/_ ](max_)?reserved(_gb)?|max_memory_reserved(_gb)?"),
    ("memory_total_gb", r"(gpu_)?memory[/_ ]total(_gb)?|memory/budget_gb|memory\.total"),
    (
        "memory_reserved_pct",
        r"memory/rss_pct_of_budget|(gpu_)?memory[/_ ]reserved[_ ]?(pct|percent|%)|gpu_memory/gpu reserved mem \(%\)",
    ),
    # mixture-of-experts routing (DeepSpeed-MoE, Megatron, HF Mixtral, OLMo-core names)
    ("moe_max_load", r"moe_max_load|moe/(layer_?\d+/)?max_load"),
    ("moe_mean_load", r"moe_mean_load|moe/(layer_?\d+/)?mean_load"),
    (
        "balance_loss",
        r"(moe[/_])?balance_loss|(train/)?(router_)?aux_loss|(train/)?load[ _]balancing[ _]loss",
    ),
    ("attn_entropy", r"attn(_output)?_entropy|attention[/_]entropy"),
    ("ln_input_std", r"ln_input_std(/layer_0)?"),
]


def load_user_aliases(*config_dirs: Path) -> dict[str, list[str]]:
    """`[aliases]` from `workbench.toml` in the given folders (later folders win)."""
    merged: dict[str, list[str]] = {}
    for d in config_dirs:
        f = Path(d) / "workbench.toml"
        if f.is_file():
            with f.open("rb") as fh:
                table = tomllib.load(fh).get("aliases", {})
            for metric, globs in table.items():
                merged[metric] = [globs] if isinstance(globs, str) else list(globs)
    return merged


def glob_regex(glob: str) -> str:
    """`*` any run of characters, `?` one character, everything else literal."""
    return "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in glob)


def metric_case_sql(column: str, user: dict[str, list[str]] | None = None) -> str:
    """A SQL CASE expression mapping a tag column to its canonical metric (NULL if none)."""
    arms = []
    for metric, globs in (user or {}).items():
        for g in globs:
            regex = glob_regex(g)
            arms.append(f"WHEN regexp_full_match({column}, {literal(regex)}) THEN {literal(metric)}")
    for metric, regex in BUILTIN:
        arms.append(f"WHEN regexp_full_match(lower({column}), {literal(regex)}) THEN {literal(metric)}")
    return "CASE " + " ".join(arms) + " ELSE NULL END"


def metrics_of(tags: list[str], user: dict[str, list[str]] | None = None) -> dict[str, str | None]:
    """tag -> canonical metric (None if none) of these tags, as the store's views resolve them."""
    rows = duckdb.execute(
        f"SELECT tag, {metric_case_sql('tag', user)} FROM (SELECT unnest(?::VARCHAR[]) AS tag)", [tags]
    ).fetchall()
    return dict(rows)
