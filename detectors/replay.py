"""Replay: rules over stored runs, a batch of runs at a time, as they would have fired live.

Runs are loaded in batches bounded by their point count (the next batch loads while this one is
evaluated); each batch is evaluated by every rule and sweep point (`detectors.engine`), so a
backtest of many rules reads every run once. `replay` stores the alerts it finds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import polars as pl
import pyarrow as pa

from detectors.builtins import builtin_rules
from detectors.engine import evaluate
from detectors.rules import Rule, load_rule_file
from detectors.series import Coded, ReplayError, SeriesData
from detectors.streaks import ALERT_SCHEMA
from workbench.store import Store

if TYPE_CHECKING:
    from workbench.executor import Executor

GUIDES = Path(__file__).resolve().parent / "guides.toml"


def default_rules() -> list[Rule]:
    """The built-in detectors and the guides' rule set (detectors/guides.toml)."""
    return builtin_rules() + load_rule_file(GUIDES)


def select_runs(store: Store, runs_glob: str | None = None) -> list[tuple[str, int]]:
    """(run_id, current points) of the runs matching the glob, in run order."""
    con = store.connect()
    return con.execute(
        "SELECT run_id, coalesce(points, 0) FROM runs WHERE ? IS NULL OR run_id GLOB ? ORDER BY run_id",
        [runs_glob, runs_glob],
    ).fetchall()


# runs whose current points need the `scalars` view: a chunk's points reach past where a later
# chunk of the same run, source and tag starts (a resume), or a tag logged by several sources
RANKED_RUNS = """
    SELECT c.run_id FROM _cutoffs k JOIN _chunk_tags ct USING (chunk_id, tag) JOIN _chunks c USING (chunk_id)
    WHERE k.cutoff <= ct.max_step AND list_contains(?1, c.run_id)
    UNION SELECT run_id FROM _multi_source WHERE list_contains(?1, run_id)"""


# per direct run, the tags of a metric whose sources agree, with their source's precedence: the
# `scalars` view keeps one row per step of them (the strongest source's), and so does `load`
AGREEING_TAGS = """
    SELECT g.run_id, g.tag, g.metric, min(coalesce(s.precedence, 1000000)) AS precedence
    FROM _agreeing g JOIN _chunks c ON c.run_id = g.run_id JOIN _chunk_tags ct ON ct.chunk_id = c.chunk_id AND ct.tag = g.tag
    LEFT JOIN _sources s ON s.source = c.source
    WHERE list_contains(?, g.run_id) GROUP BY g.run_id, g.tag, g.metric
    ORDER BY g.run_id, g.metric, starts_with(g.tag, 'derived/'), precedence, g.tag"""


def _agreeing_kept(groups: list[tuple], at: dict[str, int], tags: list[str], rid, tid, step) -> np.ndarray:
    """Which of these points are current when sources agree on a metric (`groups`, rows of
    AGREEING_TAGS in rank order): at a step that several tags of one group log, the first
    tag's point only, as the `scalars` view keeps it (a mask; all True without groups)."""
    keep = np.ones(len(rid), bool)
    if not groups:
        return keep
    tag_at = {t: i for i, t in enumerate(tags)}
    group_ids: dict[tuple[str, str], int] = {}
    members, group_of, rank = [], [], []
    for i, (run, tag, metric, _) in enumerate(groups):
        members.append(at[run] * len(tags) + tag_at[tag])
        group_of.append(group_ids.setdefault((run, metric), len(group_ids)))
        rank.append(i)
    order = np.argsort(members)
    members_a = np.asarray(members, np.int64)[order]
    group_a, rank_a = np.asarray(group_of, np.int64)[order], np.asarray(rank, np.int64)[order]
    codes = rid.astype(np.int64) * len(tags) + tid
    idx = np.flatnonzero(np.isin(codes, members_a))
    pos = np.searchsorted(members_a, codes[idx])
    g, r, s = group_a[pos], rank_a[pos], step[idx]
    by = np.lexsort((r, s, g))  # by group, step, then rank: the first of a (group, step) is kept
    gs, ss = g[by], s[by]
    first = np.r_[True, (gs[1:] != gs[:-1]) | (ss[1:] != ss[:-1])] if len(by) else np.zeros(0, bool)
    keep[idx[by[~first]]] = False
    return keep


