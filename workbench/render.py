"""Terminal rendering for the CLI: tables, the backtest report, the lineage tree.

Every string that came from a user or a log (run ids, paths, tags, rule ids) is escaped, so
that `[` in a name is text, never Rich markup.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

if TYPE_CHECKING:
    import polars as pl

# a table shows this many rows at most, the first and last halves (DuckDB's CLI does the same):
# 10k rows through Rich's layout take seconds, and nobody reads them there; CSV and JSON are whole
MAX_TABLE_ROWS = 40


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
    header, body = (rows[0], rows[1:]) if rows else ([], [])
    table = Table(header_style="bold")
    for name in header:
        table.add_column(escape(name), no_wrap=True, overflow="ellipsis")
    half = MAX_TABLE_ROWS // 2
    shown = body if len(body) <= MAX_TABLE_ROWS else [*body[:half], None, *body[-half:]]
    for r in shown:
        table.add_row(*(map(escape, r) if r is not None else ["⋮"] * len(header)))
    _out().print(table, crop=False)
    if len(shown) < len(body):
        print(f"({len(body)} rows, {MAX_TABLE_ROWS} shown; --format csv or json gives all)", file=sys.stderr)
    else:
        print(f"({len(body)} rows)", file=sys.stderr)


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


def _backtest_heading(out: Console, title: str, result) -> None:
    r0 = result.rules[0] if result.rules else {}
    out.print(
        f"[bold]{title}[/] over {result.runs} runs: {r0.get('runs_failed', 0)} failed, "
        f"{r0.get('runs_healthy', 0)} healthy, {result.unknown_runs} unlabelled (left out)",
        highlight=False,
    )


def backtest_report(result, budget: float, frontier, best_under_budget) -> None:
    """The scores table, each sweep's frontier and best point within the budget, the predictors."""
    out = _out()
    _backtest_heading(out, "Backtest", result)
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
    _ensemble_line(out, result.ensemble)
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


def csv_rows(rows: list[dict]) -> str:
    """Report rows as CSV (list values joined by spaces)."""
    from detectors.backtest import table

    return table(rows).write_csv() if rows else ""


def _changed(params: str, default: str | None) -> str:
    """The parameters of a pick that differ from the default's, as k=v."""
    p, d = json.loads(params), json.loads(default or "{}")
    diff = [f"{k}={v}" for k, v in p.items() if d.get(k) != v]
    return ", ".join(diff) if diff else "= default"


def _ci(lo, hi) -> str:
    return f" ({_fmt(lo, True)}-{_fmt(hi, True)})" if lo is not None else ""


def _ensemble_line(out: Console, e: dict | None) -> None:
    if not e:
        return
    out.print(
        f"[bold]Ensemble[/] (any of {len(e['members'])} rules at their own parameters): recall "
        f"{_fmt(e['recall'], True)}{_ci(e['recall_ci_low'], e['recall_ci_high'])}, trigger rate failed "
        f"{_fmt(e['trigger_rate_failed'], True)} vs healthy {_fmt(e['trigger_rate_healthy'], True)}, "
        f"{_fmt(e['false_alarms_per_1k_healthy'])} false alarms per 1k healthy steps "
        f"({_fmt(e['false_alarms_per_1k'])} on all negative stretches), median lead {_fmt(e['lead_time_median'])}",
        highlight=False,
    )


def backtest_summary(result) -> None:
    """The seed-style summary per rule, the rule x failure-kind matrix, the ensemble, and the
    plateau predictors with the evaluation schedules they drive."""
    out = _out()
    _backtest_heading(out, "Backtest summary", result)
    table = Table(
        "rule",
        "eval",
        "first trigger (failed)",
        "trig fail (95% CI)",
        "trig ok (95% CI)",
        "separation",
        "recall",
        "FA/1k ok",
        "lead med",
        "recovered",
        "catches",
        header_style="bold",
    )
    for r in result.summary:
        first = (
            "-"
            if r["first_trigger_mean"] is None
            else f"{r['first_trigger_mean']:.0f} ± {_fmt(r['first_trigger_std'])}"
        )
        recovered = (
            f"{r['recoveries_healthy']}/{r['recoveries_after_alarm']}" if r["recoveries_after_alarm"] else "-"
        )
        table.add_row(
            escape(r["rule"]),
            str(r["runs_evaluable"]),
            f"{first} ({r['never_fired']} never)",
            _fmt(r["trigger_rate_failed"], True)
            + _ci(r["trigger_rate_failed_ci_low"], r["trigger_rate_failed_ci_high"]),
            _fmt(r["trigger_rate_healthy"], True)
            + _ci(r["trigger_rate_healthy_ci_low"], r["trigger_rate_healthy_ci_high"]),
            _fmt(r["separation"], True),
            _fmt(r["recall"], True),
            _fmt(r["false_alarms_per_1k_healthy"]),
            _fmt(r["lead_time_median"]),
            recovered,
            escape(", ".join(r["kinds_caught"])),
        )
    out.print(table)
    _kind_matrix(out, result)
    _ensemble_line(out, result.ensemble)
    _predictors(out, result)


def _kind_matrix(out: Console, result) -> None:
    """Detected / evaluable runs per rule (at its own parameters) and failure kind; healthy: fired / evaluable."""
    defaults = {(r["rule"], r["params"]) for r in result.rules if r["default"]}
    cells: dict[str, dict[str, dict]] = {}
    for k in result.kinds:
        if (k["rule"], k["params"]) in defaults or k["rule"] == "ensemble":
            cells.setdefault(k["rule"], {})[k["kind"]] = k
    kinds = sorted({k for row in cells.values() for k in row} - {"healthy"}) + ["healthy"]
    table = Table(
        "rule", *map(escape, kinds), header_style="bold", title="detected / evaluable runs per failure kind"
    )
    for rule_id, row in cells.items():
        vals = []
        for kind in kinds:
            c = row.get(kind)
            if not c or not c["evaluable"]:
                vals.append("[dim]-[/]")
                continue
            n = c["triggered"] if kind == "healthy" else c["detected"]
            vals.append(f"{n}/{c['evaluable']}")
        table.add_row(escape(rule_id), *vals)
    out.print(table)


