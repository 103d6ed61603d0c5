"""The box table a read command draws (`workbench.table`), without Rich."""

from __future__ import annotations

import os

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


def test_columns_that_cannot_keep_eight_cells_give_way_to_ellipses():
    header = ["run_id", "status", "formats", "files", "evidence"]
    rows = [["attention_collapse", "recovered", "jsonl,tensorboard", "2", "continued by another run"]]
    lines = table.draw(header, rows, width=50).splitlines()
    assert lines[1] == "┃ run_id     ┃ status    ┃ formats   ┃ files ┃ … ┃"
    assert lines[3] == "│ attention… │ recovered │ jsonl,te… │ 2     │ … │"
    assert {len(line) for line in lines} == {50}
    assert table.fit(header, rows, 50)[3] == 4 and table.fit(header, rows, 500)[3] == 5


def test_a_terminal_table_says_which_columns_it_left_out(monkeypatch, capsys):
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setattr("shutil.get_terminal_size", lambda: os.terminal_size((40, 24)))
    table.query_text("a_long_name,b_long_name,c_long_name,d_long_name\n1,2,3,4\n", "table")
    out, err = capsys.readouterr()
    assert "┃ …" in out and err == "(1 row; 4 columns, 3 shown; --format csv or json gives all)\n"
