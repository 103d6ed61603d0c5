"""The SQL views over one store generation: what `workbench sql`, the app and the detectors read.

Preemption (what `superseded` means): within a (run, source, tag), points are ordered as they
were written: files by their first wall time (then first step, then path), chunks by offset,
rows in file order. A point is superseded when a later point has a step <= its own, as
TensorBoard's loader does when a resumed writer logs step 100 again. When several sources of a
run log a tag at the same step, the source with the lowest precedence (table `sources`) keeps
the current row; so it does for a metric that two sources log under different tags when they
agree (table `agreement`: HF's trainer_state `loss` and TensorBoard `train/loss`), and a series
derived from notices (`derived/loss_scale`) yields to a logged one of its metric. The view
`scalars` keeps the current rows, so it is unique on (run_id, tag, step), and on (run_id, metric,
step) where sources agree; `scalars_all` says why a point is not current (`superseded_by`).

Run status comes from end-of-run evidence rows (table `evidence`, written by the readers) and
from the points themselves (a non-finite last loss), strongest first, with the evidence in words.
"""

from __future__ import annotations

import re
from pathlib import Path

import duckdb

import workbench.store.aliases as aliases
import workbench.store.layout as layout
import workbench.store.schema as schema
from workbench.store.config import settings_folders
from workbench.store.sql import duck_type, duckdb_config, empty_select, glob_literal


def _meta_sql(gen: Path, table: str, sch: dict, have: set[str] | None) -> str:
    """A generation's table (`have`: its file's columns, None: no file); tables or columns newer
    than the store read as empty/null."""
    if have is None:
        return empty_select(sch)
    cols = ", ".join(
        f'"{c}"' if c in have else f'CAST(NULL AS {duck_type(t)}) AS "{c}"' for c, t in sch.items()
    )
    return f"SELECT {cols} FROM read_parquet({glob_literal(str(gen / f'{table}.parquet'))})"


def table_columns(con: duckdb.DuckDBPyConnection, gen: Path) -> dict[str, set[str]]:
    """The column names of each table file of a generation, from their Parquet footers in one
    query (DuckDB reads them: a reader of the store loads neither pyarrow nor polars)."""
    files = [str(p) for p in gen.glob("*.parquet")]
    out: dict[str, set[str]] = {}
    if files:
        for file, name in con.execute("SELECT file_name, name FROM parquet_schema(?)", [files]).fetchall():
            out.setdefault(Path(file).stem, set()).add(name)
    return out


def table_view(con: duckdb.DuckDBPyConnection, gen: Path, table: str) -> str:
    """The CREATE VIEW statement of one table of a generation (a derived table just written)."""
    sch = {**schema.META_TABLES, **schema.DERIVED_TABLES}[table]
    path = gen / f"{table}.parquet"
    have = None
    if path.exists():
        have = {r[0] for r in con.execute("SELECT name FROM parquet_schema(?)", [str(path)]).fetchall()}
    return f"CREATE OR REPLACE VIEW _{table} AS {_meta_sql(gen, table, sch, have)}"


def listed_parts(
    con: duckdb.DuckDBPyConnection, root: Path, gen: Path, cols: dict[str, set[str]]
) -> list[dict]:
    """The rows of `integrity.expected_parts` (one per part the generation refers to), read
    with DuckDB."""
    chunks = _meta_sql(gen, "chunks", schema.CHUNKS, cols.get("chunks"))
    parts = _meta_sql(gen, "parts", schema.PARTS, cols.get("parts"))
    rel = con.execute(
        f"""WITH c AS (SELECT chunk_id, run_id, path AS source, rows FROM ({chunks})),
                 p AS ({parts})
            SELECT p.chunk_id, p.kind, p.rows, p.size, p.sha256, p.file, p.mtime_ns, c.run_id, c.source
            FROM p JOIN c USING (chunk_id)
            UNION ALL
            SELECT chunk_id, 'scalars', rows, NULL, NULL, NULL, NULL, run_id, source
            FROM c WHERE rows > 0 AND chunk_id NOT IN (SELECT chunk_id FROM p)
            ORDER BY 1, 2"""
    )
    names = [d[0] for d in rel.description]
    rows = [dict(zip(names, r, strict=True)) for r in rel.fetchall()]
    files = layout.part_files(
        root,
        [r["kind"] for r in rows],
        [r["run_id"] for r in rows],
        [r["chunk_id"] for r in rows],
        [r["file"] for r in rows],
    )
    for r, f in zip(rows, files, strict=True):
        r["file"] = f
    return rows


