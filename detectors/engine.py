"""The rule engine: a rule evaluated over loaded series exactly as it would have fired live,
vectorised with polars.

For each rule and each evaluation unit (a run, or a run and a tag when the rule has a glob):
1. Series leaves (a metric, or a window function of one) are computed on that series' own
   logged points, using only points at or before each step (causal by construction).
2. They are aligned on a grid of steps: the union of their steps, or the steps of the `on`
   series; a sparse series contributes its latest value at or before each step (as-of join).
3. The condition is evaluated row-wise. NaN compares false; a value missing at a step is null
   and the condition is then false.
4. Runs of consecutive true steps become alerts once they last `for_steps` steps: `step_start`
   (rising edge), `step_fired` (where `for_steps` was reached), `step_end` (last true step).
   Alerts whose firing comes within `cooldown` steps of the previous alert's end merge into it.
No Python loop touches individual steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from detectors import language
from detectors.language import Binary, Call, Name, Num, Unary
from detectors.rules import Rule
from workbench.errors import WorkbenchError
from workbench.jit import njit
from workbench.store import aliases, schema

UNIT = ["rid", "key"]  # an evaluation unit: a run, or a run and a tag for glob rules
ALERT_SCHEMA = schema.ALERT


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


# ---- leaves: series computed on their own logged points -------------------------------------
# Every leaf value is a function of a bounded stretch of its series' past points (the window),
# or of a small state carried from the points before (ema, max_first: their seeds). So a live watch
# that keeps the last points of each series and those states computes the very numbers a
# replay over the whole run computes (detectors.live); the window kernels therefore recompute
# each window instead of sliding a running sum whose rounding depends on all earlier points.
WINDOW_STATS = {"mean": 0, "std": 1, "min": 2, "max": 3}
SEEDED = ("ema", "max_first")  # leaves carrying state from every earlier point


def _leaf_values(fn: str, n: float, s: pl.DataFrame, seed: pl.DataFrame | None = None) -> pl.Series:
    """One leaf over a series frame (rid, key, step, value sorted); `seed` (rid, key, s0, s1) is
    the state of a seeded leaf before each unit's first row (none: the unit starts here)."""
    v = pl.col("value")
    k = int(n)
    if fn == "delta":
        return s.select(v - v.shift(k).over(UNIT)).to_series()
    if fn == "pct_change":
        return s.select(v / v.shift(k).over(UNIT) - 1).to_series()
    if fn == "ema" and not 0 <= n < 1:
        raise ReplayError(f"ema(x, w): the smoothing weight must be in [0, 1), got {n}")
    if fn not in WINDOW_STATS and fn not in SEEDED and fn != "slope":
        raise ReplayError(f"{fn}() needs a metric as its first argument")
    starts = _starts(s["rid"], s["key"])
    x = s["value"].to_numpy().astype(np.float64)
    if fn == "slope":
        out = _rolling_slope(starts, s["step"].to_numpy().astype(np.float64), x, k)
        return pl.Series(out)  # NaN (not null) before the first full window, as always
    if fn in WINDOW_STATS:
        out, valid = _window_stat(starts, x, k, WINDOW_STATS[fn])
    else:
        s0, s1 = _seed_arrays(s, seed)
        kernel = _ema if fn == "ema" else _max_first
        out, valid = kernel(starts, x, float(n), s0, s1)[:2]
    return pl.Series(out).set(pl.Series(~valid), None)


def _seed_arrays(s: pl.DataFrame, seed: pl.DataFrame | None) -> tuple[np.ndarray, np.ndarray]:
    """Per unit of `s` (in order) the seed state (s0, s1); zeros where none was given."""
    units = s.select(UNIT).unique(maintain_order=True)
    if seed is not None and seed.height:
        units = units.join(seed, on=UNIT, how="left", maintain_order="left")
    else:
        units = units.with_columns(s0=pl.lit(None, pl.Float64), s1=pl.lit(None, pl.Float64))
    return (
        units["s0"].fill_null(0.0).to_numpy().astype(np.float64),
        units["s1"].fill_null(0.0).to_numpy().astype(np.float64),
    )


