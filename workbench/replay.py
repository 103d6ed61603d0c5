"""Replay rules over stored runs exactly as they would have fired live, vectorised with polars.

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

import fnmatch
from dataclasses import dataclass, field

import polars as pl

from detectors import language
from detectors.language import Binary, Call, Name, Num, Unary
from detectors.rules import Rule
from workbench import schema

UNIT = ["run_id", "key"]
ALERT_SCHEMA = schema.ALERTS


class ReplayError(ValueError):
    """A rule that cannot be evaluated on the selection (says what is available)."""


@dataclass
class SeriesData:
    """The points a replay needs: (run_id, tag, metric, step, value), current points only."""

    points: pl.DataFrame
    events: pl.DataFrame = field(
        default_factory=lambda: pl.DataFrame(
            schema={"run_id": pl.String, "step": pl.Int64, "kind": pl.String, "attrs": pl.String}
        )
    )
    runs: list[str] = field(default_factory=list)

    def __post_init__(self):
        self.points = self.points.select(
            pl.col("run_id").cast(pl.String),
            pl.col("tag").cast(pl.String),
            pl.col("metric").cast(pl.String),
            pl.col("step").cast(pl.Int64),
            pl.col("value").cast(pl.Float64),
        ).sort("run_id", "tag", "step")
        if not self.runs:
            self.runs = sorted(self.points["run_id"].unique().to_list())
        self._tags = self.points.group_by("run_id", "tag", "metric").agg(n=pl.len())
        self._cache: dict = {}

    def resolve(self, name: Name) -> pl.DataFrame:
        """(run_id, tag, key) rows: which tag stands for `name` in each run (key = tag for globs)."""
        t = self._tags
        if name.is_glob:
            regex = "^" + fnmatch.translate(name.name).removeprefix("(?s:").removesuffix(")\\Z") + "$"
            hit = t.filter(pl.col("tag").str.contains(regex))
            return hit.select("run_id", "tag", key=pl.col("tag")).unique().sort("run_id", "tag")
        if name.quoted:
            hit = t.filter(pl.col("tag") == name.name)
        else:  # a canonical metric, else a tag; per run prefer the tag spelled like the name, then the longest
            hit = t.filter((pl.col("metric") == name.name) | (pl.col("tag") == name.name))
            hit = (
                hit.sort(pl.col("tag") != name.name, -pl.col("n").cast(pl.Int64), "tag")
                .group_by("run_id", maintain_order=True)
                .first()
            )
        return hit.select("run_id", "tag", key=pl.lit("")).unique().sort("run_id")

    def series(self, name: Name) -> pl.DataFrame:
        """(run_id, key, step, value) of a name, sorted."""
        ck = ("series", name.name, name.quoted)
        if ck not in self._cache:
            r = self.resolve(name)
            self._cache[ck] = (
                self.points.join(r, on=["run_id", "tag"], how="inner")
                .select(*UNIT, "step", "value")
                .sort(*UNIT, "step")
            )
        return self._cache[ck]

    def hint(self, missing: list[str]) -> str:
        """Tags a missing name was probably meant to be (a/b without backticks divides)."""
        tags = self._tags["tag"].unique().to_list()
        near = sorted({t for t in tags for m in missing if m and ("/" + m in t or m + "/" in t)})
        return (
            f" Did you mean {', '.join('`' + t + '`' for t in near[:3])}? Tags with '/' go in backticks."
            if near
            else ""
        )

    def available(self) -> str:
        metrics = sorted(self._tags["metric"].drop_nulls().unique().to_list())
        tags = sorted(self._tags["tag"].unique().to_list())
        shown = ", ".join(tags[:25]) + (f", ... ({len(tags)} tags)" if len(tags) > 25 else "")
        return f"metrics: {', '.join(metrics) or '-'}; tags: {shown or '-'}"


def load(store, runs_glob: str | None = None) -> SeriesData:
    """Every current point of the selected runs (for big stores, replay per batch of runs)."""
    con = store.connect()
    where = "" if not runs_glob else f"WHERE run_id GLOB '{runs_glob.replace(chr(39), chr(39) * 2)}'"
    pts = con.sql(f"SELECT run_id, tag, metric, step, value FROM scalars {where}").pl()
    ev = con.sql(f"SELECT run_id, step, kind, attrs FROM events {where}").pl()
    runs = con.sql(f"SELECT run_id FROM runs {where} ORDER BY run_id").pl()["run_id"].to_list()
    return SeriesData(pts, ev, runs)


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


@dataclass
class _Compiled:
    expr: pl.Expr
    leaves: dict  # column name -> (leaf AST, display text)


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
    """(frame run_id, key, step, cond, _l0.. ; leaf texts; evaluable runs) for an expression rule."""
    tree = rule.ast()
    leaves: dict = {}
    expr = _compile(tree, leaves)
    cols = []
    frames = []
    glob_keys = None
    for _key, (col, node) in leaves.items():
        name = _leaf_name(node)
        s = data.series(name)
        if isinstance(node, Call):
            cache_key = ("leaf", _key)
            if cache_key not in data._cache:
                data._cache[cache_key] = s.with_columns(value=_leaf_expr(node.fn, node.args[1].value))
            s = data._cache[cache_key]
        frames.append((col, name, s))
        cols.append(col)
        if name.is_glob:
            glob_keys = s.select(*UNIT).unique()
    missing_everywhere = [
        _text(_leaf_name(n)) for _, (c, n) in leaves.items() if data.series(_leaf_name(n)).is_empty()
    ]
    if missing_everywhere:
        raise ReplayError(
            f"rule {rule.id}: {', '.join(sorted(set(missing_everywhere)))} found in no selected run;"
            f"{data.hint(missing_everywhere)} Available {data.available()}"
        )
    # evaluable units: runs where every name resolves
    runs_ok = None
    for _, name, s in frames:
        r = set(s["run_id"].unique().to_list())
        runs_ok = r if runs_ok is None else runs_ok & r
    runs_ok = runs_ok or set()
    units = (
        glob_keys.filter(pl.col("run_id").is_in(list(runs_ok)))
        if glob_keys is not None
        else pl.DataFrame(
            {"run_id": sorted(runs_ok), "key": [""] * len(runs_ok)},
            schema={"run_id": pl.String, "key": pl.String},
        )
    )
    # the grid
    if rule.on:
        on = data.series(Name(rule.on, False, 0))
        if on.is_empty():
            raise ReplayError(
                f"rule {rule.id}: on = {rule.on!r} found in no selected run; available {data.available()}"
            )
        grid = units.join(on.select("run_id", "step").unique(), on="run_id")
    else:
        parts = []
        for _, name, s in frames:
            keyed = (
                s.select(*UNIT, "step")
                if name.is_glob
                else units.join(s.select("run_id", "step"), on="run_id")
            )
            parts.append(keyed.join(units, on=UNIT, how="semi"))
        grid = pl.concat(parts).unique()
    grid = grid.sort(*UNIT, "step")
    for col, name, s in frames:
        right = (
            s.select(*UNIT, "step", pl.col("value").alias(col))
            if name.is_glob
            else s.select("run_id", "step", pl.col("value").alias(col))
        )
        grid = grid.join_asof(
            right.sort(*(UNIT if name.is_glob else ["run_id"]), "step"),
            on="step",
            by=UNIT if name.is_glob else ["run_id"],
            strategy="backward",
            check_sortedness=False,
        )
    grid = grid.with_columns(cond=expr.fill_null(False))
    texts = [_text(n) for _, (c, n) in leaves.items()]
    return grid.select(*UNIT, "step", "cond", *cols), texts, sorted(runs_ok)


def alerts_from(rule: Rule, frame: pl.DataFrame, texts: list[str]) -> pl.DataFrame:
    """Streaks of true steps -> alert intervals (vectorised)."""
    leaf_cols = [c for c in frame.columns if c.startswith("_l")]
    g = UNIT
    f = frame.sort(*g, "step").with_columns(idx=pl.int_range(pl.len()).over(g))
    f = f.with_columns(cond=pl.col("cond") & (pl.col("idx") >= rule.warmup))
    f = f.with_columns(
        streak=(pl.col("cond") != pl.col("cond").shift(1).over(g)).fill_null(True).cum_sum().over(g)
    )
    k = rule.for_steps
    streaks = (
        f.filter("cond")
        .group_by(*g, "streak")
        .agg(
            n=pl.len(),
            step_start=pl.col("step").first(),
            step_end=pl.col("step").last(),
            step_fired=pl.col("step").slice(k - 1, 1).first(),
            **{c: pl.col(c).slice(k - 1, 1).first() for c in leaf_cols},
        )
        .filter(pl.col("n") >= k)
        .sort(*g, "step_start")
    )
    # cooldown: a new firing within `cooldown` steps of the previous alert's end joins it
    prev_end = pl.col("step_end").shift(1).over(g)
    streaks = streaks.with_columns(
        grp=(prev_end.is_null() | (pl.col("step_fired") - prev_end > rule.cooldown)).cum_sum().over(g)
    )
    merged = streaks.group_by(*g, "grp").agg(
        pl.col("step_start").first(),
        pl.col("step_fired").first(),
        pl.col("step_end").max(),
        *[pl.col(c).first() for c in leaf_cols],
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
                pl.col(c).map_elements(lambda x: f"{x:.4g}", return_dtype=pl.String).fill_null("null"),
            )
        ]
    )
    return (
        merged.sort(*g, "step_start")
        .select(
            "run_id",
            rule=pl.lit(rule.id),
            tag=pl.col("key"),
            step_start="step_start",
            step_fired="step_fired",
            step_end="step_end",
            value=pl.col(leaf_cols[0]) if leaf_cols else pl.lit(None, pl.Float64),
            message=msg,
            params=pl.lit(rule.params_json),
            severity=pl.lit(rule.severity),
        )
        .cast(ALERT_SCHEMA)
    )


@dataclass
class ReplayResult:
    alerts: pl.DataFrame
    evaluable: dict[str, list[str]]  # rule id (with params) -> runs where it could be evaluated
    runs: list[str]


def replay_rule(rule: Rule, data: SeriesData) -> tuple[pl.DataFrame, list[str]]:
    """Alerts of one rule (one parameter point) and the runs where it was evaluable."""
    if rule.when is None:
        frame, texts, runs_ok = rule.detector.conditions(data)
    else:
        frame, texts, runs_ok = conditions(rule, data)
    return alerts_from(rule, frame, texts), runs_ok


def replay(rules: list[Rule], data: SeriesData) -> ReplayResult:
    out, evaluable = [], {}
    for rule in rules:
        for point in rule.sweep_points():
            alerts, runs_ok = replay_rule(point, data)
            out.append(alerts)
            evaluable[f"{point.id} {point.params_json}"] = runs_ok
    alerts = pl.concat(out) if out else pl.DataFrame(schema=ALERT_SCHEMA)
    return ReplayResult(alerts.sort("run_id", "rule", "params", "step_start"), evaluable, data.runs)


def default_rules() -> list[Rule]:
    """The built-in detectors and the guides' rule set (detectors/guides.toml)."""
    from pathlib import Path

    from detectors.builtins import builtin_rules
    from detectors.rules import load_rule_file

    return builtin_rules() + load_rule_file(
        Path(__file__).resolve().parent.parent / "detectors" / "guides.toml"
    )


def run_replay(store, rules: list[Rule] | None, runs_glob: str | None) -> tuple[ReplayResult, dict[str, str]]:
    """Replay (each rule at its own parameters) and store the alerts; returns the result and,
    for default rules that could not be evaluated on this selection, why."""
    explicit = rules is not None
    rules = rules if explicit else default_rules()
    data = load(store, runs_glob)
    if not data.runs:
        raise ReplayError(f"no runs match {runs_glob!r}; list them with: workbench runs")
    out, evaluable, skipped = [], {}, {}
    for rule in rules:
        try:
            alerts, runs_ok = replay_rule(rule, data)
        except ReplayError as e:
            if explicit:
                raise
            skipped[rule.id] = str(e)
            continue
        out.append(alerts)
        evaluable[rule.id] = runs_ok
    alerts = pl.concat(out) if out else pl.DataFrame(schema=ALERT_SCHEMA)
    result = ReplayResult(alerts.sort("run_id", "rule", "step_start"), evaluable, data.runs)
    with store.writer() as w:
        w.set_alerts([r.id for r in rules], data.runs, result.alerts)
        w.commit()
    return result, skipped
