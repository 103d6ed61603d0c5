"""A rule's condition compiled to polars: the AST becomes an expression over leaf columns, and
the leaves are aligned on the grid of steps the rule is evaluated at (`conditions`).
"""

from __future__ import annotations

import polars as pl

from detectors import language
from detectors.language import Binary, Call, Name, Num, Unary
from detectors.rules import Rule
from detectors.series import UNIT, ReplayError, SeriesData, group_starts, peer_group
from detectors.windows import SEEDED, leaf_values, peer_z


def _compile(node, leaves: dict) -> pl.Expr:
    """AST -> polars expression over leaf columns (registered in `leaves`)."""
    if isinstance(node, Num):
        return pl.lit(node.value, pl.Float64)
    if isinstance(node, Name) or (isinstance(node, Call) and node.fn != "abs"):
        if isinstance(node, Call) and node.fn in language.PEER:
            if not isinstance(node.args[0], Name):
                raise ReplayError(f"{node.fn}(): the argument must be a metric or tag")
        elif isinstance(node, Call):
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
    if len(node.args) == 1:
        return f"{node.fn}({_text(node.args[0])})"
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
            ck: tuple = ("leaf", text_key)
            if ck not in data.cache and node.fn in language.PEER:
                data.cache[ck] = s.with_columns(value=peer_z(s, run_groups(data, s)))
            elif ck not in data.cache:
                seed = data.seeds.get(text_key) if node.fn in SEEDED else None
                data.cache[ck] = s.with_columns(value=leaf_values(node.fn, node.args[1].value, s, seed))
            s = data.cache[ck]
        frames.append((col, name, s))
    if not frames:  # a rule made in code, not read from a file (rules_from_text refuses these)
        raise ReplayError(
            f"rule {rule.id}: {rule.when!r} reads no series; a rule needs a metric or tag to watch"
        )
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


def run_groups(data: SeriesData, s: pl.DataFrame) -> pl.DataFrame:
    """(rid, group) for the runs of `s` (`peer_group`: the folder of its run id)."""
    rids = s["rid"].unique().sort()
    return pl.DataFrame(
        {"rid": rids, "group": [peer_group(data.run_name[i]) for i in rids.to_list()]},
        schema={"rid": pl.Int32, "group": pl.String},
    )


def rule_conditions(rule: Rule, data: SeriesData) -> tuple[pl.DataFrame, list[str], list[str]]:
    """`conditions` of any rule: compiled from its `when`, or computed by its code detector."""
    if rule.when is None:
        assert rule.detector is not None, f"{rule.id} has neither a `when` nor a detector"
        return rule.detector.conditions(data)
    return conditions(rule, data)


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
            if len(group_starts(first["rid"], first["key"])) - 1 == units.height:
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