def fold_seed(fn: str, n: float, s: pl.DataFrame, seed: pl.DataFrame | None) -> pl.DataFrame:
    """The seed (rid, key, s0, s1) after the points of `s`: what a seeded leaf carries past them."""
    s0, s1 = _seed_arrays(s, seed)
    kernel = _ema if fn == "ema" else _max_first
    _, _, e0, e1 = kernel(
        _starts(s["rid"], s["key"]), s["value"].to_numpy().astype(np.float64), float(n), s0, s1
    )
    return s.select(UNIT).unique(maintain_order=True).with_columns(s0=pl.Series(e0), s1=pl.Series(e1))


def _starts(rid: pl.Series, key: pl.Series) -> np.ndarray:
    """Row offsets where each (rid, key) group starts in a frame sorted by them, plus the end."""
    r, k = rid.to_numpy(), key.to_numpy()
    change = np.r_[True, (r[1:] != r[:-1]) | (k[1:] != k[:-1])] if len(r) else np.zeros(0, bool)
    return np.r_[np.flatnonzero(change), len(r)].astype(np.int64)


@njit(cache=True, nogil=True)
def _mean_std4(x, lo, k, std):
    """Mean (or std, ddof 1) of the windows x[lo:lo+k] ... x[lo+3:lo+3+k]: four sums side by
    side, each added in the order of one window alone (so bit for bit the same), which the
    processor overlaps."""
    m0 = m1 = m2 = m3 = 0.0
    for j in range(lo, lo + k):
        m0 += x[j]
        m1 += x[j + 1]
        m2 += x[j + 2]
        m3 += x[j + 3]
    m0 /= k
    m1 /= k
    m2 /= k
    m3 /= k
    if not std:
        return m0, m1, m2, m3
    s0 = s1 = s2 = s3 = 0.0
    for j in range(lo, lo + k):
        s0 += (x[j] - m0) ** 2
        s1 += (x[j + 1] - m1) ** 2
        s2 += (x[j + 2] - m2) ** 2
        s3 += (x[j + 3] - m3) ** 2
    return np.sqrt(s0 / (k - 1)), np.sqrt(s1 / (k - 1)), np.sqrt(s2 / (k - 1)), np.sqrt(s3 / (k - 1))


@njit(cache=True, nogil=True)
def _window_stat(starts, x, k, stat):
    """mean, std (ddof 1), min or max of the k values before each point, per group; a window
    holding NaN gives NaN; null (valid False) until k values came before."""
    out = np.full(x.shape[0], np.nan)
    valid = np.zeros(x.shape[0], np.bool_)
    for g in range(starts.shape[0] - 1):
        if stat >= 2:
            _window_extreme(x, starts[g], starts[g + 1], k, stat == 3, out, valid)
            continue
        rest = starts[g] + k
        if stat == 0 or (stat == 1 and k > 1):  # four points at a time, the rest one by one below
            while rest + 4 <= starts[g + 1]:
                out[rest], out[rest + 1], out[rest + 2], out[rest + 3] = _mean_std4(x, rest - k, k, stat == 1)
                valid[rest : rest + 4] = True
                rest += 4
        for i in range(rest, starts[g + 1]):
            m = 0.0
            for j in range(i - k, i):
                m += x[j]
            m /= k
            if stat == 0:
                out[i] = m
            elif k > 1:
                ss = 0.0
                for j in range(i - k, i):
                    ss += (x[j] - m) ** 2
                out[i] = np.sqrt(ss / (k - 1))
            valid[i] = stat == 0 or k > 1
    return out, valid


@njit(cache=True, nogil=True)
def _window_extreme(x, lo, hi, k, is_max, out, valid):
    """min (max) of the k values before each point of x[lo:hi] by a monotone queue of indices:
    exact, so the same as scanning each window (the earliest of equal extremes; NaN when the
    window holds one)."""
    q = np.empty(hi - lo, np.int64)
    h = t = 0
    nans = 0
    for j in range(lo, hi - 1):  # x[j] enters the window of point j + 1: x[j + 1 - k .. j]
        if np.isnan(x[j]):
            nans += 1
        else:
            while t > h and ((x[q[t - 1]] < x[j]) if is_max else (x[q[t - 1]] > x[j])):
                t -= 1
            q[t] = j
            t += 1
        if j - k >= lo and np.isnan(x[j - k]):
            nans -= 1
        while h < t and q[h] <= j - k:
            h += 1
        if j + 1 >= lo + k:
            valid[j + 1] = True
            out[j + 1] = np.nan if nans > 0 else x[q[h]]


