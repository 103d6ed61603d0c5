"""Every question asked of the store, one function each: the only SQL outside the views that
reads the store, and the only place where the private views (`_chunks`, `_parts`, `_points`,
...) are named outside `views.py`.

A question is a `Query`: SQL text over one generation's views and its parameters. `Store`'s
read methods (`store.runs()`, `store.scalars(...)`, ...) run them into polars frames, the CLI
renders the same `Query` with DuckDB (`workbench.store.query.run_query`), the app runs it on its
cached connection, and the detectors, the watch and ingest's derived tables run theirs on the
connection they hold. Loaders that need several statements (a replay's integer-coded points)
live in `workbench.store.coded`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from workbench.errors import WorkbenchError

if TYPE_CHECKING:
    import polars as pl


class QueryError(WorkbenchError):
    """A query DuckDB refused, or one that would change the store."""


def one_select(sql: str, con: duckdb.DuckDBPyConnection) -> None:
    """QueryError unless `sql` is exactly one SELECT (the store is read-only to queries); parsed
    by `con` (DuckDB's module-level parser starts a database of its own: 20-40 ms of a command)."""
    try:
        stmts = con.extract_statements(sql)
    except duckdb.Error as e:
        raise QueryError(str(e)) from None
    if len(stmts) != 1:
        raise QueryError("give exactly one SQL statement")
    if stmts[0].type != duckdb.StatementType.SELECT:
        raise QueryError(
            f"only SELECT queries are allowed (got {stmts[0].type.name}); the store is read-only here"
        )


# errors in the query text itself; anything else may come from a damaged file
_QUERY_FAULTS = (
    duckdb.ParserException,
    duckdb.BinderException,
    duckdb.CatalogException,
    duckdb.ConversionException,
    duckdb.OutOfRangeException,
)


def query_error(root: Path, e: duckdb.Error) -> QueryError:
    """The QueryError for what DuckDB said about a query on the store at `root`."""
    message = str(e).strip()
    if not isinstance(e, _QUERY_FAULTS):
        message += (
            f"\n(if the query is not at fault, the store may be damaged: workbench check --store {root})"
        )
    return QueryError(message)


@dataclass(frozen=True)
class Query:
    """One read-only statement over the store's views, with its parameters (a list for `?`,
    a dict for `$name`)."""

    sql: str
    params: list[Any] | dict[str, Any] = field(default_factory=list)

    def on(self, con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyRelation:
        """The statement run on `con` (a store connection or a cursor of one)."""
        return con.sql(self.sql, params=self.params) if self.params else con.sql(self.sql)

    def frame(self, con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
        return self.on(con).pl()

    def rows(self, con: duckdb.DuckDBPyConnection) -> list[tuple]:
        return self.on(con).fetchall()


# ---- runs ---------------------------------------------------------------------------------
# what `workbench runs` lists
RUN_SUMMARY = (
    "run_id",
    "status",
    "formats",
    "files",
    "segments",
    "points",
    "tags",
    "first_step",
    "last_step",
    "problems",
    "evidence",
    "consistency",
)


def runs(columns: Sequence[str] = ("*",)) -> Query:
    """The `runs` view (these columns), by run id. The columns are qualified, so that `files`
    and `problems` read as its columns, not as the views of those names (`views.needed`)."""
    return Query(f"SELECT {', '.join('runs.' + c for c in columns)} FROM runs ORDER BY run_id")


def run_count(run_id: str) -> Query:
    """1 when the store holds `run_id`, else 0."""
    return Query("SELECT count(*) FROM runs WHERE run_id = ?", [run_id])


def step_range(run_id: str) -> Query:
    """(first_step, last_step) of one run's points (nulls: none)."""
    return Query("SELECT first_step, last_step FROM runs WHERE run_id = ?", [run_id])


def run_sizes(runs_glob: str | None = None) -> Query:
    """(run_id, current points) of the runs whose id matches the glob (all: None), by run id."""
    return Query(
        "SELECT run_id, coalesce(points, 0) FROM runs WHERE ? IS NULL OR run_id GLOB ? ORDER BY run_id",
        [runs_glob, runs_glob],
    )


def run_starts() -> Query:
    """(run_id, epoch seconds its first file's first record was written) of every run."""
    return Query("SELECT run_id, epoch(started) FROM runs ORDER BY run_id")


def run_configs() -> Query:
    """(run_id, config as JSON text) of the runs with a config."""
    return Query("SELECT run_id, config FROM runs WHERE config IS NOT NULL ORDER BY run_id")


def run_table() -> Query:
    """Every run as the app's runs page lists it: status, label, last loss (the value at the last
    step of its loss tags, read from those steps alone), alerts (and those a watch raised),
    config (JSON text)."""
    return Query("""
        WITH a AS (SELECT run_id, count(*) AS alerts, count(*) FILTER (WHERE source = 'live') AS live_alerts
                   FROM alerts GROUP BY run_id),
             ends AS (SELECT run_id, tag, max(last_step) AS step FROM file_tags
                      WHERE tag IN (SELECT tag FROM _tag_metric WHERE metric = 'loss') GROUP BY ALL),
             l AS (SELECT s.run_id, arg_max(s.value, s.step) AS last_loss FROM scalars s
                   SEMI JOIN ends e ON e.run_id = s.run_id AND e.tag = s.tag AND e.step = s.step
                   WHERE s.step IN (SELECT step FROM ends) GROUP BY s.run_id)
        SELECT r.run_id, r.status, lb.outcome AS label, lb.onset, lb.kind AS failure, lb.source AS label_source,
               r.formats, r.points, r.first_step, r.last_step, l.last_loss, coalesce(a.alerts, 0) AS alerts,
               coalesce(a.live_alerts, 0) AS live_alerts, epoch(r.started) AS started, r.segments,
               r.problems, r.evidence, r.config
        FROM runs r LEFT JOIN labels lb USING (run_id) LEFT JOIN a USING (run_id) LEFT JOIN l USING (run_id)
        ORDER BY r.run_id""")


# ---- tags ---------------------------------------------------------------------------------
def tags(run_id: str) -> Query:
    """The tags of one run: canonical metric, current points, step range, NaN/Inf points
    (counted over the run's current points), and for a tag that maps to no metric the one it
    looks like (`loss`, `grad_norm`), which a workbench.toml alias would give it."""
    from workbench.store.aliases import looks_like_sql

    return Query(
        "SELECT tag, metric, count(*) AS points, min(step) AS first_step, max(step) AS last_step, "
        "count(*) FILTER (WHERE NOT isfinite(value)) AS non_finite, "
        f"{looks_like_sql('tag', 'metric')} AS looks_like "
        "FROM scalars WHERE run_id = ? GROUP BY tag, metric ORDER BY tag",
        [run_id],
    )


def logged_tags(run_ids: list[str]) -> Query:
    """(tag, metric, runs) of the tags these runs log, from the stores' index of each file's
    tags (no point is read): how many of the runs log each."""
    return Query(
        "SELECT ft.tag, m.metric, count(DISTINCT ft.run_id)::UINTEGER AS runs "
        "FROM file_tags ft LEFT JOIN _tag_metric m USING (tag) "
        "WHERE list_contains(?, ft.run_id) GROUP BY ft.tag, m.metric",
        [run_ids],
    )


def multi_source_metric_runs(run_ids: list[str]) -> Query:
    """Those of the runs where several sources log one canonical metric (derived series
    aside), from the chunk lists: no point is read."""
    return Query(
        """SELECT DISTINCT run_id FROM (
               SELECT c.run_id FROM _chunk_tags ct JOIN _chunks c USING (chunk_id) JOIN _tag_metric m USING (tag)
               WHERE m.metric IS NOT NULL AND NOT starts_with(ct.tag, 'derived/') AND list_contains(?, c.run_id)
               GROUP BY c.run_id, m.metric HAVING count(DISTINCT c.source) > 1)""",
        [run_ids],
    )


# ---- points -------------------------------------------------------------------------------
def scalars(
    run_id: str, metric: str | None = None, tag: str | None = None, all_points: bool = False
) -> Query:
    """A run's points (of one canonical metric and/or tag): step, value, wall_time, tag, metric,
    source, by tag and step; with `all_points`, the superseded ones too (`superseded`, the
    writer's `segment` and `source_file` say which)."""
    cols = "step, value, wall_time, tag, metric, source"
    where = ["run_id = $run"]
    params: dict[str, Any] = {"run": run_id}
    if metric is not None:
        where.append("metric = $metric")
        params["metric"] = metric
    if tag is not None:
        where.append("tag = $tag")
        params["tag"] = tag
    if all_points:
        cols += ", superseded, segment, source_file"
        order = "tag, step, superseded DESC, segment, source"
    else:
        where.append("NOT superseded")
        order = "tag, step"
    return Query(f"SELECT {cols} FROM scalars_all WHERE {' AND '.join(where)} ORDER BY {order}", params)


def metric_points(metric: str) -> Query:
    """(run_id, tag, step, value) of every current point of one canonical metric."""
    return Query(
        "SELECT run_id, tag, step, value FROM scalars WHERE metric = ? ORDER BY run_id, tag, step", [metric]
    )


def series(run_id: str, tag: str) -> Query:
    """(step, value) of one run's current points of one tag, by step."""
    return Query("SELECT step, value FROM scalars WHERE run_id = ? AND tag = ? ORDER BY step", [run_id, tag])


def first_step(run_id: str, tag: str) -> Query:
    """The first current step of one run's tag (NULL when it has none)."""
    return Query("SELECT min(step) FROM scalars WHERE run_id = ? AND tag = ?", [run_id, tag])


def tag_for(run_id: str, tag_or_metric: str) -> Query:
    """The run's tag that is `tag_or_metric` itself, else its tag for that canonical metric with
    the most current points (no row: neither)."""
    t = tag_or_metric
    return Query(
        "SELECT tag FROM scalars WHERE run_id = ? AND (tag = ? OR metric = ?) "
        "GROUP BY tag ORDER BY tag <> ?, count(*) DESC LIMIT 1",
        [run_id, t, t, t],
    )


def curve_points(run_id: str, tag: str) -> Query:
    """step, wall_time, value, superseded of every stored point of one run's tag, in the
    order the parts hold them (sorted by step for a single writer)."""
    return Query(
        "SELECT step, wall_time, value, superseded FROM scalars_all WHERE run_id = ? AND tag = ?",
        [run_id, tag],
    )


def curve_points_of(run_ids: list[str], tag: str) -> Query:
    """`curve_points` of several runs' tag in one scan (a sweep's first view), each with `run`:
    its run's position in `run_ids` (a small integer, not millions of run id strings)."""
    return Query(
        "SELECT list_position($runs::VARCHAR[], run_id)::INTEGER - 1 AS run, step, wall_time, value, superseded "
        "FROM scalars_all WHERE tag = $tag AND list_contains($runs::VARCHAR[], run_id)",
        {"tag": tag, "runs": run_ids},
    )


def duplicated_steps(run_id: str, tag: str) -> Query:
    """Steps of a run's tag whose superseded points are another source's duplicate of a
    current point, not a resume: no current point of their own source at that step, and no
    later segment of their source starting at or below it."""
    return Query(
        """WITH p AS (SELECT step, source, segment, superseded FROM scalars_all WHERE run_id = $r AND tag = $t),
                cur AS (SELECT DISTINCT step, source FROM p WHERE NOT superseded),
                ft AS (SELECT source, segment, first_step FROM file_tags WHERE run_id = $r AND tag = $t)
           SELECT s.step FROM p s
           WHERE s.superseded
             AND EXISTS (SELECT 1 FROM cur c WHERE c.step = s.step AND c.source <> s.source)
             AND NOT EXISTS (SELECT 1 FROM cur c WHERE c.step = s.step AND c.source = s.source)
             AND NOT EXISTS (SELECT 1 FROM ft WHERE ft.source = s.source AND ft.segment > s.segment
                             AND ft.first_step <= s.step)""",
        {"r": run_id, "t": tag},
    )


def run_clock(run_id: str) -> Query:
    """(step, wall) of a run over every source and tag: each step's latest wall time."""
    return Query(
        "SELECT step, max(wall_time) AS wall FROM scalars_all WHERE run_id = ? AND isfinite(wall_time) "
        "GROUP BY step ORDER BY step",
        [run_id],
    )


def export_points(run_id: str, tag: str, replaced: bool = True) -> Query:
    """run_id, tag, step, wall_time, value, superseded of the stored points of a run's tag by
    step: the current ones (one per step), and with `replaced` those a resume replaced too. A
    point without a wall time of its own takes the run's clock at its step (another source that
    logged the step), so a step is never a timed replaced row beside an untimed current one."""
    return Query(
        """WITH clock AS (SELECT step, max(wall_time) AS wall FROM scalars_all
                          WHERE run_id = $r AND isfinite(wall_time) GROUP BY step)
           SELECT p.run_id, p.tag, p.step,
                  coalesce(CASE WHEN isfinite(p.wall_time) THEN p.wall_time END, clock.wall) AS wall_time,
                  p.value, p.superseded
           FROM scalars_all p LEFT JOIN clock USING (step)
           WHERE p.run_id = $r AND p.tag = $t"""
        + ("" if replaced else " AND NOT p.superseded")
        + " ORDER BY p.step, p.superseded DESC",
        {"r": run_id, "t": tag},
    )


def ranked_points(run_id: str) -> Query:
    """A run's current points with their source and its precedence (`rank`), by tag and step:
    what a live evaluation is seeded with."""
    return Query(
        """SELECT tag, metric, step, value, source, source_rank AS rank FROM _points
           WHERE run_id = ? AND NOT superseded ORDER BY tag, step""",
        [run_id],
    )


def agreement_points(run_ids: list[str]) -> Query:
    """The current points that cross-source agreement compares, of these runs: per run and
    canonical metric logged by several sources, each source's tag with the most points
    (derived series aside; of tags as long, such as MoE's per-layer series of one metric, the
    first by name, so that every ingest picks the same); run_id, metric, source, tag, step,
    value, source_file."""
    return Query(
        """WITH cur AS (SELECT run_id, metric, source, tag, step, value, source_file
                        FROM _points WHERE NOT superseded AND metric IS NOT NULL AND list_contains(?, run_id)
                        AND NOT starts_with(tag, 'derived/')),
                best AS (SELECT run_id, metric, source, tag FROM (
                             SELECT run_id, metric, source, tag, count(*) AS n FROM cur GROUP BY ALL)
                         QUALIFY row_number() OVER (PARTITION BY run_id, metric, source ORDER BY n DESC, tag) = 1),
                multi AS (SELECT run_id, metric FROM best GROUP BY ALL HAVING count(*) > 1)
           SELECT cur.run_id, cur.metric, cur.source, cur.tag, cur.step, cur.value, cur.source_file
           FROM cur SEMI JOIN multi USING (run_id, metric) SEMI JOIN best USING (run_id, metric, source, tag)
           ORDER BY ALL""",
        [run_ids],
    )


def source_ranks() -> Query:
    """(source, precedence) of every source kind: the lower, the stronger its claim to a step."""
    return Query("SELECT source, precedence FROM _sources")


# ---- events, alerts, labels, lineage, problems -----------------------------------------------
def events(run_id: str | None = None, kinds: Sequence[str] | None = None) -> Query:
    """The `events` view (of one run; of these kinds), in the order they were logged."""
    where: list[str] = []
    params: dict[str, Any] = {}
    if run_id is not None:
        where.append("run_id = $run")
        params["run"] = run_id
    if kinds is not None:
        where.append("list_contains($kinds::VARCHAR[], kind)")
        params["kinds"] = list(kinds)
    return Query(f'SELECT * FROM events{_where(where)} ORDER BY run_id, source_file, "offset"', params)


def run_events(run_ids: list[str]) -> Query:
    """(run_id, step, kind, attrs) of every event of these runs: what rules read."""
    return Query("SELECT run_id, step, kind, attrs FROM events WHERE list_contains(?, run_id)", [run_ids])


def events_with_format(run_id: str) -> Query:
    """A run's events (step, kind, attrs) with the format of the file that logged each (`source`)."""
    return Query(
        """SELECT e.step, e.kind, e.attrs, f.format AS source FROM events e
           JOIN _files f ON f.path = e.source_file WHERE e.run_id = ?""",
        [run_id],
    )


def chart_events(run_ids: list[str]) -> Query:
    """The events of these runs that have a step, text lines aside, by run and step."""
    return Query(
        "SELECT run_id, step, wall_time, kind, message FROM events WHERE list_contains(?, run_id) "
        "AND step IS NOT NULL AND kind <> 'text' ORDER BY run_id, step",
        [run_ids],
    )


def histogram_tags() -> Query:
    """Per run and histogram tag: how many histograms and their step range."""
    return Query(
        "SELECT run_id, tag, count(*) AS histograms, min(step) AS first_step, max(step) AS last_step "
        "FROM histograms GROUP BY run_id, tag ORDER BY run_id, tag"
    )


def histograms(run_ids: Sequence[str] | None = None, tag: str | None = None) -> Query:
    """The `histograms` view (of these runs; of one tag), by run, tag, step and file order."""
    where: list[str] = []
    params: dict[str, Any] = {}
    if run_ids is not None:
        where.append("list_contains($runs::VARCHAR[], run_id)")
        params["runs"] = list(run_ids)
    if tag is not None:
        where.append("tag = $tag")
        params["tag"] = tag
    return Query(
        f'SELECT * FROM histograms{_where(where)} ORDER BY run_id, tag, step, source_file, "offset"', params
    )


def alerts(run_ids: Sequence[str] | None = None) -> Query:
    """The `alerts` view (of these runs), by run and the step each fired."""
    if run_ids is None:
        return Query("SELECT * FROM alerts ORDER BY run_id, step_fired")
    return Query(
        "SELECT * FROM alerts WHERE list_contains(?::VARCHAR[], run_id) ORDER BY run_id, step_fired",
        [list(run_ids)],
    )


def labels(columns: Sequence[str] = ("*",)) -> Query:
    """The `labels` view (these columns), by run id."""
    return Query(f"SELECT {', '.join(columns)} FROM labels ORDER BY run_id")


def lineage(run_id: str | None = None, columns: Sequence[str] = ("*",)) -> Query:
    """The `lineage` view's edges (those into or out of one run), by child run and segment,
    parent run and step (the order lineage writes them in)."""
    cols = ", ".join(columns)
    if run_id is None:
        return Query(f"SELECT {cols} FROM lineage ORDER BY child_run, child_segment, parent_run, parent_step")
    return Query(
        f"SELECT {cols} FROM lineage WHERE child_run = $run OR parent_run = $run ORDER BY child_run, child_segment, parent_run, parent_step",
        {"run": run_id},
    )


def continued_from(run_id: str) -> Query:
    """(parent run, step) of the run `run_id` continued from (another run; a restart before a
    fork), or no row."""
    return Query(
        "SELECT parent_run, parent_step FROM lineage WHERE child_run = ? AND parent_run <> child_run "
        "ORDER BY kind = 'fork', parent_step LIMIT 1",
        [run_id],
    )


# a continuation ended healthy: labelled healthy, or completed without a failure after the restart
_HEALTHY_AFTER = """coalesce(lb.outcome = 'healthy' OR (r.status IN ('completed', 'recovered')
                    AND (lb.outcome IS DISTINCT FROM 'failed' OR lb.onset < {step})), false)"""


def recoveries() -> Query:
    """(run recovered, step the recovery was triggered or rolled back to, did the continuation
    end healthy, 'automatic' | 'manual') of every recovery the logs show.

    Automatic: inside the run: it resumed from an earlier checkpoint of its own (a lineage edge
    within the run) with its configuration unchanged, or it logged a recovery event
    (`RECOVERY TRIGGERED`) and no restart. Manual: a restart as another run (lineage's
    recovery and fork edges), or as a new segment with a changed configuration (lineage's
    `changes`). Healthy: the continuation is labelled healthy, or it completed and no failure
    of its label starts after the recovery."""
    return Query(f"""
        WITH rec AS (SELECT run_id, min(step) AS step FROM events WHERE kind = 'recovery' GROUP BY run_id)
        SELECT l.parent_run, coalesce(e.step, l.parent_step) AS step,
               {_HEALTHY_AFTER.format(step="coalesce(e.step, l.parent_step)")},
               CASE WHEN l.child_run = l.parent_run AND l.changes IS NULL THEN 'automatic' ELSE 'manual' END
        FROM lineage l LEFT JOIN labels lb ON lb.run_id = l.child_run LEFT JOIN runs r ON r.run_id = l.child_run
        LEFT JOIN rec e ON e.run_id = l.child_run
        UNION ALL
        SELECT e.run_id, e.step, {_HEALTHY_AFTER.format(step="e.step")}, 'automatic'
        FROM rec e LEFT JOIN labels lb USING (run_id) LEFT JOIN runs r USING (run_id)
        WHERE e.run_id NOT IN (SELECT child_run FROM lineage)""")


def in_job_alerts() -> Query:
    """(run_id, step) of every alert a job raised itself (`in_job_alert` events with a step)."""
    return Query("SELECT run_id, step FROM events WHERE kind = 'in_job_alert' AND step IS NOT NULL")


def problems(run_id: str | None = None) -> Query:
    """The `problems` view (of one run), by file and offset."""
    if run_id is None:
        return Query('SELECT * FROM problems ORDER BY path, "offset" NULLS FIRST, kind')
    return Query(
        'SELECT * FROM problems WHERE run_id = ? ORDER BY path, "offset" NULLS FIRST, kind', [run_id]
    )


def _where(conditions: list[str]) -> str:
    return " WHERE " + " AND ".join(conditions) if conditions else ""
