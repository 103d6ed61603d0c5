"""The rule language: parsed here into a small AST, never evaluated as Python.

    grad_norm < 1e-5 and attn_entropy < 0.3
    loss > mean(loss, 100) + 3 * std(loss, 100)
    loss - median(loss, 50) > 8 * 1.4826 * mad(loss, 50)     # a robust z-score
    peer_z(loss) > 3                        # against the other runs of its group at this step
    `grad_norm/layer_0` / `grad_norm/layer_1` > 1000
    not (loss < 1e30)                       # true on NaN and Inf: NaN compares false

Precedence, loosest first: `or`, `and`, `not`, comparisons (< <= > >= == !=), `+ -`, `* /`,
unary minus. Names are canonical metrics (`loss`, `grad_norm`, ...) or tags; a tag with
characters outside [A-Za-z0-9_.] goes in backticks, and a `*` inside backticks is a glob (one
evaluation per matching tag). Functions: see FUNCTIONS.

Rule text may be typed by anyone (the app's backtest page parses it too), so parsing is linear
and bounded: at most MAX_RULE_CHARS characters, MAX_DEPTH levels of operators and parentheses,
and every window or weight checked against its function's range (WINDOWS) when it is written
as a number, or once its parameter is known (`check_numbers`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from workbench.errors import WorkbenchError

# name -> (argument kinds, what it means); "s" = a series expression, "n" = a number
FUNCTIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "mean": (("s", "n"), "mean of the n values before this step"),
    "std": (("s", "n"), "standard deviation of the n values before this step"),
    "min": (("s", "n"), "minimum of the n values before this step"),
    "max": (("s", "n"), "maximum of the n values before this step"),
    "ema": (
        ("s", "n"),
        "EMA of the values before this step, smoothing weight w (0.9 = heavy, as TensorBoard)",
    ),
    "slope": (("s", "n"), "least-squares slope per step over the last n values, this one included"),
    "delta": (("s", "n"), "this value minus the value k logged values earlier"),
    "pct_change": (("s", "n"), "relative change from the value k logged values earlier"),
    "max_first": (("s", "n"), "maximum of the series' first n values (known once n are logged)"),
    "median": (("s", "n"), "median of the n values before this step"),
    "mad": (
        ("s", "n"),
        "median absolute deviation from their median of the n values before this step "
        "(x 1.4826 is a standard deviation for normal noise)",
    ),
    "peer_z": (
        ("s",),
        "z-score of this run's value against the other runs of its group (the runs in the same "
        "folder of run ids) at this step: each peer's latest value at or before it, 3 peers or more",
    ),
    "abs": (("s",), "absolute value"),
}

# functions of one series argument computed over a run's group rather than its own points
PEER = ("peer_z",)


MAX_RULE_CHARS = 4096
MAX_DEPTH = 100  # nested parentheses, `not`s and chained operators together
MAX_WINDOW = 1_000_000  # logged points a window may span

# the number argument of each function: (least, greatest, whole number, what it is)
WINDOWS: dict[str, tuple[float, float, bool, str]] = {
    "mean": (1, MAX_WINDOW, True, "window"),
    "std": (2, MAX_WINDOW, True, "window"),
    "min": (1, MAX_WINDOW, True, "window"),
    "max": (1, MAX_WINDOW, True, "window"),
    "slope": (2, MAX_WINDOW, True, "window"),
    "delta": (1, MAX_WINDOW, True, "lag"),
    "pct_change": (1, MAX_WINDOW, True, "lag"),
    "max_first": (1, MAX_WINDOW, True, "count"),
    "median": (1, MAX_WINDOW, True, "window"),
    "mad": (2, MAX_WINDOW, True, "window"),
    "ema": (0, 1, False, "smoothing weight"),
}


class RuleSyntaxError(WorkbenchError):
    """A rule text that does not parse; `col` is 1-based."""

    def __init__(self, text: str, col: int, message: str):
        self.text, self.col, self.message = text, col, message
        pointer = " " * (col - 1) + "^"
        super().__init__(f"{message} at column {col}\n  {text}\n  {pointer}")


@dataclass(frozen=True)
class Num:
    value: float


@dataclass(frozen=True)
class Name:
    name: str
    quoted: bool  # written in backticks (a tag, maybe a glob)
    col: int

    @property
    def is_glob(self) -> bool:
        return self.quoted and "*" in self.name


@dataclass(frozen=True)
class Call:
    fn: str
    args: tuple
    col: int


@dataclass(frozen=True)
class Unary:
    op: str  # "-" or "not"
    arg: object


@dataclass(frozen=True)
class Binary:
    op: str
    left: object
    right: object


BLANK = re.compile(r"\s*\Z")
TOKEN = re.compile(
    r"\s*(?:(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)|(?P<tick>`[^`]*`)|(?P<name>[A-Za-z_][A-Za-z0-9_.]*)"
    r"|(?P<op><=|>=|==|!=|[<>+\-*/(),]))"
)
KEYWORDS = {"and", "or", "not"}
COMPARISONS = {"<", "<=", ">", ">=", "==", "!="}
BINDING = {"or": 1, "and": 2, **dict.fromkeys(COMPARISONS, 4), "+": 5, "-": 5, "*": 6, "/": 6}


def tokenize(text: str) -> list[tuple[str, str, int]]:
    """(kind, text, 1-based column) tokens, ending with ("end", "", col)."""
    out, pos = [], 0
    while pos < len(text):
        if BLANK.match(text, pos):
            break
        m = TOKEN.match(text, pos)
        if not m or m.end() == pos:
            col = pos + len(text[pos:]) - len(text[pos:].lstrip()) + 1
            ch = text[col - 1]
            hint = (
                " (tags with other characters go in backticks: `a/b`)"
                if ch not in "`"
                else " (unclosed backtick)"
            )
            raise RuleSyntaxError(text, col, f"unexpected character {ch!r}{hint}")
        kind = m.lastgroup
        assert kind is not None  # every alternative of TOKEN is a named group
        col = m.start(kind) + 1
        value = m.group(kind)
        if kind == "name" and value in KEYWORDS:
            kind = "kw"
        if kind == "tick" and len(value) == 2:
            raise RuleSyntaxError(text, col, "empty tag name in backticks")
        out.append((kind, value, col))
        pos = m.end()
    out.append(("end", "", len(text) + 1))
    return out


class _Parser:
    def __init__(self, text: str):
        self.text = text
        if len(text) > MAX_RULE_CHARS:
            raise RuleSyntaxError(
                text[:60] + "...", 1, f"a rule of {len(text):,} characters; the limit is {MAX_RULE_CHARS:,}"
            )
        self.toks = tokenize(text)
        self.i = 0
        self.nesting = 0

    def peek(self):
        return self.toks[self.i]

    def take(self):
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def fail(self, tok, message: str):
        raise RuleSyntaxError(self.text, tok[2], message)

    def expect(self, value: str):
        tok = self.take()
        if tok[1] != value:
            self.fail(tok, f"expected {value!r}, found {tok[1] or 'end of rule'!r}")
        return tok

    def parse(self):
        if self.peek()[0] == "end":
            self.fail(self.peek(), "empty rule")
        node = self.expr(0)
        if self.peek()[0] != "end":
            self.fail(self.peek(), f"unexpected {self.peek()[1]!r} (missing 'and'/'or' or an operator?)")
        if depth(node) > MAX_DEPTH:
            raise RuleSyntaxError(
                self.text, 1, f"more than {MAX_DEPTH} operators deep; split it into simpler rules"
            )
        return node

    def expr(self, min_bp: int):
        left = self.prefix()
        while True:
            kind, value, _ = self.peek()
            bp = BINDING.get(value) if kind in ("op", "kw") else None
            if bp is None or bp <= min_bp:
                return left
            op_tok = self.take()
            if value in COMPARISONS and isinstance(left, Binary) and left.op in COMPARISONS:
                self.fail(op_tok, "chained comparisons are ambiguous: use 'and'")
            right = self.expr(bp)
            left = Binary(value, left, right)

    def prefix(self):
        tok = self.take()
        kind, value, col = tok
        if self.nesting >= MAX_DEPTH:  # before recursing again: nesting never reaches Python's limit
            self.fail(tok, f"nested more than {MAX_DEPTH} levels deep")
        self.nesting += 1
        try:
            return self._prefix(tok)
        finally:
            self.nesting -= 1

    def _prefix(self, tok):
        kind, value, col = tok
        if kind == "num":
            return Num(float(value))
        if kind == "kw" and value == "not":
            return Unary("not", self.expr(3))
        if kind == "op" and value == "-":
            return Unary("-", self.expr(6))
        if kind == "op" and value == "(":
            node = self.expr(0)
            self.expect(")")
            return node
        if kind == "tick":
            return Name(value[1:-1], True, col)
        if kind == "name":
            if self.peek()[1] == "(":
                return self.call(value, col)
            return Name(value, False, col)
        self.fail(tok, f"expected a number, a metric or '(', found {value or 'end of rule'!r}")

    def call(self, fn: str, col: int):
        if fn not in FUNCTIONS:
            raise RuleSyntaxError(
                self.text, col, f"unknown function {fn!r}; known: {', '.join(sorted(FUNCTIONS))}"
            )
        kinds = FUNCTIONS[fn][0]
        self.expect("(")
        args = []
        while True:
            arg = self.expr(0)
            if isinstance(arg, Unary) and arg.op == "-" and isinstance(arg.arg, Num):
                arg = Num(-arg.arg.value)  # a negative window is a number, checked as one
            args.append(arg)
            if self.peek()[1] == ",":
                self.take()
                continue
            self.expect(")")
            break
        if len(args) != len(kinds):
            raise RuleSyntaxError(self.text, col, f"{fn}() takes {len(kinds)} arguments, got {len(args)}")
        for a, k in zip(args, kinds, strict=True):
            if k == "n" and not isinstance(a, Num | Name):
                raise RuleSyntaxError(
                    self.text, col, f"{fn}(): the window/weight must be a number or a parameter"
                )
        call = Call(fn, tuple(args), col)
        if fn in PEER and not isinstance(args[0], Name):
            raise RuleSyntaxError(self.text, col, f"{fn}(): the argument must be a metric or tag")
        if fn in WINDOWS:
            if not isinstance(args[0], Name):
                raise RuleSyntaxError(
                    self.text,
                    col,
                    f"{fn}(): the first argument must be a metric or tag (windows run on logged points)",
                )
            _check_window(call, self.text, None)
        return call


def parse(text: str):
    """Parse a rule expression into an AST; raises RuleSyntaxError with the column."""
    return _Parser(text).parse()


def depth(node) -> int:
    """How many levels deep the tree goes (walked without recursion: it may be deep)."""
    most, stack = 0, [(node, 1)]
    while stack:
        n, d = stack.pop()
        most = max(most, d)
        kids = n.args if isinstance(n, Call) else (n.arg,) if isinstance(n, Unary) else ()
        if isinstance(n, Binary):
            kids = (n.left, n.right)
        stack += [(k, d + 1) for k in kids]
    return most


def check_numbers(node, text: str, values: dict[str, list[float]] | None = None) -> None:
    """Every window, lag and weight within its function's range (WINDOWS): the numbers written,
    and, given `values` (each parameter's possible values), every value of every parameter."""
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, Call):
            stack += n.args
            if n.fn in WINDOWS:
                _check_window(n, text, values)
        elif isinstance(n, Unary):
            stack.append(n.arg)
        elif isinstance(n, Binary):
            stack += [n.left, n.right]


