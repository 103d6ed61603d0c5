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
from numba import njit

from detectors import language
from detectors.language import Binary, Call, Name, Num, Unary
from detectors.rules import Rule
from workbench.errors import WorkbenchError
from workbench.store import aliases, schema

UNIT = ["rid", "key"]  # an evaluation unit: a run, or a run and a tag for glob rules
ALERT_SCHEMA = schema.ALERTS


class ReplayError(WorkbenchError):
    """A rule that cannot be evaluated on the selection (says what is available)."""


@dataclass
class SeriesData:
    """The points a replay needs: (run_id, tag, metric, step, value), current points only.

    Inside, runs and tags are integer codes (`rid`, `tid`) and points are split by tag once, so
    that resolving a name, sorting and joining never touch strings. Code detectors read
    `tags_frame` (rid, tid, run_id, tag, metric, n: one row per run and tag), `series(name)`,
    `events`, `run_codes` and `run_ids(rids)`.
    """

    points: pl.DataFrame
    events: pl.DataFrame = field(
        default_factory=lambda: pl.DataFrame(
            schema={"run_id": pl.String, "step": pl.Int64, "kind": pl.String, "attrs": pl.String}
        )
    )
    runs: list[str] = field(default_factory=list)

    def __post_init__(self):
        pts = self.points.select(
            pl.col("run_id").cast(pl.String),
            pl.col("tag").cast(pl.String),
            pl.col("metric").cast(pl.String),
            pl.col("step").cast(pl.Int64),
            pl.col("value").cast(pl.Float64),
        )
        if not self.runs:
            self.runs = sorted(pts["run_id"].unique().to_list())
        # integer codes from a categorical encoding (hashing, no joins over the points)
        coded = pts.with_columns(
            rid=pl.col("run_id").cast(pl.Categorical).to_physical().cast(pl.Int32),
            tid=pl.col("tag").cast(pl.Categorical).to_physical().cast(pl.Int32),
        )
        self.tags_frame = coded.group_by("rid", "tid").agg(
            pl.col("run_id", "tag", "metric").first(), n=pl.len()
        )
        self._run_code = dict(
            zip(
                *self.tags_frame.select("run_id", "rid").unique().to_dict(as_series=False).values(),
                strict=True,
            )
        )
        extra = [r for r in self.runs if r not in self._run_code]  # selected runs with no points
        base = max(self._run_code.values(), default=-1) + 1
        self._run_code.update({r: base + i for i, r in enumerate(extra)})
        self.run_name = {c: r for r, c in self._run_code.items()}
        self.tag_name = dict(
            zip(*self.tags_frame.select("tid", "tag").unique().to_dict(as_series=False).values(), strict=True)
        )
        self.tag_names = sorted(self.tag_name.values())
        self._by_tag = {
            k[0]: v.select("rid", "step", "value").sort("rid", "step")
            for k, v in coded.select("rid", "tid", "step", "value").partition_by("tid", as_dict=True).items()
        }
        self.points = pts
        self.cache: dict = {}  # per loaded batch: series, leaves and grids shared by rules and sweep points

    @property
    def run_codes(self) -> pl.DataFrame:
        return pl.DataFrame(
            {"run_id": list(self._run_code), "rid": list(self._run_code.values())},
            schema={"run_id": pl.String, "rid": pl.Int32},
        )

    def resolve(self, name: Name) -> pl.DataFrame:
        """(rid, tid, key) rows: which tag stands for `name` in each run (key = tid for globs, else -1)."""
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
def _leaf_expr(fn: str, n: float) -> pl.Expr:
    v, g = pl.col("value"), UNIT
    k = int(n)
    past = v.shift(1).over(g)
    if fn == "mean":
        return v.shift(1).rolling_mean(k).over(g)
    if fn == "std":
        return v.shift(1).rolling_std(k).over(g)
    if fn == "min":
        return v.shift(1).rolling_min(k).over(g)
    if fn == "max":
        return v.shift(1).rolling_max(k).over(g)
    if fn == "ema":
        if not 0 <= n < 1:
            raise ReplayError(f"ema(x, w): the smoothing weight must be in [0, 1), got {n}")
        return past.ewm_mean(alpha=1 - n, adjust=False).over(g)
    if fn == "delta":
        return v - v.shift(k).over(g)
    if fn == "pct_change":
        return v / v.shift(k).over(g) - 1
    if fn == "slope" and k <= 512:
        return pl.struct("rid", "key", "step", "value").map_batches(
            lambda s: pl.Series(
                _rolling_slope(
                    _starts(s.struct.field("rid"), s.struct.field("key")),
                    s.struct.field("step").to_numpy().astype(np.float64),
                    s.struct.field("value").to_numpy().astype(np.float64),
                    k,
                )
            ),
            return_dtype=pl.Float64,
        )
    if fn == "slope":
        x = pl.col("step").cast(pl.Float64) - pl.col("step").first().over(g)
        sx, sy = x.rolling_sum(k).over(g), v.rolling_sum(k).over(g)
        sxx, sxy = (x * x).rolling_sum(k).over(g), (x * v).rolling_sum(k).over(g)
        return (k * sxy - sx * sy) / (k * sxx - sx * sx)
    if fn == "max_first":  # Megatron: after the first k finite values, their maximum
        fin = v.is_finite()
        rank = fin.cast(pl.Int64).cum_sum().over(g)
        baseline = pl.when(fin & (rank <= k)).then(v).max().over(g)
        return pl.when(rank - fin.cast(pl.Int64) >= k).then(baseline)
    raise ReplayError(f"{fn}() needs a metric as its first argument")


