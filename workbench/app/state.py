"""A page's view kept in the URL, so a reload or a shared link shows the same thing, and the
opt-in live refresh that follows a store being written (by `workbench ingest` or `watch`).

A page lists its `Param`s, calls `restore` before its widgets (each widget then starts from the
URL, else from the last time the page was shown in this session, else its default) and
`publish` after them (the URL follows the widgets; defaults stay out of it).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import streamlit as st

from workbench.app import untrusted

KEEP = "_kept_"  # session keys that outlive a widget when its page is not shown
LIVE_EVERY_S = 3


@dataclass(frozen=True)
class Param:
    key: str  # the widget's key
    name: str  # the query parameter
    default: Any
    lo: float | None = None  # numbers outside [lo, hi] are clamped (a widget would raise)
    hi: float | None = None
    choices: tuple | None = None  # a value outside them falls back to the default

    def parse(self, raw: list[str]) -> tuple[Any, str | None]:
        """The value a URL gives, and why it was changed (None when it was taken as is)."""
        d = self.default
        if isinstance(d, list):
            return raw, None
        if isinstance(d, bool):
            return raw[-1] in ("1", "true", "yes"), None
        text = raw[-1]
        if isinstance(d, int | float):
            try:
                v = int(text) if isinstance(d, int) else float(text)
            except ValueError:
                return d, f"{self.name}={text} is not a number; using {d}"
            if math.isnan(v):
                return d, f"{self.name}={text} is not a number; using {d}"
            if self.lo is not None and v < self.lo:
                return type(d)(self.lo), f"{self.name}={text} is below {self.lo}; using {self.lo}"
            if self.hi is not None and v > self.hi:
                return type(d)(self.hi), f"{self.name}={text} is above {self.hi}; using {self.hi}"
            value: Any = v
        else:
            value = text
        if self.choices is not None and value not in self.choices:
            return d, f"{self.name}={raw[-1]} is not one of {', '.join(map(str, self.choices))}; using {d}"
        return value, None

    def dump(self, value: Any) -> str | list[str]:
        if isinstance(self.default, list):
            return [str(v) for v in value]
        if isinstance(self.default, bool):
            return "1" if value else "0"
        return str(value)


def restore(params: list[Param]) -> None:
    """Before the widgets: start each from the URL, else from this session's last view of the
    page, else its default. A URL value a widget cannot take is replaced, with a message."""
    for p in params:
        if p.key in st.session_state:
            continue
        if p.name in st.query_params:
            st.session_state[p.key], note = p.parse(st.query_params.get_all(p.name))
            if note:
                st.warning(untrusted.md(f"From the link: {note}."))
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