@njit(cache=True, nogil=True)
def _ema(starts, x, w, s0, s1):
    """EMA with weight w of the values before each point (e = w·e + (1−w)·x, starting at the first
    value; NaN stays); per group seeded with (e, has) = (s0, s1). Returns out, valid, final seeds."""
    out = np.full(x.shape[0], np.nan)
    valid = np.zeros(x.shape[0], np.bool_)
    e0 = s0.copy()
    e1 = s1.copy()
    for g in range(starts.shape[0] - 1):
        e = e0[g]
        has = e1[g] > 0
        for i in range(starts[g], starts[g + 1]):
            if has:
                out[i] = e
                valid[i] = True
                e = w * e + (1.0 - w) * x[i]
            else:
                e = x[i]
                has = True
        e0[g] = e
        e1[g] = 1.0 if has else 0.0
    return out, valid, e0, e1


@njit(cache=True, nogil=True)
def _max_first(starts, x, k, s0, s1):
    """Megatron's baseline: the maximum of the first k finite values, known once k finite values
    came before; per group seeded with (running max, finite values seen) = (s0, s1)."""
    out = np.full(x.shape[0], np.nan)
    valid = np.zeros(x.shape[0], np.bool_)
    e0 = s0.copy()
    e1 = s1.copy()
    for g in range(starts.shape[0] - 1):
        mx = e0[g]
        seen = e1[g]
        for i in range(starts[g], starts[g + 1]):
            if seen >= k:
                out[i] = mx
                valid[i] = True
            elif np.isfinite(x[i]):
                mx = x[i] if seen == 0 or x[i] > mx else mx
                seen += 1
        e0[g] = mx
        e1[g] = seen
    return out, valid, e0, e1


@njit(cache=True, nogil=True)
def _rolling_slope(starts, x, y, k):
    """Least-squares slope of the last k points (this one included), per group; two passes per
    window, so large step numbers lose no precision."""
    out = np.full(y.shape[0], np.nan)
    for gi in range(starts.shape[0] - 1):
        for i in range(starts[gi] + k - 1, starts[gi + 1]):
            lo = i - k + 1
            mx = 0.0
            my = 0.0
            for j in range(lo, i + 1):
                mx += x[j]
                my += y[j]
            mx /= k
            my /= k
            sxy = 0.0
            sxx = 0.0
            for j in range(lo, i + 1):
                sxy += (x[j] - mx) * (y[j] - my)
                sxx += (x[j] - mx) ** 2
            out[i] = sxy / sxx if sxx > 0 else np.nan
    return out


def _compile(node, leaves: dict) -> pl.Expr:
    """AST -> polars expression over leaf columns (registered in `leaves`)."""
    if isinstance(node, Num):
        return pl.lit(node.value, pl.Float64)
    if isinstance(node, Name) or (isinstance(node, Call) and node.fn != "abs"):
        if isinstance(node, Call):
            if not isinstance(node.args[0], Name):
                raise ReplayError(
                    f"{node.fn}(): the first argument must be a metric or tag (windows run on logged points)"
                )
            if not isinstance(node.args[1], Num):
                raise ReplayError(
                    f"{node.fn}(): unknown parameter {node.args[1].name!r} (define it in [rule.params])"
                )
        key = repr(node)
        col = leaves.setdefault(key, (f"_l{len(leaves)}", node))[0]
        return pl.col(col)
    if isinstance(node, Call):  # abs
        return _compile(node.args[0], leaves).abs()
    if isinstance(node, Unary):
        inner = _compile(node.arg, leaves)
        return ~inner if node.op == "not" else -inner
    if isinstance(node, Binary):
        a, b = _compile(node.left, leaves), _compile(node.right, leaves)
        if node.op == "and":
            return a & b
        if node.op == "or":
            return a | b
        if node.op in language.COMPARISONS:
            # polars orders NaN above every number; here NaN compares false
            ok = ~a.is_nan() & ~b.is_nan()
            cmp = {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b, "==": a == b, "!=": a != b}[node.op]
            return cmp & ok
        return {"+": a + b, "-": a - b, "*": a * b, "/": a / b}[node.op]
    raise ReplayError(f"cannot evaluate {node!r}")


