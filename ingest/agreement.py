"""Cross-source agreement: when two sources of a run log the same canonical metric (TensorBoard
and the console, trainer_state and JSONL, a monitor CSV and the engine's own lines), do they say
the same thing at the same step?

For each run, canonical metric and pair of sources (each source represented by its tag for the
metric with the most points), the alignment `b_step = a_step * scale + offset` that makes the
most common steps agree is found among: the identity, off by one either way, and the ratio of
their step ranges (an x axis in samples instead of steps). Values agree when they are equal to
1e-3 relative (console text prints 4 significant digits; TensorBoard keeps float32) or both
non-finite. The verdict: `ok` (the identity, >= 99 % agree), `offset`/`scaled` (another alignment
agrees: one reader puts the points on the wrong step), `disagree` (nothing agrees >= 99 %), or
`few` (fewer than 3 common steps: no verdict). Anything but ok and few is a problem that names
both sources: it is how a user learns that a reader is wrong on their logs. Sources that agree
log one series: the `scalars` view keeps the stronger source's row at a step both log (HF's
trainer_state `loss` over its TensorBoard callback's `train/loss`), and `superseded` counts the
rows that leaves out. Derived series
(`derived/...`, rebuilt from notices whose step is only known to the next printed step) are not
compared.
"""

from __future__ import annotations

import duckdb
import numpy as np
import polars as pl

from workbench.store import reads
from workbench.store.schema import AGREEMENT

RTOL = 1e-3
AGREE = 0.99
MIN_COMMON = 3


def build(con: duckdb.DuckDBPyConnection, previous: pl.DataFrame, changed: set[str]) -> pl.DataFrame:
    """Agreement rows for the runs whose files changed; the other runs keep their rows (a
    `derive` hook of the store's commit)."""
    keep = previous.filter(~pl.col("run_id").is_in(sorted(changed)))
    # runs where several sources log one metric, from the chunk lists (no point is read for
    # the many runs with one source)
    multi = reads.multi_source_metric_runs(sorted(changed)).rows(con)
    if not multi:
        return keep.sort("run_id", "metric", "source_a", "source_b")
    pts = reads.agreement_points(sorted(r for (r,) in multi)).frame(con)
    rank = dict(reads.source_ranks().rows(con))
    rows: list[dict] = []
    for (run, metric), g in pts.group_by("run_id", "metric", maintain_order=True):
        series = {
            src: (s["tag"][0], _main_file(s), s["step"].to_numpy(), s["value"].to_numpy())
            for (src,), s in g.group_by("source", maintain_order=True)
        }
        names = sorted(series)
        pairs = {
            (a, b): {"run_id": run, "metric": metric, **compare(a, series[a], b, series[b])}
            for i, a in enumerate(names)
            for b in names[i + 1 :]
        }
        count_superseded(pairs, series, rank)
        rows += pairs.values()
    new = pl.DataFrame(rows, schema=AGREEMENT) if rows else pl.DataFrame(schema=AGREEMENT)
    return pl.concat([keep, new]).sort("run_id", "metric", "source_a", "source_b")


def count_superseded(
    pairs: dict[tuple[str, str], dict], series: dict[str, tuple], rank: dict[str, int]
) -> None:
    """Each pair's `superseded`, as the `scalars` view ranks agreeing sources: among sources
    joined by ok pairs, the strongest (lowest precedence, then tag) that logs a step keeps it;
    every other one's point there is superseded, counted on its pair with that strongest one."""
    for row in pairs.values():
        row["superseded"] = 0
    group = {s: s for s in series}  # union-find over the ok pairs

    def find(s: str) -> str:
        while group[s] != s:
            s = group[s]
        return s

    for (a, b), row in pairs.items():
        if row["verdict"] == "ok":
            group[find(a)] = find(b)
    order = sorted(series, key=lambda s: (rank.get(s, 1_000_000), series[s][0]))
    held: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # group -> (steps kept, index of their keeper)
    for i, src in enumerate(order):
        steps, keepers = held.get(find(src), (np.zeros(0, np.int64), np.zeros(0, np.int64)))
        mine = np.unique(series[src][2])
        taken = np.isin(mine, steps, assume_unique=True)
        keeper = keepers[np.searchsorted(steps, mine[taken])]
        for k, n in zip(*np.unique(keeper, return_counts=True), strict=True):
            a, b = sorted((order[int(k)], src))
            pairs[(a, b)]["superseded"] += int(n)
        new = mine[~taken]
        steps, keepers = np.concatenate([steps, new]), np.concatenate([keepers, np.full(len(new), i)])
        by_step = np.argsort(steps, kind="stable")
        held[find(src)] = (steps[by_step], keepers[by_step])


def _main_file(s: pl.DataFrame) -> str:
    return (
        s.group_by("source_file").len().sort("len", "source_file", descending=[True, False])["source_file"][0]
    )


def compare(a: str, series_a: tuple, b: str, series_b: tuple) -> dict:
    """The verdict on one pair of sources of one metric (series: tag, file, steps, values)."""
    tag_a, file_a, sa, va = series_a
    tag_b, file_b, sb, vb = series_b
    candidates = [(1, 0), (1, -1), (1, 1)]
    if len(sa) and len(sb) and sa.max() > 0 and sb.max() > 0:
        ratio = sb.max() / sa.max()
        for k in (round(ratio), round(1 / ratio)):
            if k > 1:  # b counts k times finer (samples) or coarser than a
                candidates.append((k, 0) if ratio > 1 else (-k, 0))
    scored = [(cand, *_agreement(sa, va, sb, vb, *cand)) for cand in candidates]
    (scale, offset), common, agree = max(scored, key=lambda x: (x[2] if x[1] >= MIN_COMMON else -1, x[1]))
    ident_common, ident_agree = scored[0][1], scored[0][2]
    if max(common, ident_common) < MIN_COMMON:
        verdict = "few"
    elif ident_common >= MIN_COMMON and ident_agree >= AGREE:
        verdict, scale, offset, common, agree = "ok", 1, 0, ident_common, ident_agree
    elif agree >= AGREE:
        verdict = "scaled" if scale != 1 else "offset"
    else:
        verdict = "disagree"
    return {
        "source_a": a,
        "tag_a": tag_a,
        "path_a": file_a,
        "source_b": b,
        "tag_b": tag_b,
        "path_b": file_b,
        "step_scale": scale,
        "step_offset": offset,
        "common_steps": common,
        "agree": round(agree, 4),
        "verdict": verdict,
    }


def _agreement(sa, va, sb, vb, scale: int, offset: int) -> tuple[int, float]:
    """(common steps, share of them whose values agree) when a's step s is b's step s*scale+offset
    (a negative scale: a's step s is b's step s // -scale, i.e. a is the finer axis)."""
    mapped = sa * scale + offset if scale > 0 else np.where(sa % -scale == 0, sa // -scale, -(2**62))
    both, ia, ib = np.intersect1d(mapped, sb, return_indices=True)
    if not len(both):
        return 0, 0.0
    x, y = va[ia], vb[ib]
    close = np.isclose(x, y, rtol=RTOL, atol=1e-12) | (~np.isfinite(x) & ~np.isfinite(y))
    return len(both), float(close.mean())
