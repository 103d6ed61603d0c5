"""Terminal rendering for the CLI: tables, the backtest report, the lineage tree.

Every string that came from a user or a log (run ids, paths, tags, rule ids) is escaped, so
that `[` in a name is text, never Rich markup.
"""

from __future__ import annotations

import csv
import io
import sys

import polars as pl
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree


def _out() -> Console:
    """stdout; piped output is never cut to the terminal width."""
    out = Console()
    return out if out.is_terminal else Console(width=100_000)


def frame(df: pl.DataFrame, fmt: str) -> None:
    """A frame on stdout as a table, CSV or one JSON array."""
    if fmt == "json":
        sys.stdout.write(df.write_json() + "\n")
    elif fmt == "csv":
        sys.stdout.write(df.write_csv())
    else:
        table = Table(*map(escape, df.columns), header_style="bold")
        for row in df.iter_rows():
            table.add_row(*["" if v is None else escape(str(v)) for v in row])
        _out().print(table, crop=False)


def query_text(text: str, fmt: str) -> None:
    """DuckDB's CSV or JSON text as it came, or (table) that CSV as a table; row count to stderr."""
    if fmt != "table":
        sys.stdout.write(text)
        return
    rows = list(csv.reader(io.StringIO(text)))
    table = Table(header_style="bold")
    for name in rows[0] if rows else []:
        table.add_column(escape(name), no_wrap=True, overflow="ellipsis")
    for r in rows[1:]:
        table.add_row(*map(escape, r))
    _out().print(table, crop=False)
    print(f"({max(0, len(rows) - 1)} rows)", file=sys.stderr)


def _fmt(x, pct: bool = False) -> str:
    if x is None:
        return "-"
    if pct:
        return f"{100 * x:.0f}%"
    return f"{x:.3g}" if isinstance(x, float) else str(x)


def replay_summary(summary: pl.DataFrame, result, err: Console) -> None:
    """Per rule: evaluable runs, alerts, runs alerted, first firing; then what was not evaluable."""
    table = Table("rule", "evaluable runs", "alerts", "runs alerted", "first fired at", header_style="bold")
    for r in summary.iter_rows(named=True):
        table.add_row(
            escape(r["rule"]),
            f"{r['runs_evaluable']}/{len(result.runs)}",
            str(r["alerts"]),
            str(r["runs_alerted"]),
            "" if r["first_fired"] is None else str(r["first_fired"]),
        )
    err.print(table)
    for rule_id, why in result.skipped.items():
        err.print(
            f"[dim]not evaluable here:[/] {escape(rule_id)}: {escape(why.split(';')[0])}", highlight=False
        )
    err.print(
        f"{result.alerts.height} alerts from {len(result.evaluable)} rules over {len(result.runs)} runs; "
        'see them with: workbench sql "SELECT * FROM alerts"',
        highlight=False,
    )


