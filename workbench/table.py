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
    cells_shown, rows_shown, widths, cols = fit(header, shown, width)
    sys.stdout.write(box(cells_shown, rows_shown, widths, bold))
    rows_said = f"{len(body)} row{'' if len(body) == 1 else 's'}" + (
        f", {MAX_TABLE_ROWS} shown" if len(shown) < len(body) else ""
    )
    cols_said = f"; {len(header)} columns, {cols} shown" if cols < len(header) else ""
    if rows_said.endswith("shown") or cols_said:
        print(f"({rows_said}{cols_said}; --format csv or json gives all)", file=sys.stderr)
    else:
        print(f"({rows_said})", file=sys.stderr)


def draw(header: list[str], rows: list[list[str]], width: int | None = None, bold: bool = False) -> str:
    """The table's text, one line per row; `width`: fit the table in that many columns."""
    return box(*fit(header, rows, width)[:3], bold) if header else ""


def fit(
    header: list[str], rows: list[list[str]], width: int | None
) -> tuple[list[str], list[list[str]], list[int], int]:
    """The header and rows as shown (escaped; the columns that do not fit give way to one of
    ellipses), each column's width, and how many of the columns are shown."""
    header = [visible(h) for h in header]
    rows = [[visible(c) for c in r] for r in rows]
    widths = [max([cells(h), *(cells(r[i]) for r in rows)]) for i, h in enumerate(header)]
    kept = len(header)
    if width is None:
        return header, rows, widths, kept
    while kept > 1:  # each column keeps MIN_CELLS (or its own width, if less), or columns go
        ellipsis = 4 if kept < len(widths) else 0  # its cell, its padding and its bar
        if sum(min(w, MIN_CELLS) for w in widths[:kept]) + 3 * kept + 1 + ellipsis <= width:
            break
        kept -= 1
    if kept < len(header):
        header = [*header[:kept], ELLIPSIS]
        rows = [[*r[:kept], ELLIPSIS] for r in rows]
        widths = [*widths[:kept], 1]
    return header, rows, fitted(widths, width - 3 * len(widths) - 1), kept


def box(header: list[str], rows: list[list[str]], widths: list[int], bold: bool = False) -> str:
    """Cells drawn in a box, as Rich draws a table (a heavy header), each cut to its column's width."""

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
