"""What the run comparer shows of two or more runs, as plain tables (no Streamlit here): their
config side by side (a key per row, a run per column, as W&B's run comparer lays it out), the
tags every one of them logged, and their alerts counted per rule side by side."""

from __future__ import annotations

import polars as pl

KEY = "config key"
MISSING = "—"  # a key the run's config lacks


def _cell(v: object) -> str:
    if v is None:
        return MISSING
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return str(int(v))  # hparams store every number as a float: 16.0 is 16
    return str(v)


def config_diff(configs: pl.DataFrame, runs: list[str], all_keys: bool = False) -> pl.DataFrame:
    """The config keys of `runs` as rows and the runs as columns (in the order given), each
    value as text; only the keys whose values differ between the runs that logged a config
    unless `all_keys` (a key one of them lacks differs, as W&B counts it; a run without any
    config is a column of MISSING that makes no key differ). Keys none of them has are left out."""
    by_run = {r: row for r, row in zip(configs["run_id"], configs.drop("run_id").rows(), strict=True)}
    keys = configs.columns[1:]
    rows: list[list[str]] = []
    for i, key in enumerate(keys):
        cells = [_cell(by_run[r][i]) if r in by_run else MISSING for r in runs]
        logged = {c for r, c in zip(runs, cells, strict=True) if r in by_run}
        if logged <= {MISSING}:
            continue
        if all_keys or len(logged) > 1:
            rows.append([key, *cells])
    names = [KEY, *(r if r != KEY else f"{r} (run)" for r in runs)]
    return pl.DataFrame(rows, schema=dict.fromkeys(names, pl.String), orient="row")


def without_config(configs: pl.DataFrame, runs: list[str]) -> list[str]:
    """The runs of `runs` that logged no config."""
    have = set(configs["run_id"].to_list())
    return [r for r in runs if r not in have]


def shared_tags(tags: pl.DataFrame, n_runs: int) -> list[str]:
    """The tags every one of `n_runs` runs logged (`tags` as `data.tags` gives them: a `runs`
    count per tag), in its order (the loss first)."""
    return tags.filter(pl.col("runs") >= n_runs)["tag"].to_list()


def alert_counts(alerts: pl.DataFrame, runs: list[str]) -> pl.DataFrame:
    """Alerts per rule (rows) and run (columns, in the order given; 0 where a run has none of a
    rule's), rules by their total, most first."""
    names = [r if r != "rule" else "rule (run)" for r in runs]
    if alerts.is_empty():
        return pl.DataFrame(schema={"rule": pl.String, **dict.fromkeys(names, pl.UInt32)})
    counts = alerts.group_by("rule", "run_id").len()
    out = pl.DataFrame({"rule": sorted(counts["rule"].unique().to_list())})
    for run, name in zip(runs, names, strict=True):
        mine = counts.filter(pl.col("run_id") == run).select("rule", pl.col("len").alias(name))
        out = out.join(mine, on="rule", how="left").with_columns(pl.col(name).fill_null(0).cast(pl.UInt32))
    total = pl.sum_horizontal(names) if names else pl.lit(0)
    return out.sort(total, "rule", descending=[True, False])