def backtest_report(result, budget: float, frontier, best_under_budget) -> None:
    """The scores table, each sweep's frontier and best point within the budget, the predictors."""
    out = Console()
    r0 = result.rules[0] if result.rules else {}
    out.print(
        f"[bold]Backtest[/] over {result.runs} runs: {r0.get('runs_failed', 0)} failed, "
        f"{r0.get('runs_healthy', 0)} healthy, {result.unknown_runs} unlabelled (left out)",
        highlight=False,
    )
    table = Table(
        "rule",
        "params",
        "eval",
        "trig fail",
        "trig ok",
        "recall (95% CI)",
        "precision",
        "FA/1k",
        "lead med",
        "first trigger",
        "never",
        header_style="bold",
    )
    for r in result.rules:
        ci = (
            f" ({_fmt(r['recall_ci_low'], True)}-{_fmt(r['recall_ci_high'], True)})"
            if r["recall_ci_low"] is not None
            else ""
        )
        first = (
            "-"
            if r["first_trigger_mean"] is None
            else f"{r['first_trigger_mean']:.0f} ± {_fmt(r['first_trigger_std'])}"
        )
        table.add_row(
            escape(r["rule"]),
            escape(r["params"][:40]),
            str(r["runs_evaluable"]),
            _fmt(r["trigger_rate_failed"], True),
            _fmt(r["trigger_rate_healthy"], True),
            _fmt(r["recall"], True) + ci,
            _fmt(r["precision"], True),
            _fmt(r["false_alarms_per_1k"]),
            _fmt(r["lead_time_median"]),
            first,
            str(r["never_fired"]),
        )
    out.print(table)
    swept = sorted({r["rule"] for r in result.rules if sum(x["rule"] == r["rule"] for x in result.rules) > 1})
    for rule_id in swept:
        front = frontier(result.rules, rule_id)
        best = best_under_budget(result.rules, rule_id, budget)
        pts = ", ".join(
            f"{p['params']}: recall {_fmt(p['recall'], True)} @ {_fmt(p['false_alarms_per_1k'])} FA/1k"
            for p in front
        )
        out.print(
            f"[bold]{escape(rule_id)}[/] frontier (recall vs false alarms per 1k steps): {escape(pts)}",
            highlight=False,
        )
        out.print(
            f"  best within {budget:g} FA/1k: "
            + (escape(f"{best['params']} (recall {_fmt(best['recall'], True)})") if best else "none"),
            highlight=False,
        )
    pt = Table(
        "predictor",
        "calls",
        "came true",
        "precision",
        "timing err",
        "final-loss err @10/25/50%",
        "last-value err @10/25/50%",
        header_style="bold",
    )
    for p in result.predictors:
        pt.add_row(
            p["predictor"],
            _fmt(p["calls"]),
            _fmt(p["calls_true"]),
            _fmt(p["precision"], True),
            _fmt(p["timing_error_median"]),
            " / ".join(_fmt(p[f"final_loss_error_at_{f}"]) for f in (10, 25, 50)),
            " / ".join(_fmt(p[f"baseline_error_at_{f}"]) for f in (10, 25, 50)),
        )
    out.print(pt)


def lineage_tree(node) -> None:
    """A lineage tree (ingest.lineage.TreeNode): runs, their resumes, and what continued them."""

    def label(run: dict) -> str:
        return (
            f"[bold]{escape(run['run_id'])}[/] [dim]{run.get('status')} · steps "
            f"{run.get('first_step')}–{run.get('last_step')} · {run.get('segments')} segments[/]"
        )

    def grow(branch: Tree, n) -> None:
        for e in n.resumes:
            branch.add(
                f"[cyan]resume[/] at step {e['parent_step']} (segment {e['child_segment']}): "
                f"[dim]{escape(e['evidence'])}[/]"
            )
        for e, child in n.children:
            changes = f" changes {escape(e['changes'])}" if e["changes"] else ""
            sub = branch.add(
                f"[magenta]{e['kind']}[/] from step {e['parent_step']}{changes} → " + label(child.run)
            )
            sub.add(f"[dim]{escape(e['evidence'])}[/]")
            grow(sub, child)

    root = Tree(label(node.run))
    grow(root, node)
    Console().print(root)


def check_report(report) -> None:
    """`workbench check`: what was verified, what is damaged, what --repair did."""
    out = _out()
    gen = f", generation {report.generation}" if report.generation else ""
    out.print(
        f"store {escape(str(report.root))}{gen}: {report.tables} tables and {report.parts:,} parts checked",
        highlight=False,
    )
    for d in report.damage:
        out.print(f"[red]damaged[/] {escape(d.path)} {escape(d.message)}", highlight=False)
    for line in report.repaired:
        out.print(f"[green]repaired[/] {escape(line)}", highlight=False)
    for line in report.refused:
        out.print(f"[red]not repaired[/] {escape(line)}", highlight=False)
    for d in report.after if report.repaired else []:
        out.print(f"[red]still damaged[/] {escape(d.path)} {escape(d.message)}", highlight=False)
    if report.ok:
        out.print("the store is whole" + (" again" if report.repaired else ""), highlight=False)
    elif not report.repaired and not report.refused:
        out.print(f"{len(report.damage)} damaged; repair with: workbench check --repair", highlight=False)