def _parts_sql(folder: Path, pattern: str, sch: dict, select: str) -> str:
    """Every Parquet part under `folder` matching `pattern`, or no rows when there are none yet."""
    if folder.exists() and next(folder.glob(pattern), None) is not None:  # stops at the first match
        return select.format(src=f"read_parquet({glob_literal(str(folder), '/' + pattern)})")
    return empty_select(sch)


def _scalar_parts_sql(parts: list[dict]) -> str:
    """The scalar parts this generation lists, by name (no folder listing; a compacted file once),
    less the rows of chunks dropped since they were compacted."""
    files = list(dict.fromkeys(r["file"] for r in parts if r["kind"] == "scalars"))
    if not files:
        return empty_select(schema.SCALAR_PART)
    listed = ", ".join(glob_literal(f) for f in files)
    return f"SELECT p.* FROM read_parquet([{listed}]) p SEMI JOIN _chunks c ON c.chunk_id = p.chunk_id"


NONFINITE_LISTED = 10_000  # chunks with NaN/Inf points named in the views' SQL, at most


def _nonfinite_sources(
    con: duckdb.DuckDBPyConnection, gen: Path, have: set[str] | None, parts: list[dict]
) -> tuple[str, str]:
    """SQL for the part rows run status reads: those of the chunks holding a NaN/Inf point, and
    of those written before chunk_tags counted them (read whole). Chunks named by id from this
    generation's chunk_tags and read from the files that hold them, so DuckDB opens no other
    part (and none at all when no chunk holds such a point)."""
    none = empty_select(schema.SCALAR_PART)  # binds no part (a view of the parts reads every footer)
    if have is None:
        return none, none
    if "nonfinite" not in have:
        return "SELECT * FROM _parts", "SELECT * FROM _parts"  # a store from before the counts
    path = glob_literal(str(gen / "chunk_tags.parquet"))
    out: list[str] = []
    for cond in ("nonfinite IS NULL OR nonfinite > 0", "nonfinite IS NULL"):
        # (the few chunks that qualify, picked by DuckDB: a store of 10k runs has 40k rows here)
        listed = {
            i
            for (i,) in con.execute(
                f"SELECT DISTINCT chunk_id FROM read_parquet({path}) WHERE {cond}"
            ).fetchall()
        }
        if len(listed) > NONFINITE_LISTED:
            out.append(
                f"SELECT * FROM _parts WHERE chunk_id IN (SELECT chunk_id FROM _chunk_tags WHERE {cond})"
            )
            continue
        files = list(
            dict.fromkeys(r["file"] for r in parts if r["kind"] == "scalars" and r["chunk_id"] in listed)
            if listed
            else ()
        )
        if not files:
            out.append(none)
        else:
            names = ", ".join(glob_literal(f) for f in files)
            ids = ", ".join(map(str, sorted(listed)))
            out.append(f"SELECT * FROM read_parquet([{names}]) WHERE chunk_id IN ({ids})")
    return out[0], out[1]


