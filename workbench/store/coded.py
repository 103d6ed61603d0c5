"""Points of many runs as integer codes (`Coded`), read straight from the parts: what a replay
evaluates rules over. Tags come back as ENUM codes and runs by chunk id, so no per-point string
reaches Python; only runs whose current points need the `scalars` view's ranking (a resume
across files, a tag logged by several sources) are read through it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa

from workbench.store import layout, reads
from workbench.store.points import stretch_starts


@dataclass
class Coded:
    """Points as integer codes: `rid` indexes `runs`, `tid` indexes `tags` (and `metrics`, each
    tag's canonical metric or None). A replay loads these straight from the store, so no
    per-point string is ever built."""

    runs: list[str]
    tags: list[str]
    metrics: list[str | None]
    rid: np.ndarray
    tid: np.ndarray
    step: np.ndarray
    value: np.ndarray

    @classmethod
    def of(cls, points: pl.DataFrame) -> Coded:
        """The codes of a (run_id, tag, metric, step, value) frame."""
        runs = sorted(points["run_id"].unique().to_list())
        per_tag = points.group_by("tag").agg(pl.col("metric").first()).sort("tag")
        tags = per_tag["tag"].to_list()
        return cls(
            runs,
            tags,
            per_tag["metric"].to_list(),
            points["run_id"].cast(pl.Enum(runs)).to_physical().cast(pl.Int32).to_numpy(),
            points["tag"].cast(pl.Enum(tags)).to_physical().cast(pl.Int32).to_numpy(),
            points["step"].to_numpy(),
            points["value"].to_numpy(),
        )


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


def load(con: duckdb.DuckDBPyConnection, runs: list[str]) -> tuple[Coded, pl.DataFrame]:
    """Every current point of these runs (sorted run ids) as codes, and their events (run_id,
    step, kind, attrs), from a connection to the store."""
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
    # a chunk's rows come together: look up each stretch's run, not each row's
    cid = parts["chunk_id"].to_numpy()
    starts = stretch_starts(cid)
    d_rid = np.repeat(chunk_run[np.searchsorted(chunk_ids, cid[starts])], np.diff(np.r_[starts, len(cid)]))
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

    def cat(arrays: list[np.ndarray]) -> np.ndarray:  # (no copy of a single array)
        return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)

    coded = Coded(runs, tags, [m for _, m in tag_rows], cat(rid), cat(tid), cat(step), cat(value))
    return coded, reads.run_events(runs).frame(con)


def chunk_rows(
    root: Path, gen: Path, chunks: list[tuple[str, str, int]]
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """What a live watch reads after each poll, straight from the parts of the chunks that poll
    wrote, (run_id, source, chunk_id) each, without the views: the chunks with their source's
    precedence (run_id, source, chunk_id, rank), their points not superseded inside the chunk
    (chunk_id, tag, step, value), and their events (chunk_id, step, kind, attrs)."""
    ranks = dict(layout.read_meta("sources", gen).select("source", "precedence").iter_rows())
    listing = pl.DataFrame(
        chunks, schema={"run_id": pl.String, "source": pl.String, "chunk_id": pl.Int64}, orient="row"
    ).with_columns(rank=pl.col("source").replace_strict(ranks, default=1_000_000, return_dtype=pl.Int64))
    # a chunk's points lie in its own part, or among other runs' in a shared file
    listed = (
        layout.read_meta("parts", gen)
        .filter(pl.col("kind") == "scalars")
        .join(listing.select("chunk_id", "run_id"), on="chunk_id")
    )
    files = sorted(set(layout.part_files(root, *listed.select("kind", "run_id", "chunk_id", "file"))))
    points = pl.DataFrame(
        schema={"chunk_id": pl.Int64, "tag": pl.String, "step": pl.Int64, "value": pl.Float64}
    )
    if files:
        points = (
            pl.scan_parquet(files)
            .select("chunk_id", "tag", "step", "value", "local_superseded")
            .filter(pl.col("chunk_id").is_in(listing["chunk_id"].implode()) & ~pl.col("local_superseded"))
            .select("chunk_id", pl.col("tag").cast(pl.String), "step", "value")
            .collect()
        )
    evs = [p for r, _, c in chunks if (p := layout.event_part(root, r, c)).exists()]
    events = pl.DataFrame(
        schema={"chunk_id": pl.Int64, "step": pl.Int64, "kind": pl.String, "attrs": pl.String}
    )
    if evs:
        # histograms are no rule's input (the `events` view leaves them out too)
        events = pl.read_parquet(evs, columns=["chunk_id", "step", "kind", "attrs"])
        events = events.filter(pl.col("kind") != "histogram")
    return listing, points, events