def _leaf_name(node) -> Name:
    return node if isinstance(node, Name) else node.args[0]


def _text(node) -> str:
    if isinstance(node, Name):
        return f"`{node.name}`" if node.quoted else node.name
    return f"{node.fn}({_text(node.args[0])}, {node.args[1].value:g})"


def conditions(rule: Rule, data: SeriesData) -> tuple[pl.DataFrame, list[str], list[str]]:
    """(frame rid, key, step, cond, _l0..; leaf texts; evaluable runs) for an expression rule."""
    tree = rule.ast()
    leaves: dict = {}
    expr = _compile(tree, leaves)
    frames = []  # (column, name, series frame)
    for text_key, (col, node) in leaves.items():
        name = _leaf_name(node)
        s = data.series(name)
        if isinstance(node, Call):
            ck = ("leaf", text_key)
            if ck not in data.cache:
                seed = data.seeds.get(text_key) if node.fn in SEEDED else None
                data.cache[ck] = s.with_columns(value=_leaf_values(node.fn, node.args[1].value, s, seed))
            s = data.cache[ck]
        frames.append((col, name, s))
    missing = [_text(name) for _, name, s in frames if s.is_empty()]
    if missing:
        raise ReplayError(
            f"rule {rule.id}: {', '.join(sorted(set(missing)))} found in no selected run;"
            f"{data.hint(missing)} Available {data.available()}"
        )
    # evaluable units: runs where every name resolves; with a glob, each (run, matched tag)
    rids = set.intersection(*(set(s["rid"].unique().to_list()) for _, _, s in frames))
    globbed = [s for _, name, s in frames if name.is_glob]
    units = (
        globbed[0].select(*UNIT).unique()
        if globbed
        else pl.DataFrame(
            {"rid": sorted(rids), "key": [-1] * len(rids)}, schema={"rid": pl.Int32, "key": pl.Int32}
        )
    )
    units = units.filter(pl.col("rid").is_in(sorted(rids)))
    ck = ("aligned", tuple(leaves), rule.on)
    if ck in data.cache:  # a sweep point of a rule already aligned: only the condition changes
        grid = data.cache[ck].with_columns(cond=expr.fill_null(False))
        texts = [_text(node) for _, (c, node) in leaves.items()]
        return grid.select(*UNIT, "step", "cond", *[c for c, _, _ in frames]), texts, data.run_ids(rids)
    grid = _grid(rule, data, frames, units)
    for col, name, s in frames:
        if _same_rows(grid, s, keyed=name.is_glob):  # logged at the same steps as the grid: stack, no join
            grid = grid.with_columns(s["value"].alias(col))
            continue
        by = UNIT if name.is_glob else ["rid"]
        right = s.select(*by, "step", pl.col("value").alias(col))
        if globbed and not name.is_glob:  # several tags per run: as-of needs the run's rows in step order
            grid = grid.sort("rid", "step", "key")
        grid = grid.join_asof(right, on="step", by=by, strategy="backward", check_sortedness=False)
    if globbed:
        grid = grid.sort(*UNIT, "step")
    data.cache[ck] = grid
    grid = grid.with_columns(cond=expr.fill_null(False))
    texts = [_text(node) for _, (c, node) in leaves.items()]
    return grid.select(*UNIT, "step", "cond", *[c for c, _, _ in frames]), texts, data.run_ids(rids)


def _same_rows(a: pl.DataFrame, b: pl.DataFrame, keyed: bool = True) -> bool:
    """Both frames hold the same (rid, [key,] step) rows in the same order (a series without a
    glob lines up with a glob grid when each run has one matched tag)."""
    cols = ("step", "rid", "key") if keyed else ("step", "rid")
    return a.height == b.height and all(a[c].equals(b[c]) for c in cols)