def view_statements(
    root: Path,
    gen: Path,
    con: duckdb.DuckDBPyConnection | None = None,
    parts: list[dict] | None = None,
    cols: dict[str, set[str]] | None = None,
) -> list[str]:
    """CREATE VIEW statements for the documented views over one generation (`con`: a connection
    to read the generation's tables with; `parts`: its `listed_parts` and `cols` its
    `table_columns`, when already read)."""
    if con is None:
        with duckdb.connect(":memory:", config=duckdb_config()) as own:
            return view_statements(root, gen, own, parts, cols)
    if cols is None:
        cols = table_columns(con, gen)
    stmts = [  # (the table of parts is read by `listed_parts`: `_parts` is the scalar parts' rows)
        f"CREATE OR REPLACE VIEW _{t} AS {_meta_sql(gen, t, sch, cols.get(t))}"
        for t, sch in {**schema.META_TABLES, **schema.DERIVED_TABLES}.items()
        if t != "parts"
    ]
    if parts is None:
        parts = listed_parts(con, root, gen, cols)
    part_sql = _scalar_parts_sql(parts)
    event_sql = _parts_sql(
        root / "events",
        "*/e*.parquet",
        {c: t for c, t in schema.EVENT_PART.items() if c != "chunk_id"},
        "SELECT e.* EXCLUDE (chunk_id) FROM {src} e SEMI JOIN _chunks c ON c.chunk_id = e.chunk_id",
    )
    nonfinite, uncounted = _nonfinite_sources(con, gen, cols.get("chunk_tags"), parts)
    user = aliases.load_user_aliases(*settings_folders(root))
    metric_rows = (  # each tag once through the patterns
        f"SELECT tag, {aliases.metric_case_sql('tag', user, 'words')} AS metric "
        f"FROM (SELECT tag, {aliases.normalized_sql('tag')} AS words FROM (SELECT DISTINCT tag FROM _chunk_tags))"
    )
    stmts += [
        f"CREATE OR REPLACE VIEW _parts AS {part_sql}",
        f"CREATE OR REPLACE VIEW _events AS {event_sql}",
        f"CREATE OR REPLACE VIEW _tag_metric AS {metric_rows}",
        # segments: a run's files in the order they were written: by first wall time; files
        # without one (console logs) by their first step (a resumed log starts below the previous
        # one's end but above its start), then by path
        """CREATE OR REPLACE VIEW _file_order AS
           WITH first_steps AS (SELECT c.path, min(ct.min_step) AS first_step
                                FROM _chunks c JOIN _chunk_tags ct USING (chunk_id) GROUP BY c.path)
           SELECT f.path, f.run_id, fs.first_step,
                  dense_rank() OVER (PARTITION BY f.run_id
                                     ORDER BY f.first_wall_time NULLS LAST, fs.first_step NULLS LAST, f.path) - 1 AS segment
           FROM _files f LEFT JOIN first_steps fs USING (path) WHERE f.format IS NOT NULL""",
        # per file and tag: its segment, step range and points (what lineage judges restarts by)
        """CREATE OR REPLACE VIEW file_tags AS
           SELECT fo.run_id, c.source, fo.path, fo.segment, ct.tag,
                  sum(ct.points) AS points, min(ct.min_step) AS first_step, max(ct.max_step) AS last_step
           FROM _file_order fo JOIN _chunks c USING (path) JOIN _chunk_tags ct USING (chunk_id)
           GROUP BY ALL""",
        """CREATE OR REPLACE VIEW _cutoffs AS
           SELECT ct.chunk_id, ct.tag,
                  min(ct.min_step) OVER (
                      PARTITION BY c.run_id, c.source, ct.tag
                      ORDER BY fo.segment, c.start_offset
                      ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING) AS cutoff
           FROM _chunk_tags ct JOIN _chunks c USING (chunk_id)
           JOIN _file_order fo ON fo.path = c.path""",
        """CREATE OR REPLACE VIEW _points AS
           SELECT p.run_id, p.tag, m.metric, p.step, p.wall_time, p.value,
                  c.source, fo.segment, c.path AS source_file,
                  (p.local_superseded OR coalesce(p.step >= k.cutoff, false)) AS superseded,
                  coalesce(s.precedence, 1000000) AS source_rank
           FROM _parts p
           JOIN _chunks c ON c.chunk_id = p.chunk_id
           JOIN _file_order fo ON fo.path = c.path
           LEFT JOIN _sources s ON s.source = c.source
           LEFT JOIN _cutoffs k ON k.chunk_id = p.chunk_id AND k.tag = p.tag
           LEFT JOIN _tag_metric m ON m.tag = p.tag""",
        # tags that several sources of a run log: only these, and the tags of a metric that
        # agreeing sources log under different names, need the cross-source ranking
        """CREATE OR REPLACE VIEW _multi_source AS
           SELECT c.run_id, ct.tag FROM _chunk_tags ct JOIN _chunks c USING (chunk_id)
           GROUP BY ALL HAVING count(DISTINCT c.source) > 1""",
        # per run, the tags of one metric that are one series: those whose sources agree (HF's
        # trainer_state `loss` and its TensorBoard callback's `train/loss`), and a derived series
        # (rebuilt from notices, `derived/loss_scale`) with the logged series of its metric
        """CREATE OR REPLACE VIEW _agreeing AS
           WITH tags AS (SELECT DISTINCT c.run_id, ct.tag, m.metric FROM _chunk_tags ct JOIN _chunks c USING (chunk_id)
                         JOIN _tag_metric m USING (tag) WHERE m.metric IS NOT NULL),
                derived AS (SELECT run_id, tag, metric FROM tags WINDOW w AS (PARTITION BY run_id, metric)
                            QUALIFY bool_or(starts_with(tag, 'derived/')) OVER w AND count(*) OVER w > 1)
           SELECT DISTINCT run_id, tag, metric FROM (
               SELECT run_id, tag_a AS tag, metric FROM _agreement WHERE verdict = 'ok'
               UNION ALL SELECT run_id, tag_b, metric FROM _agreement WHERE verdict = 'ok'
               UNION ALL SELECT run_id, tag, metric FROM derived)""",
        # `grp`: the metric for agreeing tags (ranked by metric and step), else null (by tag and step)
        """CREATE OR REPLACE VIEW _ranked_tags AS
           SELECT run_id, tag, max(grp) AS grp FROM (
               SELECT run_id, tag, NULL::VARCHAR AS grp FROM _multi_source
               UNION ALL SELECT run_id, tag, metric FROM _agreeing)
           GROUP BY run_id, tag""",
        # superseded_by: 'later' (a later point of the same source and tag: a resume), 'source'
        # (another source keeps the step: see the module docstring)
        """CREATE OR REPLACE VIEW scalars_all AS
           SELECT * EXCLUDE (source_rank), CASE WHEN superseded THEN 'later' END AS superseded_by FROM _points p
           WHERE NOT EXISTS (SELECT 1 FROM _ranked_tags ms WHERE ms.run_id = p.run_id AND ms.tag = p.tag)
           UNION ALL
           SELECT * EXCLUDE (source_rank, current_rank, grp) REPLACE (superseded OR current_rank > 1 AS superseded),
                  CASE WHEN superseded THEN 'later' WHEN current_rank > 1 THEN 'source' END AS superseded_by
           FROM (SELECT p.*, ms.grp, CASE WHEN p.superseded THEN 0 ELSE row_number() OVER (
                     PARTITION BY p.run_id, ms.grp, CASE WHEN ms.grp IS NULL THEN p.tag END, p.step, p.superseded
                     ORDER BY starts_with(p.tag, 'derived/'), p.source_rank, p.tag) END AS current_rank
                 FROM _points p JOIN _ranked_tags ms ON ms.run_id = p.run_id AND ms.tag = p.tag)""",
        """CREATE OR REPLACE VIEW scalars AS
           SELECT run_id, tag, metric, step, wall_time, value FROM scalars_all
           WHERE NOT superseded""",
        """CREATE OR REPLACE VIEW files AS
           SELECT f.path, f.run_id, f.format, f.status, f.size, f.consumed, f.records,
                  f.points, f.problems, f.note, f.contents, fo.segment,
                  to_timestamp(f.mtime_ns / 1e9) AS mtime, to_timestamp(f.ingested_at) AS ingested_at
           FROM _files f LEFT JOIN _file_order fo USING (path)""",
        "CREATE OR REPLACE VIEW events AS SELECT run_id, step, wall_time, kind, message, attrs, "
        "path AS source_file, \"offset\" FROM _events WHERE kind <> 'histogram'",
        # histogram summaries, kept as events of their own kind (ingest.tensorboard): one row per
        # tag and step, buckets as TensorBoard's histogram plugin reads them
        """CREATE OR REPLACE VIEW histograms AS
           SELECT run_id, message AS tag, step, wall_time,
                  (attrs->'left')::DOUBLE[] AS "left", (attrs->'right')::DOUBLE[] AS "right",
                  (attrs->'count')::DOUBLE[] AS count, (attrs->>'num')::DOUBLE AS num,
                  (attrs->>'min')::DOUBLE AS min, (attrs->>'max')::DOUBLE AS max,
                  (attrs->>'sum')::DOUBLE AS sum, path AS source_file, "offset"
           FROM _events WHERE kind = 'histogram'""",
        "CREATE OR REPLACE VIEW agreement AS SELECT * FROM _agreement",
        # tags that look like a loss or a gradient norm but map to no metric: no rule sees them
        f"""CREATE OR REPLACE VIEW unmapped_tags AS
           SELECT * FROM (
               SELECT c.run_id, ct.tag, {aliases.looks_like_sql("ct.tag", "m.metric")} AS looks_like,
                      sum(ct.points) AS points, min(ct.min_step) AS first_step, max(ct.max_step) AS last_step
               FROM _chunk_tags ct JOIN _chunks c USING (chunk_id) JOIN _tag_metric m USING (tag) GROUP BY ALL)
           WHERE looks_like IS NOT NULL""",
        # a problem stays with its file: a disagreement is reported on the less trusted source's file
        """CREATE OR REPLACE VIEW problems AS
           SELECT * FROM _problems
           UNION ALL
           SELECT path_b AS path, run_id, NULL::BIGINT AS "offset", 'sources_disagree' AS kind,
                  metric || ': ' || source_a || ' `' || tag_a || '` and ' || source_b || ' `' || tag_b || '` '
                  || CASE verdict
                       WHEN 'offset' THEN 'agree only with ' || source_b || ' shifted by ' || step_offset::VARCHAR || ' step(s)'
                       WHEN 'scaled' THEN 'agree only with one step axis ' || abs(step_scale)::VARCHAR
                                          || ' times the other (samples instead of steps?)'
                       ELSE 'agree at ' || round(100 * agree, 1)::VARCHAR || ' % of ' || common_steps::VARCHAR || ' common steps'
                     END AS message
           FROM _agreement WHERE verdict IN ('offset', 'scaled', 'disagree')""",
        "CREATE OR REPLACE VIEW alerts AS SELECT * FROM _alerts",
        "CREATE OR REPLACE VIEW deliveries AS SELECT alert_id, run_id, rule, step_start, outcome, "
        "to_timestamp(notified_at) AS notified_at, detail FROM _deliveries",
        "CREATE OR REPLACE VIEW checkpoints AS SELECT run_id, step, path, kind, to_timestamp(wall_time) AS wall_time, "
        "size, files, metadata, sha256, copies, verified FROM _checkpoints",
        # per run and canonical metric: the values that turned NaN/Inf after a finite one and
        # stayed so to the end (the last loss; 3+ values of any other metric)
        # (the last finite step from the chunk lists; past it every point is non-finite, so only
        # the chunks that hold such points are read)
        f"""CREATE OR REPLACE VIEW _nonfinite_tails AS
           WITH old AS (SELECT p.chunk_id, p.tag, max(p.step) FILTER (WHERE isfinite(p.value)) AS finite_step
                        FROM ({uncounted}) p WHERE NOT p.local_superseded GROUP BY ALL),
                last_finite AS (SELECT c.run_id, m.metric, max(coalesce(ct.finite_step, old.finite_step)) AS step
                                FROM _chunk_tags ct JOIN _chunks c USING (chunk_id)
                                JOIN _tag_metric m ON m.tag = ct.tag
                                LEFT JOIN old ON old.chunk_id = ct.chunk_id AND old.tag = ct.tag
                                WHERE m.metric IS NOT NULL GROUP BY ALL),
                pts AS (SELECT p.run_id, m.metric, p.step, p.value FROM ({nonfinite}) p JOIN _tag_metric m USING (tag)
                        WHERE m.metric IS NOT NULL AND NOT p.local_superseded AND NOT isfinite(p.value))
           SELECT pts.run_id, pts.metric, min(pts.step) AS from_step, count(DISTINCT pts.step) AS n,
                  CASE WHEN isnan(arg_min(pts.value, pts.step)) THEN 'NaN'
                       WHEN arg_min(pts.value, pts.step) > 0 THEN 'Inf' ELSE '-Inf' END AS value
           FROM pts JOIN last_finite lf USING (run_id, metric)
           WHERE lf.step IS NOT NULL AND pts.step > lf.step
           GROUP BY ALL HAVING count(DISTINCT pts.step) >= 3 OR pts.metric = 'loss'""",
        f"CREATE OR REPLACE VIEW _run_facts AS {run_facts_sql()}",
        # manual labels win (the CLI over labels.toml); evidence gives auto labels to the rest
        f"""CREATE OR REPLACE VIEW _auto_labels AS
           WITH nf AS (SELECT run_id, min(onset) AS onset FROM (
                           SELECT p.run_id, min(p.step) AS onset FROM ({nonfinite}) p JOIN _tag_metric m USING (tag)
                           WHERE m.metric = 'loss' AND NOT isfinite(p.value) GROUP BY p.run_id
                           UNION ALL SELECT run_id, min(from_step) FROM _nonfinite_tails GROUP BY run_id)
                       GROUP BY run_id),
                ev AS (SELECT run_id, failure AS kind, min(step) AS onset FROM _evidence
                       WHERE failure IS NOT NULL GROUP BY ALL)
           SELECT run_id, 'failed' AS outcome, onset, kind FROM (
               SELECT run_id, onset, 'divergence_nan' AS kind, 1 AS pref FROM nf
               UNION ALL SELECT run_id, onset, kind, 2 FROM ev)
           QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY pref, onset NULLS LAST, kind) = 1""",
        """CREATE OR REPLACE VIEW labels AS
           SELECT run_id, outcome, onset, kind, 'manual' AS source, note, origin, attrs FROM (
               SELECT l.* REPLACE (
                          -- `workbench label` keeps the attributes labels.toml gave the run
                          coalesce(l.attrs, max(l.attrs) OVER (PARTITION BY l.run_id))::JSON AS attrs)
               FROM _labels l)
           QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY origin = 'workbench label' DESC) = 1
           UNION ALL
           SELECT a.run_id, a.outcome, a.onset, a.kind, 'auto', 'from evidence in the logs', NULL, NULL::JSON
           FROM _auto_labels a WHERE a.run_id NOT IN (SELECT run_id FROM _labels)""",
        # per run, what its files and points add up to (all but the status, which reads the clock)
        """CREATE OR REPLACE VIEW _run_totals AS
           WITH pts AS (
               SELECT c.run_id, sum(ct.points) AS points, count(DISTINCT ct.tag) AS tags,
                      min(ct.min_step) AS first_step, max(ct.max_step) AS last_step
               FROM _chunk_tags ct JOIN _chunks c USING (chunk_id) GROUP BY c.run_id),
           fl AS (
               SELECT run_id, string_agg(DISTINCT format, ',' ORDER BY format) AS formats,
                      count(*) AS files, sum(problems) AS problems,
                      min(first_wall_time) AS first_wall_time,
                      max(mtime_ns) AS last_mtime_ns, max(ingested_at) AS ingested_at
               FROM _files WHERE format IS NOT NULL GROUP BY run_id),
           seg AS (SELECT run_id, count(*) AS segments FROM _file_order GROUP BY run_id),
           -- a step of a metric that two agreeing sources log is one point
           dup AS (SELECT run_id, sum(superseded) AS points FROM _agreement WHERE verdict = 'ok' GROUP BY run_id)
           SELECT fl.run_id, fl.formats, fl.files, seg.segments,
                  coalesce(pts.points, 0) - coalesce(dup.points, 0) AS points, coalesce(pts.tags, 0) AS tags,
                  pts.first_step, pts.last_step,
                  to_timestamp(fl.first_wall_time) AS started,
                  to_timestamp(fl.last_mtime_ns / 1e9) AS last_write,
                  fl.problems, rc.config, to_timestamp(fl.ingested_at) AS ingested_at
           FROM fl LEFT JOIN pts USING (run_id) LEFT JOIN seg USING (run_id) LEFT JOIN dup USING (run_id)
           LEFT JOIN _run_config rc USING (run_id)""",
        "CREATE OR REPLACE VIEW lineage AS SELECT * FROM _lineage",
        # everything `runs` shows but what reads the clock (`running?`), so that it can be kept:
        # a run whose continuation (another run) ended healthy was recovered; its label stays
        f"""CREATE OR REPLACE VIEW _run_rows AS
           WITH st AS (SELECT run_id, last_record, {settled_status_sql()} FROM _run_facts),
           lb AS MATERIALIZED (SELECT run_id, outcome FROM labels),
           cont AS (
               SELECT l.parent_run AS run_id, string_agg(DISTINCT l.child_run, ', ') AS recovered_by
               FROM _lineage l LEFT JOIN lb ON lb.run_id = l.child_run
               LEFT JOIN st ON st.run_id = l.child_run
               WHERE l.child_run <> l.parent_run AND (lb.outcome = 'healthy' OR st.status = 'completed')
               GROUP BY 1),
           agreement AS (
               SELECT run_id, CASE WHEN count(*) FILTER (WHERE verdict IN ('offset', 'scaled', 'disagree')) = 0
                                   THEN 'ok (' || count(*) FILTER (WHERE verdict = 'ok')::VARCHAR || ' pairs agree)'
                                   ELSE string_agg(metric || ' ' || source_a || '/' || source_b || ': ' || verdict, '; '
                                                   ORDER BY metric, source_a, source_b)
                                            FILTER (WHERE verdict IN ('offset', 'scaled', 'disagree')) END AS consistency
               FROM _agreement WHERE verdict <> 'few' GROUP BY run_id)
           SELECT t.run_id, st.status, st.evidence, t.* EXCLUDE (run_id),
                  cont.recovered_by, agreement.consistency, st.last_record, st.open_ended
           FROM _run_totals t LEFT JOIN st USING (run_id) LEFT JOIN cont USING (run_id)
           LEFT JOIN agreement USING (run_id)""",
        f"""CREATE OR REPLACE VIEW runs AS
           WITH r AS (SELECT * REPLACE ({running_sql()}) FROM _run_rows)
           SELECT * EXCLUDE (last_record, open_ended) REPLACE (
                      CASE WHEN recovered_by IS NOT NULL AND status <> 'completed' THEN 'recovered' ELSE status END AS status,
                      CASE WHEN recovered_by IS NOT NULL AND status <> 'completed'
                           THEN 'continued by ' || recovered_by || ', which ended healthy; ' || evidence
                           ELSE evidence END AS evidence)
           FROM r""",
    ]
    return stmts


