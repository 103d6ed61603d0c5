"""Checkpoint lineage from files alone: which run (segment) continued from which checkpoint.

Evidence, strongest first, each edge carrying its own:
- checkpoint metadata naming a parent (`parent_run`, `parent_step`) -> `recovery` when the run
  logged a RECOVERY TRIGGERED line (the hparam changes are recorded), else `fork`;
- a writer segment (event file, `runs/<stamp>/`, `resume.stdout.log`, ...) that restarts at or
  below the previous segment's last step of a tag they share (but after that segment's first)
  -> `resume`, from the run's checkpoint at or below its first step (even when rotation deleted
  that checkpoint: the step is still the evidence);
  a "Loading checkpoint from ..." line confirms it, and is a `resume` on its own when it names
  the run's checkpoint (a run killed right after a save logs no step twice);
- a run with no other parent whose first step continues exactly one other run's checkpoint -> `fork`.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field

import duckdb
import polars as pl

from workbench.store import reads
from workbench.store.schema import LINEAGE


def build(
    con: duckdb.DuckDBPyConnection, previous: pl.DataFrame | None = None, changed: Collection[str] = ()
) -> pl.DataFrame:
    """All edges, from the views of one store generation (a `derive` hook of the store's commit:
    edges join runs, so they are rebuilt whole; metadata only, no points are read)."""
    # per file and tag: a restart is judged between files that write the same tag (a monitor's
    # one-file-per-metric CSVs are parallel writers, not segments)
    segs = con.sql("""
        SELECT run_id, source, path, segment, tag, first_step, last_step
        FROM file_tags ORDER BY run_id, source, segment""").pl()
    ckpts = con.sql("SELECT run_id, step, path, metadata FROM checkpoints WHERE step IS NOT NULL").pl()
    resumes = con.sql(
        "SELECT e.run_id, e.step, e.attrs, f.segment, e.source_file FROM events e "
        "LEFT JOIN files f ON f.path = e.source_file WHERE e.kind = 'resume' ORDER BY ALL"
    ).pl()
    recoveries = con.sql("SELECT run_id, step, attrs FROM events WHERE kind = 'recovery' ORDER BY step").pl()
    runs = con.sql(
        "SELECT f.run_id, min(t.first_step) AS first_step FROM files f LEFT JOIN file_tags t USING (run_id) "
        "WHERE f.format IS NOT NULL GROUP BY f.run_id"
    ).pl()
    edges = _Edges()
    _named_parents(edges, ckpts, recoveries, set(runs["run_id"].to_list()))
    _restarts(edges, segs, ckpts)
    _logged_loads(edges, resumes, ckpts)
    _forks(edges, ckpts, runs)
    rows = sorted(edges.edges.values(), key=lambda e: (e["child_run"], e["child_segment"], e["parent_run"]))
    return pl.DataFrame(rows, schema=LINEAGE)


class _Edges:
    """The edges found so far, by (child, parent, step): evidence found again is appended."""

    def __init__(self):
        self.edges: dict[tuple, dict] = {}

    def add(self, child, segment, parent, step, ckpt, kind, evidence, changes=None):
        key = (child, parent, step)
        if key in self.edges:
            self.edges[key]["evidence"] += "; " + evidence
            return
        self.edges[key] = {
            "child_run": child,
            "child_segment": segment,
            "parent_run": parent,
            "parent_step": step,
            "parent_checkpoint": ckpt,
            "kind": kind,
            "evidence": evidence,
            "changes": changes,
        }


def _named_parents(edges: _Edges, ckpts: pl.DataFrame, recoveries: pl.DataFrame, run_ids: set[str]) -> None:
    """Explicit parents in checkpoint metadata (the run's earliest checkpoint that names one):
    `recovery` when the run logged a RECOVERY TRIGGERED line, else `fork`."""
    named: set[tuple] = set()
    for run, _step, path, meta in ckpts.sort("run_id", "step").iter_rows():
        m = json.loads(meta or "{}")
        parent = _match_run(m.get("parent_run"), run_ids)
        if parent is None or parent == run or (run, parent) in named:
            continue
        named.add((run, parent))
        pstep = m.get("parent_step")
        rec = recoveries.filter(pl.col("run_id") == run)
        if rec.height:
            attrs = json.loads(rec["attrs"][0])
            edges.add(
                run,
                0,
                parent,
                pstep,
                None,
                "recovery",
                f"checkpoint metadata {path.rsplit('/', 1)[-1]} names parent {m.get('parent_run')} at step {pstep}; "
                f"recovery.log: RECOVERY TRIGGERED {attrs.get('pattern')} at step {rec['step'][0]}",
                json.dumps(attrs.get("changes"), sort_keys=True),
            )
        else:
            edges.add(
                run,
                0,
                parent,
                pstep,
                None,
                "fork",
                f"checkpoint metadata {path.rsplit('/', 1)[-1]} names parent {m.get('parent_run')}",
            )


def _restarts(edges: _Edges, segs: pl.DataFrame, ckpts: pl.DataFrame) -> None:
    """Writer segments that restart at or below where the previous one got to: `resume`, from
    the run's checkpoint at or below the restart (a source of a run needs two files for that:
    the many runs of one file each are left out at once)."""
    several = segs.group_by("run_id", "source").agg(pl.col("path").n_unique().alias("files"))
    segs = segs.join(
        several.filter(pl.col("files") > 1), on=["run_id", "source"], how="semi", maintain_order="left"
    )
    for (run, _source), g in segs.group_by("run_id", "source", maintain_order=True):
        files: list[dict] = (
            g.group_by("path", "segment", maintain_order=True)
            .agg(tags=pl.col("tag"), first=pl.col("first_step"), last=pl.col("last_step"))
            .sort("segment")
            .rows(named=True)
        )
        for i, cur in enumerate(files):
            prev = next((f for f in reversed(files[:i]) if set(f["tags"]) & set(cur["tags"])), None)
            if prev is None:
                continue
            shared = set(prev["tags"]) & set(cur["tags"])
            first = min(v for t, v in zip(cur["tags"], cur["first"], strict=True) if t in shared)
            last = max(v for t, v in zip(prev["tags"], prev["last"], strict=True) if t in shared)
            prev_first = min(v for t, v in zip(prev["tags"], prev["first"], strict=True) if t in shared)
            cur_last = max(v for t, v in zip(cur["tags"], cur["last"], strict=True) if t in shared)
            # parallel writers start together; a resume starts mid-way; a file that only logs the
            # last step again (a final evaluation by a new writer) continues nothing
            if not prev_first < first <= last or (first == last and cur_last == last):
                continue
            step, ckpt = _checkpoint_at_or_below(ckpts, run, first)
            where = (
                f"checkpoint at step {step}" if step is not None else "no checkpoint on disk at or below it"
            )
            name = cur["path"].rsplit("/", 1)[-1]
            edges.add(
                run,
                cur["segment"],
                run,
                step if step is not None else first,
                ckpt,
                "resume",
                f"{name} restarts at step {first} <= previous segment's last step {last}; {where}",
            )


def _checkpoint_at_or_below(ckpts: pl.DataFrame, run: str, step: int) -> tuple[int | None, str | None]:
    c = ckpts.filter((pl.col("run_id") == run) & (pl.col("step") <= step)).sort("step")
    return (int(c["step"][-1]), c["path"][-1]) if c.height else (None, None)


def _logged_loads(edges: _Edges, resumes: pl.DataFrame, ckpts: pl.DataFrame) -> None:
    """A "Loading checkpoint from ..." line: it confirms a resume at its step; naming the run's
    own checkpoint (or, in a later segment, one no longer on disk) it is a `resume` of the
    segment that logged it, though no step was logged twice (DeepSpeed killed right after a
    save, resumed in the same folder); naming another run's checkpoint, a `fork` from it."""
    for run, step, attrs, segment, source in resumes.iter_rows():
        a = json.loads(attrs or "{}")
        path = a.get("path", "")
        where = a.get("checkpoint") or path
        owner = ckpts.filter(
            pl.col("path").str.ends_with(where.lstrip("./"))
            | pl.lit(where).str.ends_with(pl.col("path").str.split("/").list.last())
        )
        same = [k for k in edges.edges if k[0] == run and k[1] == run and k[2] == step]
        if same:
            edges.edges[same[0]]["evidence"] += f"; log says: loading checkpoint {path}"
        elif owner.height and owner["run_id"][0] != run:
            edges.add(
                run,
                0,
                owner["run_id"][0],
                step,
                owner["path"][0],
                "fork",
                f"log says: loading checkpoint {path}",
            )
        elif step is not None and (owner.height or (segment or 0) > 0):
            on_disk = owner["path"][0] if owner.height else None
            name = (source or "").rsplit("/", 1)[-1]
            edges.add(
                run,
                segment or 0,
                run,
                step,
                on_disk,
                "resume",
                f"{name} says it loaded checkpoint {where} (step {step})"
                + ("" if on_disk else "; no checkpoint on disk at that step"),
            )


