"""Text and patterns the app did not write (the URL, run names, tags, rule text, uploads): shown
as text, never as markdown or HTML, and matched in time linear in the text.

Patterns run on Rust's regex engine (through polars), which has no backtracking: `(\\w+)+!`
over a long name takes microseconds where Python's `re` would hold the server for minutes.
It has no look-around or back-references; such a pattern is refused with a message.
"""

from __future__ import annotations

import html
import json
import re

import polars as pl

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()<>#+\-.!|~:$&=\"'])")


class BadPattern(ValueError):
    """A pattern the regex engine refuses; the message says why, as text."""


def md(text: object) -> str:
    """`text` for a markdown element (st.markdown, st.caption, st.info, ...) showing exactly its
    characters: every markdown, HTML, emoji-shortcode, colour and LaTeX character escaped, so
    `![t](http://host/x.png)` stays those characters and the browser fetches nothing."""
    return _MD_SPECIAL.sub(r"\\\1", str(text)).replace("\n", "  \n")


def plotly(text: object) -> str:
    """`text` for a plotly title, legend name, label or hover text: plotly draws an HTML subset
    there (<a href>, <b>, <br>), so tags are escaped (plotly shows the entities as characters);
    `%` too, so a hover template does not substitute `%{...}` from a name."""
    return html.escape(str(text), quote=False).replace("%", "&#37;")


def _checked(pattern: str) -> str:
    try:
        pl.Series([""]).str.contains(pattern)
    except pl.exceptions.PolarsError as e:
        why = str(e).split("This error occurred", 1)[0].strip()
        raise BadPattern(f"not a valid regular expression: {why}") from None
    return pattern


def matches(pattern: str, texts: list[str]) -> list[bool]:
    """Whether `pattern` is found in each text (as `re.search`)."""
    return pl.Series(texts, dtype=pl.String).str.contains(_checked(pattern)).fill_null(False).to_list()


def names(pattern: str, texts: list[str]) -> list[str | None]:
    """Per text, what `pattern` names it: its first group where it has one, else the whole
    match; None where it does not match."""
    pattern = _checked(pattern)
    s = pl.Series(texts, dtype=pl.String)
    whole = s.str.extract(pattern, 0)
    groups = s.head(0).str.extract_groups(pattern).dtype
    if not isinstance(groups, pl.Struct) or not groups.fields:
        return whole.to_list()
    return s.str.extract(pattern, 1).fill_null(whole).to_list()


def glob_match(glob: str, text: str) -> bool:
    """Whether a rule's name (a tag or metric, `*` and `?` as wildcards) is `text`."""
    if "*" not in glob and "?" not in glob:
        return glob == text
    from workbench.store.aliases import glob_regex

    return matches("^" + glob_regex(glob) + "$", [text])[0]


def backtest_results(raw: bytes) -> dict:
    """An uploaded results file, or {"error": why} when it is not one the backtest wrote."""
    try:
        res = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        return {"error": f"not a JSON file ({e})"}
    if isinstance(res, dict) and "error" in res:
        return {"error": f"the file holds an error: {res['error']}"}
    if not isinstance(res, dict) or not isinstance(res.get("rules"), list):
        return {"error": "not backtest results: they are a JSON object with a list of rules"}
    for key in ("rules", "predictors"):
        if not isinstance(res.get(key) or [], list) or not all(
            isinstance(r, dict) for r in res.get(key) or []
        ):
            return {"error": f"not backtest results: {key} holds something other than rows"}
    for r in res["rules"]:
        numbers = [r.get(k) for k in ("recall", "false_alarms_per_1k")]
        if not isinstance(r.get("rule"), str) or not all(
            v is None or isinstance(v, int | float) and not isinstance(v, bool) for v in numbers
        ):
            return {"error": "not backtest results: each of its rules names its rule and holds numbers"}
    return {"runs": None, "unknown": None, **res}