_VIEW_NAME = re.compile(r"CREATE OR REPLACE VIEW (\w+) AS")
# scanned left to right: a string literal, a comment, a quoted name, a word, a dot
_TOKEN = re.compile(r"""'(?:[^']|'')*'|--[^\n]*|/\*.*?\*/|"((?:[^"]|"")*)"|(\w+)|(\.)""", re.S)
_SCHEMAS = frozenset({"main", "memory", "temp"})  # the schemas and catalog of a store's connection


def _words(sql: str) -> list[str]:
    """The names in `sql` that may name a view (words and quoted names, lowercased), outside its
    string literals and comments (a part's path holds `scalars` and a store's path may hold
    `runs`), less those qualified by a table (`f.problems`, `runs.files`: a column), but not by a
    schema (`main.runs`)."""
    out: list[str] = []
    last, dotted = None, False
    for quoted, word, dot in _TOKEN.findall(sql):
        if dot:
            dotted = True
            continue
        name = (quoted or word).lower() or None
        if name is not None and (not dotted or last in _SCHEMAS):
            out.append(name)
        last, dotted = name, False
    return out


# every view `view_statements` creates (tests/test_architecture.py keeps it whole): a query that
# names none of them (`SELECT 1`, a query of a Parquet file) opens nothing of the store
VIEW_NAMES = frozenset(
    {"_" + t for t in (*schema.META_TABLES, *schema.DERIVED_TABLES)}
    | {"_agreeing", "_auto_labels", "_cutoffs", "_events", "_file_order", "_multi_source"}
    | {"_nonfinite_tails", "_points", "_ranked_tags", "_run_facts", "_run_rows", "_run_totals"}
    | {"_tag_metric"}
    | {"agreement", "alerts", "checkpoints", "deliveries", "events", "file_tags", "files", "histograms"}
    | {"labels"}
    | {"lineage", "problems", "runs", "scalars", "scalars_all", "unmapped_tags"}
)