def _predictors(out: Console, result) -> None:
    pt = Table(
        "predictor",
        "plateau calls",
        "came true",
        "precision",
        "plateaus found",
        "timing err",
        "plateau-step err @10/25/50%",
        "final-loss err @10/25/50%",
        "last-value err @10/25/50%",
        header_style="bold",
        title="'plateau within 200 steps' and final-loss forecasts",
    )
    for p in result.predictors:
        found = "-" if p["recall"] is None else f"{_fmt(p['recall'], True)} of {p['plateaus']}"
        pt.add_row(
            p["predictor"],
            _fmt(p["calls"]),
            _fmt(p["calls_true"]),
            _fmt(p["precision"], True),
            found,
            _fmt(p["timing_error_median"]),
            " / ".join(_fmt(p[f"plateau_step_error_at_{f}"]) for f in (10, 25, 50)),
            " / ".join(_fmt(p[f"final_loss_error_at_{f}"]) for f in (10, 25, 50)),
            " / ".join(_fmt(p[f"baseline_error_at_{f}"]) for f in (10, 25, 50)),
        )
    out.print(pt)
    if not result.schedule:
        return
    s0 = result.schedule[0]
    st = Table(
        "schedule driven by",
        "evals (fixed)",
        "evals (dynamic)",
        "saved",
        "knees",
        "knees missed",
        header_style="bold",
        title=f"evaluate every {s0['eval_every']} steps, {s0['stretch']}x as far apart while the predictor calls a plateau",
    )
    for s in result.schedule:
        st.add_row(
            s["predictor"],
            str(s["fixed_evals"]),
            str(s["dynamic_evals"]),
            _fmt(s["evals_saved"], True),
            str(s["knees"]),
            str(s["knees_missed"]),
        )
    out.print(st)


def tuning_report(result) -> None:
    """Per tuned rule: the pick in-sample and cross-validated (and on the holdout runs)."""
    out = _out()
    if not result.tuning:
        out.print("No rule has more than one parameter point to pick among.")
        return
    t0 = result.tuning[0]
    holdout = any(t["holdout_runs"] for t in result.tuning)
    cols = ["rule", "picked", "agree", "in-sample recall / FA", "cross-val recall / FA", "optimism"]
    if holdout:
        cols += [f"holdout ({t0['holdout_runs']} runs) picked", "holdout default"]
    table = Table(
        *cols,
        header_style="bold",
        title=f"tuning within {t0['budget']:g} FA/1k, {t0['folds']} folds",
    )
    for t in result.tuning:
        row = [
            escape(t["rule"]),
            escape(_changed(t["picked_params"], t["default_params"])),
            _fmt(t["pick_agreement"], True),
            f"{_fmt(t['in_sample_recall'], True)} / {_fmt(t['in_sample_false_alarms_per_1k'])}",
            f"{_fmt(t['cv_recall'], True)} / {_fmt(t['cv_false_alarms_per_1k'])}",
            _fmt(t["optimism_recall"], True),
        ]
        if holdout:
            row += [
                f"{_fmt(t['holdout_recall'], True)} / {_fmt(t['holdout_false_alarms_per_1k'])}",
                f"{_fmt(t['default_holdout_recall'], True)} / {_fmt(t['default_holdout_false_alarms_per_1k'])}",
            ]
        table.add_row(*row)
    out.print(table)


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
    _out().print(root)


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


# the query that lists what `ingest` folds into its summary's note count
NOTES_QUERY = "SELECT path, note FROM files WHERE format IS NOT NULL AND note IS NOT NULL"


def ingest_report(report, err: Console, verbose: bool = False, max_problems: int = 20) -> None:
    """An ingest's problems, then its one-line summary, on stderr. Notes (assumptions a reader
    made, such as a batch size or steps counted from timers) are counted in the summary, as pip
    and cargo count warnings; `verbose` lists them."""
    for path, p in report.problems[:max_problems]:
        err.print(f"[yellow]problem[/] {escape(path)} @ {p.offset}: {escape(p.message)}", highlight=False)
    if len(report.problems) > max_problems:
        err.print(
            f'... and {len(report.problems) - max_problems} more: workbench sql "SELECT * FROM problems"',
            highlight=False,
        )
    if verbose:
        for path, note in report.notes:
            err.print(f"[dim]note[/] {escape(path)}: {escape(note)}", highlight=False)
    for table, why in report.derive_errors.items():
        err.print(
            f"[yellow]problem[/] {table} not updated (the last one is kept): {escape(why)}", highlight=False
        )
    mb = report.bytes_read / 1e6
    err.print(
        f"ingested {len(report.runs)} runs: {report.files_read} files read, "
        f"{report.files_unchanged} unchanged, {report.files_skipped} skipped (not logs); "
        f"{report.points:,} points, {mb:,.1f} MB in {report.seconds:.2f}s; "
        f"{len(report.problems)} problems",
        highlight=False,
    )
    if report.notes and not verbose:
        n = len(report.notes)
        err.print(
            f"{n} note{'s' if n != 1 else ''} (assumptions readers made): --verbose lists them, or "
            f'workbench sql "{NOTES_QUERY}"',
            highlight=False,
            soft_wrap=True,
        )
    sys.stderr.flush()
