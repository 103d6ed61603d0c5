"""The rule language: precedence, errors that point at the column, no way to run code."""

from __future__ import annotations

import pytest
from conftest import cli

from detectors.language import Binary, Call, Name, Num, RuleSyntaxError, Unary, parse
from detectors.rules import RuleFileError, load_rule_file


def test_precedence():
    tree = parse("a + b * c > d and not e < 1 or g == 2")
    assert isinstance(tree, Binary) and tree.op == "or"
    left = tree.left
    assert left.op == "and"
    assert left.left == Binary(
        ">",
        Binary("+", Name("a", False, 1), Binary("*", Name("b", False, 5), Name("c", False, 9))),
        Name("d", False, 13),
    )
    assert left.right == Unary("not", Binary("<", Name("e", False, 23), Num(1.0)))
    assert parse("-x * 2") == Binary("*", Unary("-", Name("x", False, 2)), Num(2.0))
    assert parse("(a - b) - c") == Binary(
        "-", Binary("-", Name("a", False, 2), Name("b", False, 6)), Name("c", False, 11)
    )


def test_backticks_globs_and_calls():
    tree = parse("`grad_norm/layer_*` < 1e-8 and mean(loss, 100) > 2.5e0")
    glob = tree.left.left
    assert glob == Name("grad_norm/layer_*", True, 1) and glob.is_glob
    assert tree.right.left == Call("mean", (Name("loss", False, 37), Num(100.0)), 32)
    assert parse("train.loss_v2 > .5").left.name == "train.loss_v2"


@pytest.mark.parametrize(
    "text, col, fragment",
    [
        ("loss >", 7, "expected a number"),
        ("loss > > 1", 8, "expected a number"),
        ("loss @ 3", 6, "unexpected character '@'"),
        ("grad_norm:0 < 1", 10, "unexpected character ':'"),
        ("mean(loss) > 1", 1, "takes 2 arguments"),
        ("foo(loss, 3) > 1", 1, "unknown function 'foo'"),
        ("`unclosed < 3", 1, "unclosed backtick"),
        ("a < b < c", 7, "chained comparisons"),
        ("loss > 1 loss", 10, "unexpected 'loss'"),
        ("(loss > 1", 10, "expected ')'"),
        ("", 1, "empty rule"),
    ],
)
def test_errors_point_at_the_column(text, col, fragment):
    with pytest.raises(RuleSyntaxError) as e:
        parse(text)
    assert e.value.col == col and fragment in str(e.value)
    assert str(e.value).splitlines()[-1] == " " * (col + 1) + "^"


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('touch /tmp/pwned') > 0",
        "loss.__class__.__mro__ > 0 and exec('1')",
        "eval('1') > 0",
        "[x for x in ()] > 0",
        "lambda: 1 > 0",
    ],
)
def test_python_is_never_run(text, tmp_path):
    with pytest.raises(RuleSyntaxError):
        parse(text)


def write(tmp_path, body):
    f = tmp_path / "rules.toml"
    f.write_text(body)
    return f


@pytest.mark.parametrize(
    "body, fragment",
    [
        ('[[rule]]\nwhen = "loss > 1"\n', "'id' is required"),
        ('[[rule]]\nid = "a"\n', "'when' is required"),
        ('[[rule]]\nid = "a"\nwhen = "loss >"\n', "at column 7"),
        ('[[rule]]\nid = "a"\nwhen = "loss > 1"\nfor_steps = 0\n', "'for_steps' must be a whole number >= 1"),
        ('[[rule]]\nid = "a"\nwhen = "loss > 1"\nfor_step = 3\n', "unknown keys ['for_step']"),
        (
            '[[rule]]\nid = "a"\nwhen = "loss > 1"\n[rule.sweep]\nk = [1, 2]\n',
            "sweep parameter 'k' does not appear",
        ),
        ('[[rule]]\nid = "a"\nwhen = "`a/*` > 1 and `b/*` > 1"\n', "at most one tag glob"),
        ('[[rule]]\nid = "a"\nwhen = "loss * 2"\n', "must be a condition"),
        (
            '[[rule]]\nid = "a"\nwhen = "loss > 1"\n[[rule]]\nid = "a"\nwhen = "loss > 2"\n',
            "duplicate rule ids ['a']",
        ),
        ("[[rule]\n", "not valid TOML"),
    ],
)
def test_rule_file_errors(tmp_path, body, fragment):
    with pytest.raises(RuleFileError) as e:
        load_rule_file(write(tmp_path, body))
    assert fragment in str(e.value)


def test_cli_rule_file_error_is_a_message_not_a_traceback(tmp_path):
    f = write(tmp_path, '[[rule]]\nid = "bad"\nwhen = "grad_norm < 1e-5 and and attn < 0.3"\n')
    p = cli("replay", "--rules", f, "--store", tmp_path / "s")  # a traceback fails in cli() itself
    assert p.exit_code == 1 and "Traceback" not in p.stderr
    assert "column 22" in p.stderr and "bad" in p.stderr


def test_sweep_points(tmp_path):
    (rule,) = load_rule_file(
        write(
            tmp_path,
            '[[rule]]\nid = "s"\nwhen = "loss > k"\n[rule.params]\nk = 1\n'
            "[rule.sweep]\nk = [1, 2]\nfor_steps = [1, 3]\n",
        )
    )
    points = [(p.params["k"], p.for_steps) for p in rule.sweep_points()]
    assert points == [(1, 1), (2, 1), (1, 3), (2, 3)]