# views over the generation's small tables (rows per tag, file, or chunk and tag) that many
# others read, made tables on a reading connection: a query binds a view's whole plan at each
# mention, and binding those nested plans again and again was most of a one-shot read
# (`workbench runs`). Those in TABLED_BEFORE_DERIVED read no derived table, so a commit can make
# them tables before its derived tables are written.
TABLED_BEFORE_DERIVED = frozenset({"_tag_metric", "_file_order", "_cutoffs", "_multi_source"})
TABLED = TABLED_BEFORE_DERIVED | {"_agreeing", "_ranked_tags"}
# and for a one-shot query, the chain under `runs` and `labels` as well (`runs` itself reads the
# clock, so a connection that lives on keeps it a view). These read no clock, so they are kept
# beside the generation by the first reader that computes them (`table_cache`).
TABLED_ONE_SHOT = TABLED | frozenset(
    {"_nonfinite_tails", "_run_facts", "_run_totals", "_auto_labels", "labels", "_run_rows"}
)


# DuckDB 2.0 creates a view `WITH (DEFER_BINDING)` without binding it: it binds where a query
# names it. A connection that makes views to run a few queries over them (a commit's derive
# hooks), or a catalog file made for later, then binds each view once instead of at its creation
# too (catalog.duckdb: 45 views in 0.07 s -> 0.03 s at 500 runs). Earlier versions bind at once.
DEFERS_BINDING = tuple(int(x) for x in re.findall(r"\d+", duckdb.__version__)[:2]) >= (2, 0)


