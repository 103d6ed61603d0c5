"""Replay: rules over stored runs, a batch of runs at a time, as they would have fired live.

Runs are loaded in batches bounded by their point count (the next batch loads while this one is
evaluated); each batch is evaluated by every rule and sweep point (`detectors.engine`), so a
backtest of many rules reads every run once. `replay` stores the alerts it finds.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from detectors.builtins import builtin_rules
from detectors.engine import evaluate
from detectors.rules import Rule, load_rule_file
from detectors.series import ReplayError, SeriesData, peer_group
from detectors.streaks import ALERT_SCHEMA
from workbench.executor import threaded_map
from workbench.store import Store, coded, reads

if TYPE_CHECKING:
    from workbench.executor import Executor

GUIDES = Path(__file__).resolve().parent / "guides.toml"
PUBLISHED = Path(__file__).resolve().parent / "published.toml"  # trainers' and services' alarms


def default_rules() -> list[Rule]:
    """The built-in detectors, the guides' rule set (detectors/guides.toml) and the trainers'
    and services' published alarms (detectors/published.toml)."""
    return builtin_rules() + load_rule_file(GUIDES) + load_rule_file(PUBLISHED)


def select_runs(store: Store, runs_glob: str | None = None) -> list[tuple[str, int]]:
    """(run_id, current points) of the runs matching the glob, in run order."""
    return store.rows(reads.run_sizes(runs_glob))


def load(store: Store, runs: list[str] | str | None = None, con=None) -> SeriesData:
    """Every current point of the given runs (a list, or a glob over run ids); `con`: a
    connection to the store to reuse (one is opened otherwise)."""
    if runs is None or isinstance(runs, str):
        runs = [r for r, _ in select_runs(store, runs)]
    runs = sorted(runs)
    points, events = coded.load(con or store.connect(), runs)
    return SeriesData(points, events, runs)


def prefetched(store: Store, groups: list[list[str]]) -> Iterator[SeriesData]:
    """SeriesData per group of runs, loading the next group while the caller works on this one."""
    if not groups:
        return
    con = store.connect()  # one connection (and integrity check) for every batch, used by one thread
    yield from threaded_map(lambda runs: load(store, runs, con), groups, 1)


def batches(
    store: Store, runs_glob: str | None, max_points: int = 4_000_000, whole_groups: bool = True
) -> list[list[str]]:
    """Runs grouped so that each batch holds at most about `max_points` points: a memory bound,
    and small enough that loading the next batch overlaps evaluating this one (a few million
    points still evaluate at full speed). With `whole_groups` (rules that compare a run with
    its peers: `needs_peers`), a batch holds whole peer groups (a group larger than the bound
    is one batch), so a peer-relative rule sees every peer of a run."""
    out: list[list[str]] = []
    cur: list[str] = []
    n = 0
    for run, points in sorted(select_runs(store, runs_glob), key=lambda rp: (peer_group(rp[0]), rp[0])):
        if cur and n + points > max_points and (not whole_groups or peer_group(run) != peer_group(cur[-1])):
            out.append(cur)
            cur, n = [], 0
        cur.append(run)
        n += points
    return out + ([cur] if cur else [])


def needs_peers(rules: list[Rule]) -> bool:
    """Whether any of the rules compares a run with its peers (then batches keep peer groups whole)."""
    return any(r.compares_peers for r in rules)


def _split(batch: list[str], size: int, whole_groups: bool) -> list[list[str]]:
    """`batch` cut into batches of about `size` runs (between peer groups only, `whole_groups`)."""
    out: list[list[str]] = [[]]
    for run in batch:
        if len(out[-1]) >= size and (not whole_groups or peer_group(run) != peer_group(out[-1][-1])):
            out.append([])
        out[-1].append(run)
    return out


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
    handed to `on_batch` first, for callers that need more of it). The rules of a batch are
    evaluated in a thread per core while the next batch loads: the window kernels and polars
    run without the GIL. Rules share the batch's cached series and leaves, and two threads that
    compute the same one get the same values."""
    parts: list[list[pl.DataFrame]] = [[] for _ in rules]
    runs_ok: list[list[str]] = [[] for _ in rules]
    errors: list[str | None] = [None] * len(rules)
    threads = max(1, min(len(rules), os.cpu_count() or 1))
    with ThreadPoolExecutor(threads, thread_name_prefix="rule") as pool:
        for data in prefetched(store, groups):
            if on_batch is not None:
                on_batch(data)
            for i, (alerts, ok, err) in enumerate(pool.map(evaluated, rules, [data] * len(rules))):
                if alerts is None:
                    errors[i] = errors[i] or err
                    continue
                parts[i].append(alerts)
                runs_ok[i] += ok
    return [
        RuleReplay(pl.concat(a) if a else pl.DataFrame(schema=ALERT_SCHEMA), ok, None if ok else err)
        for a, ok, err in zip(parts, runs_ok, errors, strict=True)
    ]


def evaluated(rule: Rule, data: SeriesData) -> tuple[pl.DataFrame | None, list[str], str | None]:
    """A rule over one batch: (alerts, runs where it was evaluable, None), or (None, [], why not)."""
    try:
        alerts, ok = evaluate(rule, data)
    except ReplayError as e:
        return None, [], str(e)
    return alerts, ok, None


ReplayTask = tuple[str, list[Rule], list[str], bool]


def replay_task(task: ReplayTask) -> tuple[list[tuple[pl.DataFrame | None, list[str], str | None]], dict]:
    """One executor task: load one batch of runs from the store at `root` and evaluate some
    rules on it. Per rule (alerts, runs where it was evaluable, error), and with `steps` the
    batch's logged steps per run (what a backtest counts false alarms against)."""
    root, rules, runs, steps = task
    data = load(Store(root), runs)
    return [evaluated(rule, data) for rule in rules], data.logged_steps() if steps else {}


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
        groups = [part for g in groups for part in _split(g, size, needs_peers(rules))]
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
            assert alerts is not None  # a rule that raised no error returned its alerts
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

    Without `rules`, the defaults. The rules not evaluable on the selection (a metric no run
    logs) are listed in `skipped` with why, the others replayed; when none of the rules the
    user gave is evaluable, that is an error. `executor`: fan the batches
    out (`replay_on`); None evaluates them here.
    """
    explicit = rules is not None
    rules = rules if rules is not None else default_rules()
    groups = batches(store, runs_glob, whole_groups=needs_peers(rules))
    if not groups:
        raise ReplayError(f"no runs match {runs_glob!r}; list them with: workbench runs")
    if executor is None:
        done = replay_batches(store, rules, groups)
    else:
        done = replay_on(executor, store, rules, groups)[0]
    skipped = {r.id: d.error for r, d in zip(rules, done, strict=True) if d.error}
    if explicit and len(skipped) == len(rules):  # nothing to replay: say why
        raise ReplayError(next(iter(skipped.values())))
    evaluable = {r.id: sorted(d.evaluable) for r, d in zip(rules, done, strict=True) if not d.error}
    alerts = pl.concat([d.alerts for d in done])
    all_runs = sorted(r for g in groups for r in g)
    result = ReplayResult(alerts.sort("run_id", "rule", "step_start", "tag"), evaluable, all_runs, skipped)
    with store.writer() as w:
        w.set_alerts([r.id for r in rules], all_runs, result.alerts)
        w.commit()
    return result
