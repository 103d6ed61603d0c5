"""The points a replay (or a live watch) evaluates rules over: `SeriesData`, loaded from the
store as integer codes (`Coded`), bucketed by tag and run once, so that resolving a name,
sorting and joining never touch strings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from detectors.language import Name
from workbench.errors import WorkbenchError
from workbench.jit import njit
from workbench.store import aliases
from workbench.store.coded import Coded

UNIT = ["rid", "key"]  # an evaluation unit: a run, or a run and a tag for glob rules


class ReplayError(WorkbenchError):
    """A rule that cannot be evaluated on the selection (says what is available)."""


@njit(cache=True, nogil=True)
def _bucket(rid, tid, step, value, n_runs, n_buckets):
    """Points grouped by bucket tid * n_runs + rid (a counting sort, stable): rid, step, value
    in that order, the bucket bounds (n_buckets + 1), and whether every bucket's steps rise."""
    counts = np.zeros(n_buckets + 1, np.int64)
    for i in range(rid.shape[0]):
        counts[tid[i] * n_runs + rid[i] + 1] += 1
    bounds = np.cumsum(counts)
    at = bounds[:-1].copy()
    o_rid = np.empty(rid.shape[0], np.int32)
    o_step = np.empty(rid.shape[0], np.int64)
    o_value = np.empty(rid.shape[0], np.float64)
    for i in range(rid.shape[0]):
        b = tid[i] * n_runs + rid[i]
        j = at[b]
        at[b] = j + 1
        o_rid[j] = rid[i]
        o_step[j] = step[i]
        o_value[j] = value[i]
    in_order = True
    for b in range(n_buckets):
        for j in range(bounds[b] + 1, bounds[b + 1]):
            if o_step[j] < o_step[j - 1]:
                in_order = False
    return o_rid, o_step, o_value, bounds, in_order