def unbound(stmt: str) -> str:
    """A view statement made to create its view unbound, where DuckDB can (`DEFERS_BINDING`); any
    other statement as it is."""
    if not DEFERS_BINDING:
        return stmt
    return _VIEW_NAME.sub(r"CREATE OR REPLACE VIEW \1 WITH (DEFER_BINDING) AS", stmt, count=1)


def tabled(stmts: list[str], names: frozenset[str] = TABLED) -> list[str]:
    """`stmts` with the views named in `names` made tables, computed once when created (tables
    of the connection's own database: its cursors see them, as they see its views)."""
    out = []
    for s in stmts:
        m = _VIEW_NAME.match(s)
        assert m is not None, s  # every statement creates a view
        out.append(f"CREATE OR REPLACE TABLE {m[1]} AS{s[m.end() :]}" if m[1] in names else s)
    return out


def reads_no_view(query: str) -> bool:
    """Whether `query` names no view (so it needs none of the store's tables)."""
    return VIEW_NAMES.isdisjoint(_words(query))


def statement_graph(stmts: list[str]) -> dict[str, tuple[str, str, list[str]]]:
    """Each statement by the lower-case name of the view it creates: (that name as written, the
    statement, the names of views its text reads)."""
    graph = {}
    for s in stmts:
        m = _VIEW_NAME.match(s)
        assert m is not None, s  # every statement creates a view
        graph[m[1].lower()] = (m[1], s, [w for w in _words(s[m.end() :]) if w != m[1].lower()])
    return {name: (written, s, [w for w in deps if w in graph]) for name, (written, s, deps) in graph.items()}


