"""The box table a read command draws (`workbench.table`), without Rich."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from workbench import table


def test_a_table_is_drawn_as_rich_draws_one():
    assert table.draw(["run_id", "n"], [["run_a", "47"], ["b", ""]]) == (
        "┏━━━━━━━━┳━━━━┓\n"
        "┃ run_id ┃ n  ┃\n"
        "┡━━━━━━━━╇━━━━┩\n"
        "│ run_a  │ 47 │\n"
        "│ b      │    │\n"
        "└────────┴────┘\n"
    )


def test_a_wide_character_takes_two_cells_and_a_combining_mark_none():
    lines = table.draw(["名前", "x"], [["e\u0301", "日本語"]]).splitlines()
    assert lines[1] == "┃ 名前 ┃ x      ┃"
    assert lines[3] == "│ e\u0301    │ 日本語 │"
    assert len({table.cells(line) for line in lines}) == 1


def test_control_characters_in_a_name_are_shown_not_obeyed():
    out = table.draw(["tag"], [["loss\x1b[31m\nred\t\u2028"]])
    assert "\x1b" not in out and "│ loss\\x1b[31m\\nred\\t\\u2028 │" in out.splitlines()


def test_on_a_narrow_terminal_the_widest_cells_are_cut_first():
    out = table.draw(["id", "evidence"], [["run_a", "no end-of-run evidence in the logs"]], width=30)
    assert out.splitlines()[3] == "│ run_a │ no end-of-run evi… │"
    assert {len(line) for line in out.splitlines()} == {30}


def test_a_bold_header_only_when_asked():
    assert "┃ \x1b[1mn\x1b[0m ┃" in table.draw(["n"], [["1"]], bold=True)


text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)


@settings(max_examples=200, deadline=None)
@given(
    header=st.lists(text, min_size=1, max_size=5),
    rows=st.lists(st.lists(text, min_size=5, max_size=5), max_size=4),
    width=st.one_of(st.none(), st.integers(16, 120)),
)
def test_every_line_is_as_wide_as_the_others_and_fits_the_terminal(header, rows, width):
    rows = [r[: len(header)] for r in rows]
    lines = table.draw(header, rows, width).splitlines()
    assert len(lines) == len(rows) + 4  # one line per row: no cell breaks a line
    widths = {table.cells(line) for line in lines}
    assert len(widths) == 1
    if width is not None and width >= 4 * len(header) + 1:  # room for one cell per column
        assert widths.pop() <= width