@dataclass
class SeriesData:
    """The points a replay needs: (run_id, tag, metric, step, value), current points only; a
    frame, or `Coded` (then `points`, the frame, is decoded only if asked for).

    Inside, runs and tags are integer codes (`rid`, `tid`) and points are split by tag once, so
    that resolving a name, sorting and joining never touch strings. Code detectors read
    `tags_frame` (rid, tid, run_id, tag, metric, n: one row per run and tag), `series(name)`,
    `events`, `run_codes` and `run_ids(rids)`.
    """

    points: pl.DataFrame | Coded
    events: pl.DataFrame = field(
        default_factory=lambda: pl.DataFrame(
            schema={"run_id": pl.String, "step": pl.Int64, "kind": pl.String, "attrs": pl.String}
        )
    )
    runs: list[str] = field(default_factory=list)
    # live evaluation over the last points of each series: the state of seeded leaves before
    # them (leaf text -> rid, key, s0, s1) and each tag's point count over the whole run
    # (run_id, tag, n), which decides which tag a metric name means
    seeds: dict[str, pl.DataFrame] = field(default_factory=dict)
    counts: pl.DataFrame | None = None

    def __post_init__(self):
        if isinstance(self.points, Coded):
            c = self.points
            del self.points  # decoded by __getattr__ when asked for
        else:
            pts = self.points.select(
                pl.col("run_id").cast(pl.String),
                pl.col("tag").cast(pl.String),
                pl.col("metric").cast(pl.String),
                pl.col("step").cast(pl.Int64),
                pl.col("value").cast(pl.Float64),
            )
            self.points = pts
            c = Coded.of(pts)
        if not self.runs:
            self.runs = list(c.runs)
        # bucketed by (tid, rid) in one counting pass, keeping the parts' order inside a bucket
        n_runs = max(len(c.runs), 1)
        step, value = np.asarray(c.step, np.int64), np.asarray(c.value, np.float64)
        rid, step, value, bounds, in_order = _bucket(
            np.asarray(c.rid, np.int32),
            np.asarray(c.tid, np.int32),
            step,
            value,
            n_runs,
            n_runs * len(c.tags),
        )
        if not in_order:  # a run's chunks out of step order
            order = np.lexsort((step, np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))))
            rid, step, value = rid[order], step[order], value[order]
        g_key = np.flatnonzero(np.diff(bounds))  # the (tid, rid) buckets holding points
        g_rid, g_tid = (g_key % n_runs).astype(np.int32), (g_key // n_runs).astype(np.int32)
        g_n = np.diff(bounds)[g_key]
        self.tags_frame = pl.DataFrame(
            {
                "rid": g_rid,
                "tid": g_tid,
                "run_id": [c.runs[i] for i in g_rid],
                "tag": [c.tags[i] for i in g_tid],
                "metric": [c.metrics[i] for i in g_tid],
                "n": g_n.astype(np.uint32),
            },
            schema={
                "rid": pl.Int32,
                "tid": pl.Int32,
                "run_id": pl.String,
                "tag": pl.String,
                "metric": pl.String,
                "n": pl.UInt32,
            },
        )
        if self.counts is not None:
            self.tags_frame = (
                self.tags_frame.drop("n")
                .join(
                    self.counts.select("run_id", "tag", pl.col("n").cast(pl.UInt32)),
                    on=["run_id", "tag"],
                    how="left",
                    maintain_order="left",
                )
                .with_columns(pl.col("n").fill_null(0))
            )
        self._run_code = {r: i for i, r in enumerate(c.runs)}
        extra = [r for r in self.runs if r not in self._run_code]  # selected runs with no points
        self._run_code.update({r: len(c.runs) + i for i, r in enumerate(extra)})
        self.run_name = {i: r for r, i in self._run_code.items()}
        present = np.unique(g_tid)
        self.tag_name = {int(t): c.tags[t] for t in present}
        self.tag_names = sorted(self.tag_name.values())
        self._by_tag = {}
        for t in present:  # each tag's rows are one stretch
            lo, hi = bounds[int(t) * n_runs], bounds[(int(t) + 1) * n_runs]
            self._by_tag[int(t)] = pl.DataFrame(
                {"rid": rid[lo:hi], "step": step[lo:hi], "value": value[lo:hi]},
                schema={"rid": pl.Int32, "step": pl.Int64, "value": pl.Float64},
            )
        self.cache: dict = {}  # per loaded batch: series, leaves and grids shared by rules and sweep points

    def __getattr__(self, name):
        if name == "points":  # a Coded load: the frame of strings, built from the series on first use
            parts = [f.with_columns(tid=pl.lit(t, pl.Int32)) for t, f in self._by_tag.items()]
            names = self.tags_frame.select("rid", "tid", "run_id", "tag", "metric")
            cols = ["run_id", "tag", "metric", "step", "value"]
            self.points = (
                pl.concat(parts).join(names, on=["rid", "tid"], how="left").select(cols)
                if parts
                else pl.DataFrame(
                    schema={c: names.schema.get(c, pl.Int64) for c in cols[:3]}
                    | {"step": pl.Int64, "value": pl.Float64}
                )
            )
            return self.points
        raise AttributeError(name)

    @property
    def run_codes(self) -> pl.DataFrame:
        return pl.DataFrame(
            {"run_id": list(self._run_code), "rid": list(self._run_code.values())},
            schema={"run_id": pl.String, "rid": pl.Int32},
        )

    def resolve(self, name: Name) -> pl.DataFrame:
        """(rid, tid, key) rows: which tag stands for `name` in each run (key = tid for globs, else -1)."""
        ck = ("resolve", name.name, name.quoted)
        if ck not in self.cache:
            self.cache[ck] = self._resolve(name)
        return self.cache[ck]

    def _resolve(self, name: Name) -> pl.DataFrame:
        t = self.tags_frame
        if name.is_glob:
            hit = t.filter(pl.col("tag").str.contains("^" + aliases.glob_regex(name.name) + "$"))
            return hit.select("rid", "tid", key=pl.col("tid")).unique().sort("rid", "tid")
        if name.quoted:
            hit = t.filter(pl.col("tag") == name.name)
        else:  # a canonical metric, else a tag; per run prefer the tag spelled like the name, then the longest
            hit = t.filter((pl.col("metric") == name.name) | (pl.col("tag") == name.name))
            hit = (
                hit.sort(pl.col("tag") != name.name, -pl.col("n").cast(pl.Int64), "tag")
                .group_by("rid", maintain_order=True)
                .first()
            )
        return hit.select("rid", "tid", key=pl.lit(-1, pl.Int32)).unique().sort("rid")

    def series(self, name: Name) -> pl.DataFrame:
        """(rid, key, step, value) of a name, sorted."""
        ck = ("series", name.name, name.quoted)
        if ck not in self.cache:
            parts = []
            for (tid, key), group in self.resolve(name).group_by("tid", "key", maintain_order=True):
                frame = self._by_tag[tid]
                rids = group["rid"]
                if len(rids) < frame["rid"].n_unique():
                    frame = frame.filter(pl.col("rid").is_in(rids.implode()))
                parts.append(frame.with_columns(key=pl.lit(key, pl.Int32)))
            empty = pl.DataFrame(
                schema={"rid": pl.Int32, "key": pl.Int32, "step": pl.Int64, "value": pl.Float64}
            )
            if len(parts) == 1:  # one tag: already in (rid, step) order
                self.cache[ck] = parts[0].select(*UNIT, "step", "value")
            else:
                self.cache[ck] = (
                    pl.concat(parts).select(*UNIT, "step", "value").sort(*UNIT, "step") if parts else empty
                )
        return self.cache[ck]

    def logged_steps(self) -> dict[str, np.ndarray]:
        """Per run, the steps of its most-logged series (what 'logged steps' counts in a backtest)."""
        densest = (
            self.tags_frame.sort("rid", -pl.col("n").cast(pl.Int64))
            .group_by("rid", maintain_order=True)
            .first()
        )
        out = {}
        for rid, tid in densest.select("rid", "tid").iter_rows():
            f = self._by_tag[tid]
            out[self.run_name[rid]] = f.filter(pl.col("rid") == rid)["step"].unique().sort().to_numpy()
        return out

    def run_ids(self, rids) -> list[str]:
        return sorted(self.run_name[i] for i in rids)

    def hint(self, missing: list[str]) -> str:
        """Tags a missing name was probably meant to be (a/b without backticks divides)."""
        near = sorted({t for t in self.tag_names for m in missing if m and ("/" + m in t or m + "/" in t)})
        return (
            f" Did you mean {', '.join('`' + t + '`' for t in near[:3])}? Tags with '/' go in backticks."
            if near
            else ""
        )

    def available(self) -> str:
        metrics = sorted(self.tags_frame["metric"].drop_nulls().unique().to_list())
        tags = self.tag_names
        shown = ", ".join(tags[:25]) + (f", ... ({len(tags)} tags)" if len(tags) > 25 else "")
        return f"metrics: {', '.join(metrics) or '-'}; tags: {shown or '-'}"


def group_starts(rid: pl.Series, key: pl.Series) -> np.ndarray:
    """Row offsets where each (rid, key) group starts in a frame sorted by them, plus the end."""
    r, k = rid.to_numpy(), key.to_numpy()
    change = np.r_[True, (r[1:] != r[:-1]) | (k[1:] != k[:-1])] if len(r) else np.zeros(0, bool)
    return np.r_[np.flatnonzero(change), len(r)].astype(np.int64)


def peer_group(run_id: str) -> str:
    """The runs a peer-relative rule (`peer_z`) compares a run with: those of its folder
    (`proj/run_a` -> `proj`; top-level runs are one group), as W&B compares a run with its project's."""
    return run_id.rsplit("/", 1)[0] if "/" in run_id else ""