def needed(
    graph: dict[str, tuple[str, str, list[str]]], query: str, leaves: frozenset[str] = frozenset()
) -> list[str]:
    """The views (names in a `statement_graph`) `query` may read, and those they read in turn (a
    word of the query or of a view's text that names a view), except what `leaves` read: a query
    that reads no view needs none."""
    todo = [w for w in _words(query) if w in graph]
    want = set()
    while todo:
        name = todo.pop()
        if name not in want:
            want.add(name)
            if name not in leaves:
                todo += graph[name][2]
    return [name for name in graph if name in want]  # in order: views after what they read


def run_facts_sql() -> str:
    """Per run, what its status is judged from, none of it read from the clock: its last record's
    time, its strongest end-of-run evidence and its first metric that turned NaN/Inf to the end
    (`settled_status_sql`)."""
    order = " ".join(f"WHEN '{s}' THEN {i}" for i, s in enumerate(schema.STATUS_EVIDENCE))
    return f"""
        WITH f AS (SELECT run_id, max(last_wall_time) AS last_record FROM _files WHERE format IS NOT NULL GROUP BY run_id),
        -- evidence the run wrote on past (by over a minute: a resume, an add_hparams at the start) is stale
        ev AS (SELECT e.run_id, e.status, e.message FROM _evidence e LEFT JOIN f USING (run_id)
               WHERE e.wall_time IS NULL OR f.last_record IS NULL OR e.wall_time >= f.last_record - 60
               QUALIFY row_number() OVER (PARTITION BY run_id
                                          ORDER BY CASE status {order} END, step DESC NULLS LAST, path) = 1),
        nonfinite AS (SELECT run_id, metric || ' is ' || value || ' from step ' || from_step::VARCHAR
                             || ' to the end (' || n::VARCHAR || ' logged values)' AS message
                      FROM _nonfinite_tails
                      QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY from_step, metric) = 1)
        SELECT f.run_id, f.last_record, ev.status AS ev_status, ev.message AS ev_message,
               nonfinite.message AS nf_message
        FROM f LEFT JOIN ev USING (run_id) LEFT JOIN nonfinite USING (run_id)
    """


