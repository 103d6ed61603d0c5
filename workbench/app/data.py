"""Cached data access for the app: the only module the pages read the store (and run rules) through.

Every cached read takes the store generation as its first argument, so a new ingest (a new
generation) invalidates it; queries run on a per-generation in-memory DuckDB that never locks
the store, so an open app never blocks an ingest.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import streamlit as st

from detectors.backtest import Settings, backtest
from detectors.replay import GUIDES, replay
from detectors.rules import rules_from_text
from ingest import lineage as lineage_graph
from workbench.errors import WorkbenchError
from workbench.store import Store

SELECTED = "selected_runs"  # session key shared by the pages


def store() -> Store:
    return Store()


def generation() -> str | None:
    gen = store().current_generation()
    return gen.name if gen else None


@st.cache_resource(show_spinner=False, max_entries=2)
def _connection(gen: str):
    return store().connect()


def sql(gen: str, query: str, params: list | None = None) -> pl.DataFrame:
    cur = _connection(gen).cursor()  # a cursor per call: connections are not shared between threads
    try:
        return cur.sql(query, params=params).pl() if params else cur.sql(query).pl()
    finally:
        cur.close()


@st.cache_data(show_spinner=False)
def runs(gen: str) -> pl.DataFrame:
    return sql(
        gen,
        """
        WITH a AS (SELECT run_id, count(*) AS alerts FROM alerts GROUP BY run_id),
             l AS (SELECT run_id, arg_max(value, step) AS last_loss FROM scalars WHERE metric = 'loss' GROUP BY run_id)
        SELECT r.run_id, r.status, lb.outcome AS label, lb.onset, lb.kind AS failure, lb.source AS label_source,
               r.formats, r.points, r.first_step, r.last_step, l.last_loss, coalesce(a.alerts, 0) AS alerts,
               r.segments, r.problems, r.evidence, r.config
        FROM runs r LEFT JOIN labels lb USING (run_id) LEFT JOIN a USING (run_id) LEFT JOIN l USING (run_id)
        ORDER BY r.run_id""",
    )


@st.cache_data(show_spinner=False)
def tags(gen: str, run_ids: tuple[str, ...]) -> pl.DataFrame:
    if not run_ids:
        return pl.DataFrame(schema={"tag": pl.String, "metric": pl.String, "runs": pl.UInt32})
    return sql(
        gen,
        "SELECT tag, any_value(metric) AS metric, count(DISTINCT run_id) AS runs FROM scalars "
        "WHERE list_contains(?, run_id) GROUP BY tag ORDER BY metric NULLS LAST, tag",
        [list(run_ids)],
    )


def series(gen: str, run_id: str, tag: str) -> dict[str, np.ndarray]:
    """Every stored point of one run and tag, superseded ones flagged, by step then write order."""
    df = sql(
        gen,
        "SELECT step, wall_time, value, superseded FROM scalars_all WHERE run_id = ? AND tag = ? "
        "ORDER BY step, superseded DESC",
        [run_id, tag],
    )
    return {c: df[c].to_numpy() for c in df.columns}


def to_x(steps: np.ndarray, walls: np.ndarray, t0: float, x_mode: str) -> np.ndarray:
    if x_mode == "step":
        return steps
    if x_mode.startswith("relative"):
        return (walls - t0) / 3600.0
    return (walls * 1000).astype("datetime64[ms]")


@st.cache_data(show_spinner=False, max_entries=1024)
def display_curve(
    gen: str, run_id: str, tag: str, smoothing: float, x_mode: str, with_superseded: bool
) -> dict | None:
    """A curve ready to draw (smoothed over every point, then downsampled) and what it takes to
    place events and alerts on it; cached, so later page views never touch the raw points."""
    from workbench.app import charts

    s = series(gen, run_id, tag)
    if len(s["step"]) == 0:
        return None
    walls = s["wall_time"].astype(np.float64)
    has_time = bool(np.isfinite(walls).any())
    t0 = float(np.nanmin(walls)) if has_time else 0.0
    mode = x_mode if has_time else "step"
    sup = s["superseded"].astype(bool)
    keep = np.ones(len(sup), bool) if with_superseded else ~sup
    x = to_x(s["step"], walls, t0, mode)
    cur = ~sup
    # a thinned copy of the current points (steps, x, smoothed y) to place events and alerts on
    ps, py = charts.downsample(
        s["step"][cur].astype(np.float64), charts.tb_smooth(s["value"][cur], smoothing), 4000
    )
    px = to_x(ps, np.interp(ps, s["step"][cur], walls[cur]) if has_time else ps, t0, mode)
    return {
        "curve": charts.prepare_curve(x[keep], s["value"][keep], sup[keep], smoothing),
        "has_time": has_time,
        "place_steps": ps,
        "place_x": px,
        "place_y": py,
        "points": int(len(x)),
    }


@st.cache_data(show_spinner="Preparing the export ...")
def export(gen: str, pairs: tuple[tuple[str, str], ...], fmt: str) -> bytes:
    """The selected points in long format: run_id, tag, step, wall_time, value, superseded."""
    import io

    frames = [
        sql(
            gen,
            "SELECT run_id, tag, step, wall_time, value, superseded FROM scalars_all "
            "WHERE run_id = ? AND tag = ? ORDER BY step",
            [r, t],
        )
        for r, t in pairs
    ]
    data = pl.concat(frames) if frames else pl.DataFrame()
    if fmt == "csv":
        return data.write_csv().encode()
    buf = io.BytesIO()
    data.write_parquet(buf)
    return buf.getvalue()


@st.cache_data(show_spinner=False)
def alerts(gen: str, run_ids: tuple[str, ...]) -> pl.DataFrame:
    return sql(
        gen,
        "SELECT * FROM alerts WHERE list_contains(?, run_id) ORDER BY run_id, step_fired",
        [list(run_ids)],
    )


@st.cache_data(show_spinner=False)
def events(gen: str, run_ids: tuple[str, ...]) -> pl.DataFrame:
    return sql(
        gen,
        "SELECT run_id, step, wall_time, kind, message FROM events WHERE list_contains(?, run_id) "
        "AND step IS NOT NULL AND kind <> 'text' ORDER BY run_id, step",
        [list(run_ids)],
    )


@st.cache_data(show_spinner=False)
def lineage(gen: str) -> pl.DataFrame:
    return sql(gen, "SELECT * FROM lineage ORDER BY child_run, child_segment")


@st.cache_data(show_spinner=False)
def stitched(gen: str, run_id: str, tag: str) -> pl.DataFrame:
    return lineage_graph.stitched(_connection(gen).cursor(), run_id, tag)


def guides_text() -> str:
    """The guides' rule file, as an example to edit."""
    return GUIDES.read_text()