def _enum(names: list[str]) -> str:
    """A DuckDB ENUM type of these names: a column cast to it comes back as dictionary codes."""
    return "ENUM(" + ", ".join("'" + n.replace("'", "''") + "'" for n in names) + ")" if names else "VARCHAR"


def _codes(column: pa.ChunkedArray, names: list[str]) -> np.ndarray:
    """Indices into `names` of a dictionary column (each chunk's dictionary mapped onto them)."""
    if not len(column):
        return np.zeros(0, np.int32)
    at = {n: i for i, n in enumerate(names)}
    parts = []
    for chunk in column.chunks:
        mapping = np.array([at[n] for n in chunk.dictionary.to_pylist()] or [0], np.int32)
        parts.append(mapping[chunk.indices.to_numpy(zero_copy_only=False)])
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)


def load(store: Store, runs: list[str] | str | None = None, con=None) -> SeriesData:
    """Every current point of the given runs (a list, or a glob over run ids); `con`: a
    connection to the store to reuse (one is opened otherwise)."""
    if runs is None or isinstance(runs, str):
        runs = [r for r, _ in select_runs(store, runs)]
    runs = sorted(runs)
    con = con or store.connect()
    # runs where no point of one file is superseded by another file's, and no tag is logged by
    # two sources: their current points are the parts' rows not superseded inside their chunk
    # (less an agreeing source's duplicates of a metric), read without the `scalars` view's
    # ranking; the others through it
    ranked = sorted(r for (r,) in con.execute(RANKED_RUNS, [runs]).fetchall())
    direct = [r for r in runs if r not in set(ranked)]
    tag_rows = con.execute(
        "SELECT DISTINCT ct.tag, m.metric FROM _chunk_tags ct JOIN _chunks c USING (chunk_id) "
        "LEFT JOIN _tag_metric m USING (tag) WHERE list_contains(?, c.run_id) ORDER BY ct.tag",
        [runs],
    ).fetchall()
    tags = [t for t, _ in tag_rows]
    # tags as ENUM codes and runs by chunk id: no per-point string reaches Python
    at = {r: i for i, r in enumerate(runs)}
    chunks = sorted(
        (c, at[r])
        for c, r in con.execute(
            "SELECT chunk_id, run_id FROM _chunks WHERE list_contains(?, run_id)", [direct]
        ).fetchall()
    )
    parts = con.sql(
        f"SELECT chunk_id, tag::{_enum(tags)} AS tag, step, value FROM _parts "
        "WHERE NOT local_superseded AND list_contains(?, run_id)",
        params=[direct],
    ).to_arrow_table()
    chunk_ids = np.array([c for c, _ in chunks], np.int64)
    chunk_run = np.array([r for _, r in chunks], np.int32)
    d_rid = chunk_run[np.searchsorted(chunk_ids, parts["chunk_id"].to_numpy())]
    d_tid, d_step, d_value = _codes(parts["tag"], tags), parts["step"].to_numpy(), parts["value"].to_numpy()
    groups = con.execute(AGREEING_TAGS, [direct]).fetchall()
    if groups:
        kept = _agreeing_kept(groups, at, tags, d_rid, d_tid, d_step)
        d_rid, d_tid, d_step, d_value = d_rid[kept], d_tid[kept], d_step[kept], d_value[kept]
    rid, tid, step, value = [d_rid], [d_tid], [d_step], [d_value]
    if ranked:
        view = con.sql(
            f"SELECT run_id::{_enum(runs)} AS run_id, tag::{_enum(tags)} AS tag, step, value FROM scalars "
            "WHERE list_contains(?, run_id)",
            params=[ranked],
        ).to_arrow_table()
        rid.append(_codes(view["run_id"], runs))
        tid.append(_codes(view["tag"], tags))
        step.append(view["step"].to_numpy())
        value.append(view["value"].to_numpy())

    def cat(arrays):  # (no copy of a single array)
        return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)

    coded = Coded(runs, tags, [m for _, m in tag_rows], cat(rid), cat(tid), cat(step), cat(value))
    ev = con.sql(
        "SELECT run_id, step, kind, attrs FROM events WHERE list_contains(?, run_id)", params=[runs]
    ).pl()
    return SeriesData(coded, ev, runs)