def _starts(rid: pl.Series, key: pl.Series) -> np.ndarray:
    change = (rid.diff().fill_null(1) != 0) | (key.diff().fill_null(1) != 0)
    return np.r_[np.flatnonzero(change.to_numpy()), len(rid)].astype(np.int64)


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
                data.cache[ck] = s.with_columns(value=_leaf_expr(node.fn, node.args[1].value))
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
        grid = grid.join_asof(right, on="step", by=by, strategy="backward", check_sortedness=False)
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
            grid = first.select(*UNIT, "step").join(
                units, on=UNIT, how="semi"
            )  # logged together: any one is the grid
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


@njit(cache=True, nogil=True)
def _streak_alerts(starts, steps, cond, warmup, k, cooldown):
    """One pass per group: runs of true steps become alerts once they last k steps; a firing
    within `cooldown` steps of the previous alert's end extends that alert instead.
    Returns row indices (start, fired, end) of each alert."""
    cap = 64
    a_start = np.empty(cap, np.int64)
    a_fired = np.empty(cap, np.int64)
    a_end = np.empty(cap, np.int64)
    n = 0
    for g in range(starts.shape[0] - 1):
        run = 0
        first = -1
        current = -1  # the alert the ongoing streak belongs to, once it fired
        last = -1  # this group's latest alert
        for i in range(starts[g], starts[g + 1]):
            if cond[i] and i - starts[g] >= warmup:
                if run == 0:
                    first = i
                run += 1
                if run == k:
                    if last >= 0 and steps[i] - steps[a_end[last]] <= cooldown:
                        current = last
                    else:
                        if n == cap:
                            cap *= 2
                            a_start = np.concatenate((a_start, np.empty(cap - n, np.int64)))
                            a_fired = np.concatenate((a_fired, np.empty(cap - n, np.int64)))
                            a_end = np.concatenate((a_end, np.empty(cap - n, np.int64)))
                        a_start[n] = first
                        a_fired[n] = i
                        current = n
                        last = n
                        n += 1
                if run >= k:
                    a_end[current] = i
            else:
                run = 0
    return a_start[:n], a_fired[:n], a_end[:n]


def alerts_from(rule: Rule, frame: pl.DataFrame, texts: list[str], data: SeriesData) -> pl.DataFrame:
    """Streaks of true steps -> alert intervals (frame sorted by rid, key, step)."""
    leaf_cols = [c for c in frame.columns if c.startswith("_l")]
    if frame.is_empty():
        return pl.DataFrame(schema=ALERT_SCHEMA)
    steps = frame["step"].to_numpy()
    start, fired, end = _streak_alerts(
        _starts(frame["rid"], frame["key"]),
        steps,
        frame["cond"].to_numpy(),
        int(rule.warmup),
        int(rule.for_steps),
        int(rule.cooldown),
    )
    merged = pl.DataFrame(
        {
            "rid": frame["rid"].gather(start),
            "key": frame["key"].gather(start),
            "step_start": steps[start],
            "step_fired": steps[fired],
            "step_end": steps[end],
            **{c: frame[c].gather(fired) for c in leaf_cols},
        }
    )
    if merged.is_empty():
        return pl.DataFrame(schema=ALERT_SCHEMA)
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
    return merged.select(
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


def evaluate(rule: Rule, data: SeriesData) -> tuple[pl.DataFrame, list[str]]:
    """Alerts of one rule (one parameter point) over the loaded runs, and the runs where it was
    evaluable. Raises ReplayError when it is evaluable nowhere."""
    if rule.when is None:
        frame, texts, runs_ok = rule.detector.conditions(data)
    else:
        frame, texts, runs_ok = conditions(rule, data)
    return alerts_from(rule, frame, texts, data), runs_ok