@st.cache_data(show_spinner="Replaying the rules over the selected runs ...")
def run_backtest(gen: str, rules_text: str | None, runs_glob: str | None, horizon: int, lead: int) -> dict:
    """Backtest results as plain data; errors come back as {"error": message}."""
    try:
        rules = rules_from_text(rules_text, "the rule text") if rules_text else None
        res = backtest(store(), rules, runs_glob or None, Settings(horizon=horizon, lead=lead, bootstrap=300))
    except WorkbenchError as e:
        return {"error": str(e)}
    return {"rules": res.rules, "predictors": res.predictors, "unknown": res.unknown_runs, "runs": res.runs}


def replay_alerts(rules_text: str | None, runs_glob: str | None) -> str:
    """Replay and store the alerts (then the curves show them); returns a summary or the error."""
    try:
        rules = rules_from_text(rules_text, "the rule text") if rules_text else None
        result = replay(store(), rules, runs_glob or None)
    except WorkbenchError as e:
        return f"error: {e}"
    return f"{result.alerts.height} alerts from {len(result.evaluable)} rules over {len(result.runs)} runs stored"


def no_store_message() -> str:
    return (
        f"No store at `{store().root}` yet. Create one with `workbench ingest PATH` "
        "(or set `WORKBENCH_STORE` to an existing store), then reload."
    )