def _check_window(call: Call, text: str, values: dict[str, list[float]] | None) -> None:
    arg = call.args[1]
    if isinstance(arg, Name):
        if values is None:
            return  # its value comes later
        if arg.name not in values:
            raise RuleSyntaxError(
                text, arg.col, f"{call.fn}(): {arg.name!r} is no number (define it in [rule.params])"
            )
        xs = values[arg.name]
    else:
        xs = [arg.value]
    low, high, whole, what = WINDOWS[call.fn]
    for x in xs:
        if whole:
            ok = low <= x <= high and float(x).is_integer()
            rule = f"a whole number from {low:,} to {high:,}"
        else:
            ok = low <= x < high
            rule = f"a number in [{low}, {high})"
        if not ok:
            raise RuleSyntaxError(text, call.col, f"{call.fn}(): the {what} must be {rule}, got {x:g}")


def uses_peers(node) -> bool:
    """Whether the condition compares a run with its peers (`peer_z`)."""
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, Call):
            if n.fn in PEER:
                return True
            stack += n.args
        elif isinstance(n, Unary):
            stack.append(n.arg)
        elif isinstance(n, Binary):
            stack += [n.left, n.right]
    return False


def names(node) -> list[Name]:
    """Every metric/tag reference in the rule, in order."""
    if isinstance(node, Name):
        return [node]
    if isinstance(node, Call):
        return [n for a in node.args for n in names(a)]
    if isinstance(node, Unary):
        return names(node.arg)
    if isinstance(node, Binary):
        return names(node.left) + names(node.right)
    return []


def is_boolean(node) -> bool:
    return (isinstance(node, Binary) and node.op in COMPARISONS | {"and", "or"}) or (
        isinstance(node, Unary) and node.op == "not"
    )


def substitute(node, params: dict[str, float]):
    """Replace parameter names (unquoted) by their numbers."""
    if isinstance(node, Name) and not node.quoted and node.name in params:
        return Num(float(params[node.name]))
    if isinstance(node, Call):
        return Call(node.fn, tuple(substitute(a, params) for a in node.args), node.col)
    if isinstance(node, Unary):
        return Unary(node.op, substitute(node.arg, params))
    if isinstance(node, Binary):
        return Binary(node.op, substitute(node.left, params), substitute(node.right, params))
    return node