def _forks(edges: _Edges, ckpts: pl.DataFrame, runs: pl.DataFrame) -> None:
    """A run with no other parent whose first step continues exactly one other run's checkpoint."""
    has_parent = {k[0] for k in edges.edges if k[0] != k[1]}
    at_step: dict[int, list[tuple]] = {}  # checkpoints by step, in their order (a lookup per run)
    for i, (crun, cstep, cpath) in enumerate(ckpts.select("run_id", "step", "path").iter_rows()):
        at_step.setdefault(cstep, []).append((i, crun, cstep, cpath))
    for run, first in runs.iter_rows():
        if run in has_parent or not first:
            continue
        steps = [first, first - 1] if first > -(1 << 63) else [first]  # int64's least step has none below
        c = sorted(x for s in steps for x in at_step.get(s, ()) if x[1] != run)
        if len({x[1] for x in c}) == 1:
            _, crun, cstep, cpath = c[0]
            edges.add(
                run,
                0,
                crun,
                int(cstep),
                cpath,
                "fork",
                f"first step {first} continues {crun}'s checkpoint at step {cstep}",
            )


def _match_run(name: str | None, run_ids: set[str]) -> str | None:
    """A parent named in metadata: a run id, or the last part of one."""
    if not name:
        return None
    if name in run_ids:
        return name
    hits = [r for r in run_ids if r.rsplit("/", 1)[-1] == name]
    return hits[0] if len(hits) == 1 else None