def prefetched(store: Store, groups: list[list[str]]) -> Iterator[SeriesData]:
    """SeriesData per group of runs, loading the next group while the caller works on this one."""
    if not groups:
        return
    con = store.connect()  # one connection (and integrity check) for every batch, used by one thread
    with ThreadPoolExecutor(1, thread_name_prefix="load") as pool:
        nxt = pool.submit(load, store, groups[0], con)
        for i in range(len(groups)):
            data = nxt.result()
            nxt = pool.submit(load, store, groups[i + 1], con) if i + 1 < len(groups) else None
            yield data


def batches(store: Store, runs_glob: str | None, max_points: int = 4_000_000) -> list[list[str]]:
    """Runs grouped so that each batch holds at most about `max_points` points: a memory bound,
    and small enough that loading the next batch overlaps evaluating this one (a few million
    points still evaluate at full speed)."""
    out, cur, n = [], [], 0
    for run, points in select_runs(store, runs_glob):
        if cur and n + points > max_points:
            out.append(cur)
            cur, n = [], 0
        cur.append(run)
        n += points
    return out + ([cur] if cur else [])


@dataclass
class ReplayResult:
    alerts: pl.DataFrame
    evaluable: dict[str, list[str]]  # rule id -> runs where it could be evaluated
    runs: list[str]
    skipped: dict[str, str]  # default rules not evaluable on this selection -> why

    def summary(self) -> pl.DataFrame:
        """Per evaluable rule: runs_evaluable, alerts, runs_alerted, first_fired."""
        by_rule = self.alerts.group_by("rule").agg(
            alerts=pl.len(), runs_alerted=pl.col("run_id").n_unique(), first_fired=pl.col("step_fired").min()
        )
        evaluable = pl.DataFrame(
            {"rule": list(self.evaluable), "runs_evaluable": [len(v) for v in self.evaluable.values()]},
            schema={"rule": pl.String, "runs_evaluable": pl.Int64},
        )
        return evaluable.join(by_rule, on="rule", how="left").with_columns(
            pl.col("alerts", "runs_alerted").fill_null(0)
        )


@dataclass
class RuleReplay:
    """One rule over a selection: its alerts, where it could be evaluated, and why not elsewhere."""

    alerts: pl.DataFrame
    evaluable: list[str]
    error: str | None = None


def replay_batches(
    store: Store,
    rules: list[Rule],
    groups: list[list[str]],
    on_batch: Callable[[SeriesData], None] | None = None,
) -> list[RuleReplay]:
    """Every rule over every batch of runs; each batch is loaded once for all of them (and
    handed to `on_batch` first, for callers that need more of it)."""
    parts: list[list[pl.DataFrame]] = [[] for _ in rules]
    runs_ok: list[list[str]] = [[] for _ in rules]
    errors: list[str | None] = [None] * len(rules)
    for data in prefetched(store, groups):
        if on_batch is not None:
            on_batch(data)
        for i, rule in enumerate(rules):
            try:
                alerts, ok = evaluate(rule, data)
            except ReplayError as e:
                errors[i] = errors[i] or str(e)
                continue
            parts[i].append(alerts)
            runs_ok[i] += ok
    return [
        RuleReplay(pl.concat(a) if a else pl.DataFrame(schema=ALERT_SCHEMA), ok, None if ok else err)
        for a, ok, err in zip(parts, runs_ok, errors, strict=True)
    ]


ReplayTask = tuple[str, list[Rule], list[str], bool]


