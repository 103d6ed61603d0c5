"""A page's view kept in the URL, so a reload or a shared link shows the same thing, and the
opt-in live refresh that follows a store being written (by `workbench ingest` or `watch`).

A page lists its `Param`s, calls `restore` before its widgets (each widget then starts from the
URL, else from the last time the page was shown in this session, else its default) and
`publish` after them (the URL follows the widgets; defaults stay out of it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import streamlit as st

KEEP = "_kept_"  # session keys that outlive a widget when its page is not shown
LIVE_EVERY_S = 3


@dataclass(frozen=True)
class Param:
    key: str  # the widget's key
    name: str  # the query parameter
    default: Any

    def parse(self, raw: list[str]) -> Any:
        d = self.default
        try:
            if isinstance(d, list):
                return raw
            if isinstance(d, bool):
                return raw[-1] in ("1", "true", "yes")
            if isinstance(d, int):
                return int(raw[-1])
            if isinstance(d, float):
                return float(raw[-1])
        except ValueError:
            return d
        return raw[-1]

    def dump(self, value: Any) -> str | list[str]:
        if isinstance(self.default, list):
            return [str(v) for v in value]
        if isinstance(self.default, bool):
            return "1" if value else "0"
        return str(value)


def restore(params: list[Param]) -> None:
    """Before the widgets: start each from the URL, else from this session's last view of the
    page, else its default."""
    for p in params:
        if p.key in st.session_state:
            continue
        if p.name in st.query_params:
            st.session_state[p.key] = p.parse(st.query_params.get_all(p.name))
        elif KEEP + p.key in st.session_state:
            st.session_state[p.key] = st.session_state[KEEP + p.key]
        else:
            st.session_state[p.key] = p.default


def publish(params: list[Param]) -> None:
    """After the widgets: the URL and this session's memory of the page follow them."""
    for p in params:
        value = st.session_state.get(p.key, p.default)
        st.session_state[KEEP + p.key] = value
        if value == p.default:
            if p.name in st.query_params:
                del st.query_params[p.name]
        elif st.query_params.get_all(p.name) != _as_list(p.dump(value)):
            st.query_params[p.name] = p.dump(value)


def _as_list(v: str | list[str]) -> list[str]:
    return v if isinstance(v, list) else [v]


def keep_only(key: str, allowed: list) -> None:
    """Drop values a widget cannot show (a run that is no longer in the store, from an old link)."""
    value = st.session_state.get(key)
    if isinstance(value, list):
        st.session_state[key] = [v for v in value if v in allowed]
    elif value is not None and value not in allowed:
        del st.session_state[key]


def live_refresh(gen: str, on: bool) -> None:
    """While on, look at the store every few seconds and rerun the page when a new generation
    (an ingest or a watch poll) has landed; the page's cached reads follow the generation."""
    if not on:
        return
    from workbench.app import data

    @st.fragment(run_every=LIVE_EVERY_S)
    def watch() -> None:
        if data.generation() != gen:
            st.rerun()
        st.caption(f"Live: store generation {gen}, checked {time.strftime('%H:%M:%S')}")

    watch()
