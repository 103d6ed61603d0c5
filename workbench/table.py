"""A read command's answer as a box table on stdout: `workbench sql`, `runs`, `tags`.

Drawn here rather than with Rich: importing Rich is a sixth of such a command's whole run.
The table looks as Rich draws one (a heavy header). On a terminal it fits the width: the widest
cells are cut with an ellipsis, and when the columns cannot keep MIN_CELLS each, those on the
right give way to a column of ellipses (as DuckDB's CLI does), said on stderr. Its header is
bold. Piped output is never cut.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import sys
import unicodedata

# a table shows this many rows at most, the first and last halves (DuckDB's CLI does the same):
# nobody reads 10k rows in a terminal; CSV and JSON are whole
MAX_TABLE_ROWS = 40
ELLIPSIS = "…"
MIN_CELLS = 8  # a column cut to fit a terminal keeps this many cells; past that, columns go


def query_text(text: str, fmt: str) -> None:
    """DuckDB's CSV or JSON text as it came, or (table) that CSV as a table; row count to stderr."""
    if fmt != "table":
        sys.stdout.write(text)
        return
    rows = list(csv.reader(io.StringIO(text)))
    header, body = (rows[0], rows[1:]) if rows else ([], [])
    half = MAX_TABLE_ROWS // 2
    shown = body if len(body) <= MAX_TABLE_ROWS else [*body[:half], None, *body[-half:]]
    terminal = sys.stdout.isatty()
    width = shutil.get_terminal_size().columns if terminal else None
    bold = terminal and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"
    shown = [r if r is not None else ["⋮"] * len(header) for r in shown]
    sys.stdout.write(draw(header, shown, width, bold))
    cols = len(header) if width is None else columns_shown(header, shown, width)
    rows_said = f"{len(body)} rows" + (f", {MAX_TABLE_ROWS} shown" if len(shown) < len(body) else "")
    cols_said = f"; {len(header)} columns, {cols} shown" if cols < len(header) else ""
    if rows_said.endswith("shown") or cols_said:
        print(f"({rows_said}{cols_said}; --format csv or json gives all)", file=sys.stderr)
    else:
        print(f"({rows_said})", file=sys.stderr)


def draw(header: list[str], rows: list[list[str]], width: int | None = None, bold: bool = False) -> str:
    """The table's text, one line per row; `width`: fit the table in that many columns."""
    if not header:
        return ""
    header = [visible(h) for h in header]
    rows = [[visible(c) for c in r] for r in rows]
    widths = natural_widths(header, rows)
    if width is not None:
        kept = _kept_columns(widths, width)
        if kept < len(header):  # the columns that do not fit give way to one of ellipses
            header = [*header[:kept], ELLIPSIS]
            rows = [[*r[:kept], ELLIPSIS] for r in rows]
            widths = [*widths[:kept], 1]
        widths = fitted(widths, width - 3 * len(widths) - 1)

    def line(left: str, fill: str, mid: str, right: str) -> str:
        return left + mid.join(fill * (w + 2) for w in widths) + right + "\n"

    def row(values: list[str], bar: str, style: tuple[str, str] = ("", "")) -> str:
        shown = [cut(v, w) for v, w in zip(values, widths, strict=True)]
        padded = (style[0] + v + style[1] + " " * (w - cells(v)) for v, w in zip(shown, widths, strict=True))
        return bar + " " + f" {bar} ".join(padded) + " " + bar + "\n"

    style = ("\x1b[1m", "\x1b[0m") if bold else ("", "")
    out = [line("┏", "━", "┳", "┓"), row(header, "┃", style), line("┡", "━", "╇", "┩")]
    out += [row(r, "│") for r in rows]
    out.append(line("└", "─", "┴", "┘"))
    return "".join(out)


def natural_widths(header: list[str], rows: list[list[str]]) -> list[int]:
    return [max([cells(h), *(cells(r[i]) for r in rows)]) for i, h in enumerate(header)]


def columns_shown(header: list[str], rows: list[list[str]], width: int) -> int:
    """How many columns, from the left, a table `width` cells wide shows."""
    return _kept_columns(
        natural_widths([visible(h) for h in header], [[visible(c) for c in r] for r in rows]), width
    )


def _kept_columns(widths: list[int], width: int) -> int:
    """Columns kept from the left so that each keeps MIN_CELLS (or its own width, if less),
    with one more column of ellipses where some are left out; one at least."""
    kept = len(widths)
    while kept > 1:
        ellipsis = 4 if kept < len(widths) else 0  # its cell, its padding and its bar
        if sum(min(w, MIN_CELLS) for w in widths[:kept]) + 3 * kept + 1 + ellipsis <= width:
            break
        kept -= 1
    return kept


def fitted(widths: list[int], room: int) -> list[int]:
    """Column widths within `room` cells, the widest cut first (one cell each at least), all of
    the room used."""
    if sum(widths) <= room:
        return widths
    lo, hi = 1, max(widths)  # the largest cap under which the columns fit
    while lo < hi:
        cap = (lo + hi + 1) // 2
        if sum(min(w, cap) for w in widths) <= room:
            lo = cap
        else:
            hi = cap - 1
    out = [min(w, lo) for w in widths]
    spare = room - sum(out)  # fewer cells than the cut columns: one more each, from the left
    for i, w in enumerate(widths):
        if spare > 0 and w > lo:
            out[i] += 1
            spare -= 1
    return out


_ESCAPED = {"Cc", "Zl", "Zp"}  # Unicode categories: control characters, line and paragraph separators


def visible(text: str) -> str:
    """`text` with control characters and line separators written as escapes (`\\n`, `\\x1b`,
    `\\u2028`): a name in a log never moves the cursor or recolours the terminal, and a row stays
    one line."""
    if text.isprintable():
        return text
    return "".join(
        c.encode("unicode_escape").decode() if unicodedata.category(c) in _ESCAPED else c for c in text
    )


def cells(text: str) -> int:
    """Terminal cells `text` takes: two for wide East Asian characters, none for combining marks."""
    if text.isascii():
        return len(text)
    return sum(
        0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text
    )


def cut(text: str, width: int) -> str:
    """`text` in at most `width` cells, ending in an ellipsis where it was cut."""
    if cells(text) <= width:
        return text
    out, used = [], 0
    for c in text:
        w = cells(c)
        if used + w > width - 1:
            break
        out.append(c)
        used += w
    return "".join(out) + ELLIPSIS