def replay_task(task: ReplayTask) -> tuple[list[tuple[pl.DataFrame | None, list[str], str | None]], dict]:
    """One executor task: load one batch of runs from the store at `root` and evaluate some
    rules on it. Per rule (alerts, runs where it was evaluable, error), and with `steps` the
    batch's logged steps per run (what a backtest counts false alarms against)."""
    root, rules, runs, steps = task
    data = load(Store(root), runs)
    out = []
    for rule in rules:
        try:
            alerts, ok = evaluate(rule, data)
        except ReplayError as e:
            out.append((None, [], str(e)))
            continue
        out.append((alerts, ok, None))
    return out, data.logged_steps() if steps else {}


def replay_on(
    executor: Executor, store: Store, rules: list[Rule], groups: list[list[str]], steps: bool = False
) -> tuple[list[RuleReplay], dict[str, np.ndarray]]:
    """`replay_batches` fanned out through `executor`: a task per run batch x rule chunk, the
    batches cut finer and the rules into chunks until every worker has a few tasks. Results
    are put together in run order, so they equal `replay_batches`' (evaluation is per run).
    With `steps`, also the logged steps per run."""
    want = 2 * executor.workers
    runs = [r for g in groups for r in g]
    if len(groups) < want:  # finer batches: each still within the memory bound of `batches`
        size = max(1, math.ceil(len(runs) / want))
        groups = [g[i : i + size] for g in groups for i in range(0, len(g), size)]
    n_chunks = min(len(rules), max(1, math.ceil(want / len(groups))))
    chunk = math.ceil(len(rules) / n_chunks) if rules else 1
    chunks = [rules[i : i + chunk] for i in range(0, len(rules), chunk)]
    root = str(store.root)
    tasks = [(root, c, g, steps and k == 0) for g in groups for k, c in enumerate(chunks)]
    parts: list[list[pl.DataFrame]] = [[] for _ in rules]
    runs_ok: list[list[str]] = [[] for _ in rules]
    errors: list[str | None] = [None] * len(rules)
    logged: dict[str, np.ndarray] = {}
    for n, (out, got) in enumerate(executor.map(replay_task, tasks)):
        logged |= got
        first = (n % len(chunks)) * chunk
        for i, (alerts, ok, err) in enumerate(out, start=first):
            if err is not None:
                errors[i] = errors[i] or err
                continue
            parts[i].append(alerts)
            runs_ok[i] += ok
    done = [
        RuleReplay(pl.concat(a) if a else pl.DataFrame(schema=ALERT_SCHEMA), ok, None if ok else err)
        for a, ok, err in zip(parts, runs_ok, errors, strict=True)
    ]
    return done, logged


def replay(
    store: Store, rules: list[Rule] | None, runs_glob: str | None, executor: Executor | None = None
) -> ReplayResult:
    """Replay (each rule at its own parameters) over the selected runs and store the alerts.

    Without `rules`, the defaults; those not evaluable on the selection are listed in `skipped`.
    A rule the user gave that is evaluable nowhere is an error. `executor`: fan the batches
    out (`replay_on`); None evaluates them here.
    """
    explicit = rules is not None
    rules = rules if explicit else default_rules()
    groups = batches(store, runs_glob)
    if not groups:
        raise ReplayError(f"no runs match {runs_glob!r}; list them with: workbench runs")
    if executor is None:
        done = replay_batches(store, rules, groups)
    else:
        done = replay_on(executor, store, rules, groups)[0]
    skipped = {r.id: d.error for r, d in zip(rules, done, strict=True) if d.error}
    if explicit and skipped:
        raise ReplayError(next(iter(skipped.values())))
    evaluable = {r.id: d.evaluable for r, d in zip(rules, done, strict=True) if not d.error}
    alerts = pl.concat([d.alerts for d in done])
    all_runs = [r for g in groups for r in g]
    result = ReplayResult(alerts.sort("run_id", "rule", "step_start"), evaluable, all_runs, skipped)
    with store.writer() as w:
        w.set_alerts([r.id for r in rules], all_runs, result.alerts)
        w.commit()
    return result