def _grid(rule: Rule, data: SeriesData, frames: list, units: pl.DataFrame) -> pl.DataFrame:
    """The steps a rule is evaluated at, per unit, sorted (cached per set of series)."""
    ck = ("grid", tuple(sorted({(n.name, n.quoted) for _, n, _ in frames})), rule.on)
    if ck in data.cache:
        return data.cache[ck]
    if rule.on:
        on = data.series(Name(rule.on, False, 0))
        if on.is_empty():
            raise ReplayError(
                f"rule {rule.id}: on = {rule.on!r} found in no selected run; available {data.available()}"
            )
        grid = units.join(on.select("rid", "step").unique(), on="rid")
    else:
        series = {(n.name, n.quoted): (n, s) for _, n, s in frames}  # one entry per distinct name
        first = next((s for n, s in series.values() if n.is_glob), next(iter(series.values()))[1])
        if all(_same_rows(first, s, keyed=n.is_glob) for n, s in series.values()):
            grid = first.select(*UNIT, "step")  # logged together: any one is the grid
            if len(_starts(first["rid"], first["key"])) - 1 == units.height:
                data.cache[ck] = grid  # every unit evaluable (units are a subset): sorted already
                return grid
            grid = grid.join(units, on=UNIT, how="semi")
        else:
            parts = [
                (
                    s.select(*UNIT, "step") if n.is_glob else units.join(s.select("rid", "step"), on="rid")
                ).join(units, on=UNIT, how="semi")
                for n, s in series.values()
            ]
            grid = parts[0] if len(parts) == 1 else pl.concat(parts).unique()
    grid = grid.sort(*UNIT, "step")
    data.cache[ck] = grid
    return grid


# Per unit, what the streak pass carries from one stretch of rows to the next (a live watch
# evaluates a run a few new steps at a time): the current run of true steps (length, first
# step), the latest alert's end, and the rows evaluated so far (for warm-up). A replay starts
# every unit from zeros, so both compute the same alerts by the same code.
STREAK_STATE = {
    "run": pl.Int64,
    "first": pl.Int64,
    "has_last": pl.Int64,
    "last_end": pl.Int64,
    "seen": pl.Int64,
}


@njit(cache=True, nogil=True)
def _streak_alerts(starts, steps, cond, warmup, k, cooldown, run, first, has_last, last_end, seen):
    """One pass per group: runs of true steps become alerts once they last k steps; a firing
    within `cooldown` steps of the previous alert's end extends that alert instead.
    The state arrays (one entry per group, see STREAK_STATE) are updated in place. Returns, per
    alert touched: group, start step, the row where it fired and its end step; a fired row of -1
    is the group's alert from before these rows, extended."""
    cap = 64
    a_group = np.empty(cap, np.int64)
    a_start = np.empty(cap, np.int64)
    a_fired = np.empty(cap, np.int64)
    a_end = np.empty(cap, np.int64)
    n = 0
    for g in range(starts.shape[0] - 1):
        r = run[g]
        f = first[g]
        le = last_end[g]
        latest = -1 if has_last[g] > 0 else -2  # -1: the alert from before these rows; >= 0: a new one
        for i in range(starts[g], starts[g + 1]):
            if cond[i] and seen[g] >= warmup:
                if r == 0:
                    f = steps[i]
                r += 1
                new = r == k and not (latest != -2 and steps[i] - le <= cooldown)
                extend_carried = r >= k and latest == -1 and not new
                if new or (extend_carried and (n == 0 or a_group[n - 1] != g or a_fired[n - 1] != -1)):
                    if n == cap:
                        cap *= 2
                        a_group = np.concatenate((a_group, np.empty(cap - n, np.int64)))
                        a_start = np.concatenate((a_start, np.empty(cap - n, np.int64)))
                        a_fired = np.concatenate((a_fired, np.empty(cap - n, np.int64)))
                        a_end = np.concatenate((a_end, np.empty(cap - n, np.int64)))
                    a_group[n] = g
                    a_start[n] = f if new else -1
                    a_fired[n] = i if new else -1
                    n += 1
                    if new:
                        latest = n - 1
                if r >= k:
                    a_end[latest if latest >= 0 else n - 1] = steps[i]
                    le = steps[i]
            else:
                r = 0
            seen[g] += 1
        run[g] = r
        first[g] = f
        last_end[g] = le
        has_last[g] = 1 if latest != -2 else 0
    return a_group[:n], a_start[:n], a_fired[:n], a_end[:n]