def path_to(con, run_id: str) -> list[tuple[str, int | None]]:
    """[(run, step where the next run took over), ...] from the root to `run_id` (cross-run edges)."""
    path: list[tuple[str, int | None]] = [(run_id, None)]
    seen = {run_id}
    while True:
        e = reads.continued_from(path[0][0]).rows(con)[:1]
        if not e or e[0][0] in seen:
            return path
        seen.add(e[0][0])
        path.insert(0, (e[0][0], e[0][1]))


@dataclass
class TreeNode:
    """One run in a lineage tree: its summary, its own resumes, and the runs that continued it."""

    run: dict  # run_id, status, first_step, last_step, segments
    resumes: list[dict] = field(default_factory=list)  # lineage rows of its resume edges
    children: list[tuple[dict, TreeNode]] = field(default_factory=list)  # (edge, continued run)


def tree(con, run_id: str) -> TreeNode:
    """The lineage tree that holds `run_id`, from the root of its path down to every continuation."""
    root = path_to(con, run_id)[0][0]
    edges = reads.lineage().frame(con)
    runs = {
        r["run_id"]: r
        for r in reads.runs(["run_id", "status", "first_step", "last_step", "segments"])
        .frame(con)
        .iter_rows(named=True)
    }

    def grow(run: str, seen: set[str]) -> TreeNode:
        node = TreeNode(runs.get(run, {"run_id": run}))
        for e in edges.filter(pl.col("parent_run") == run).iter_rows(named=True):
            if e["child_run"] == run:
                node.resumes.append(e)
            elif e["child_run"] not in seen:
                node.children.append((e, grow(e["child_run"], seen | {e["child_run"]})))
        return node

    return grow(root, {root})


def _tag_filter(con, run: str, tag: str) -> str:
    """The tag to read in `run`: `tag` itself, else the run's tag for that metric with most points."""
    hit = reads.tag_for(run, tag).rows(con)[:1]
    return hit[0][0] if hit else tag


def stitched(con, run_id: str, tag: str) -> pl.DataFrame:
    """One series along the lineage path to `run_id`: each ancestor up to where its continuation
    begins, then the continuation (resumes inside a run are already resolved by `scalars`)."""
    hops = path_to(con, run_id)
    parts = []
    for i, (run, _) in enumerate(hops):
        s = reads.series(run, _tag_filter(con, run, tag)).frame(con).with_columns(run_id=pl.lit(run))
        if i + 1 < len(hops):
            nxt_run = hops[i + 1][0]
            nxt = reads.first_step(nxt_run, _tag_filter(con, nxt_run, tag)).rows(con)[0][0]
            if nxt is not None:
                s = s.filter(pl.col("step") < nxt)
        parts.append(s.with_columns(hop=pl.lit(i, pl.Int64)))
    out = (
        pl.concat(parts)
        if parts
        else pl.DataFrame(
            schema={"step": pl.Int64, "value": pl.Float64, "run_id": pl.String, "hop": pl.Int64}
        )
    )
    return out.unique(subset="step", keep="last", maintain_order=True)
