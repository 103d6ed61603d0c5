"""Cached, read-only data access for the app (the only module the pages read the store through)."""

from __future__ import annotations

import polars as pl
import streamlit as st

from workbench.store import Store


def store() -> Store:
    return Store()


def generation() -> str | None:
    """Changes whenever an ingest commits: part of every cache key, so pages see new data."""
    gen = store().current_generation()
    return gen.name if gen else None


@st.cache_data(show_spinner=False)
def runs(gen: str) -> pl.DataFrame:
    return (
        store()
        .connect()
        .sql(
            "SELECT run_id, status, formats, files, segments, points, tags, first_step, last_step, "
            "problems, started, last_write, evidence FROM runs ORDER BY run_id"
        )
        .pl()
    )