def zero_state(units: int) -> dict[str, np.ndarray]:
    return {c: np.zeros(units, np.int64) for c in STREAK_STATE}


def stream_alerts(
    rule: Rule, frame: pl.DataFrame, texts: list[str], data: SeriesData, state: dict[str, np.ndarray]
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Streaks of true steps -> alert intervals (frame sorted by rid, key, step), continuing
    from `state` (one entry per unit of the frame, in order; updated in place).

    Returns the new alerts, and the alerts from before that these rows extended (rid, key,
    step_end)."""
    leaf_cols = [c for c in frame.columns if c.startswith("_l")]
    extended = pl.DataFrame(schema={"rid": pl.Int32, "key": pl.Int32, "step_end": pl.Int64})
    if frame.is_empty():
        return pl.DataFrame(schema=ALERT_SCHEMA), extended
    starts = _starts(frame["rid"], frame["key"])
    steps = frame["step"].to_numpy()
    group, start, fired, end = _streak_alerts(
        starts,
        steps,
        frame["cond"].to_numpy(),
        int(rule.warmup),
        int(rule.for_steps),
        int(rule.cooldown),
        *(state[c] for c in STREAK_STATE),
    )
    if not len(group):
        return pl.DataFrame(schema=ALERT_SCHEMA), extended
    first_rows = starts[:-1][group]
    carried = fired < 0
    if carried.any():
        extended = pl.DataFrame(
            {
                "rid": frame["rid"].gather(first_rows[carried]),
                "key": frame["key"].gather(first_rows[carried]),
                "step_end": end[carried],
            }
        )
    fired, start, end, first_rows = fired[~carried], start[~carried], end[~carried], first_rows[~carried]
    merged = pl.DataFrame(
        {
            "rid": frame["rid"].gather(first_rows),
            "key": frame["key"].gather(first_rows),
            "step_start": start,
            "step_fired": steps[fired],
            "step_end": end,
            **{c: frame[c].gather(fired) for c in leaf_cols},
        }
    )
    if merged.is_empty():
        return pl.DataFrame(schema=ALERT_SCHEMA), extended
    msg = pl.concat_str(
        [pl.lit(f"{rule.id}: ")]
        + [
            e
            for i, c in enumerate(leaf_cols)
            for e in (
                (pl.lit(", ") if i else pl.lit("")),
                pl.lit(f"{texts[i]}="),
                pl.col(c).round_sig_figs(4).cast(pl.String).fill_null("null"),
            )
        ]
    )
    alerts = merged.select(
        run_id=pl.col("rid").replace_strict(data.run_name, return_dtype=pl.String),
        rule=pl.lit(rule.id),
        tag=pl.col("key").replace_strict({-1: "", **data.tag_name}, return_dtype=pl.String),
        step_start="step_start",
        step_fired="step_fired",
        step_end="step_end",
        value=pl.col(leaf_cols[0]) if leaf_cols else pl.lit(None, pl.Float64),
        message=msg,
        params=pl.lit(rule.params_json),
        severity=pl.lit(rule.severity),
    ).cast(ALERT_SCHEMA)
    return alerts, extended


def alerts_from(rule: Rule, frame: pl.DataFrame, texts: list[str], data: SeriesData) -> pl.DataFrame:
    """Streaks of true steps -> alert intervals (frame sorted by rid, key, step)."""
    units = len(_starts(frame["rid"], frame["key"])) - 1
    return stream_alerts(rule, frame, texts, data, zero_state(units))[0]


def evaluate(rule: Rule, data: SeriesData) -> tuple[pl.DataFrame, list[str]]:
    """Alerts of one rule (one parameter point) over the loaded runs, and the runs where it was
    evaluable. Raises ReplayError when it is evaluable nowhere."""
    if rule.when is None:
        frame, texts, runs_ok = rule.detector.conditions(data)
    else:
        frame, texts, runs_ok = conditions(rule, data)
    return alerts_from(rule, frame, texts, data), runs_ok