def settled_status_sql() -> str:
    """A run's status and its evidence in words as far as the logs tell them, with `open_ended`
    (no end-of-run evidence: `running?` while its last record is under 10 minutes old,
    `running_sql`), from `_run_facts`' columns.

    diverged: evidence of divergence (DeepSpeed's minimum-loss-scale exit), or a canonical metric
    that turned NaN/Inf and stayed so to the end (the last loss; any other metric for its last 3+
    logged values after a finite one: HF's NaN filter hides a diverged loss but not its
    grad_norm). crashed, completed: the readers' end-of-run evidence (a traceback, an MLflow or
    hparams status, HF Trainer's final summary, a launcher's clean exit). incomplete evidence
    (stopped before its planned end) reads as crashed. checkpoint: the logs are a checkpoint's
    snapshot (HF's trainer_state.json of a checkpoint published alone), no evidence of how the
    run ended. Otherwise unknown.
    """
    return """
          CASE
            WHEN ev_status = 'diverged' OR nf_message IS NOT NULL THEN 'diverged'
            WHEN ev_status IN ('crashed', 'completed') THEN ev_status
            WHEN ev_status = 'incomplete' THEN 'crashed'
            WHEN ev_status = 'checkpoint' THEN 'checkpoint'
            ELSE 'unknown' END AS status,
          CASE
            WHEN ev_status = 'diverged' THEN ev_message
            WHEN nf_message IS NOT NULL THEN nf_message
            WHEN ev_status IN ('crashed', 'completed', 'incomplete', 'checkpoint') THEN ev_message
            ELSE 'no end-of-run evidence in the logs' END AS evidence,
          (ev_status IS NULL OR ev_status NOT IN ('diverged', 'crashed', 'completed')) AND nf_message IS NULL AS open_ended
    """


def running_sql() -> str:
    """`status` and `evidence` of a settled status (`settled_status_sql`) as of now: a run with no
    end-of-run evidence whose last record was written in the last 10 minutes (by its own
    timestamps: file times mean nothing after a copy) is `running?`."""
    age = "(epoch(now()) - last_record)"
    running = f"open_ended AND {age} < 600"
    return f"""
          CASE WHEN {running} THEN 'running?' ELSE status END AS status,
          CASE WHEN {running}
               THEN 'no end-of-run evidence yet; last record ' || round({age} / 60)::BIGINT::VARCHAR || ' min ago'
               ELSE evidence END AS evidence
    """
