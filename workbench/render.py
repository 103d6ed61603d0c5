"""Terminal rendering for the CLI: frames as tables (long cells wrap), the backtest report, the
lineage tree. A query's answer is drawn by `workbench.table`, without Rich.

Every string that came from a user or a log (run ids, paths, tags, rule ids) is escaped, so
that `[` in a name is text, never Rich markup.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

if TYPE_CHECKING:
    import polars as pl


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
        "not eval",
        "trig fail | LOFO",
        "trig ok | LOFO",
        "recall (95% CI) | LOFO",
        "precision | LOFO",
        "FA/1k | LOFO",
        "lead med",
        "first trigger",
        "never",
        header_style="bold",
        caption=_lofo_caption(),
    )
    for r in result.rules:
        table.add_row(
            escape(r["rule"]),
            escape(r["params"][:40]),
            str(r["runs_evaluable"]),
            _not_evaluable(r),
            _lofo(r, "trigger_rate_failed", True),
            _lofo(r, "trigger_rate_healthy", True),
            _fmt(r["recall"], True)
            + _ci(r["recall_ci_low"], r["recall_ci_high"])
            + " | "
            + _worst(r, "recall", True),
            _lofo(r, "precision", True),
            _lofo(r, "false_alarms_per_1k"),
            _fmt(r["lead_time_median"]),
            _first(r),
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
    _predictors(out, result, schedule=False)
    closing_note(out, result)


def _lofo_caption() -> str:
    from detectors.families import MIN_FAMILY_RUNS

    return (
        "a | b: in-sample | leave one family out: the worst family's figure "
        f"(among families with {MIN_FAMILY_RUNS} runs or more behind it)"
    )


def _worst(r: dict, key: str, pct: bool = False) -> str:
    """The leave-one-family-out figure of a score: the worst family's value and which family."""
    v, fam = r.get(f"lofo_{key}"), r.get(f"lofo_{key}_family")
    return "-" if v is None else f"{_fmt(v, pct)} ({escape(str(fam))})"


def _lofo(r: dict, key: str, pct: bool = False) -> str:
    return f"{_fmt(r.get(key), pct)} | {_worst(r, key, pct)}"


def _first(r: dict) -> str:
    """First trigger mean ± std on failed runs, and over how many when fewer than the guides' 5."""
    from detectors.kinds import FIRST_TRIGGER_MIN_RUNS

    if r["first_trigger_mean"] is None:
        return "-"
    n = r.get("first_trigger_runs") or 0
    few = f" (n={n} < {FIRST_TRIGGER_MIN_RUNS})" if n < FIRST_TRIGGER_MIN_RUNS else f" (n={n})"
    return f"{r['first_trigger_mean']:.0f} ± {_fmt(r['first_trigger_std'])}{few}"


def _not_evaluable(r: dict) -> str:
    nf, nh = r.get("not_evaluable_failed") or 0, r.get("not_evaluable_healthy") or 0
    return f"{nf}f {nh}h" if nf or nh else "0"


def closing_note(out: Console, result) -> None:
    """What a score cannot say: the runs rules could not evaluate, the worst family, what was skipped."""
    gone = [r for r in result.not_evaluable if r["rule"] != "ensemble"]
    if gone:
        reasons: dict[str, int] = {}
        for r in gone:
            head = r["reason"].split(":")[0]
            reasons[head] = reasons.get(head, 0) + 1
        out.print(
            f"[bold]Not evaluable[/]: {len(gone)} (rule, labelled run) pairs are out of those rules' rates "
            f"({', '.join(f'{n} {k}' for k, n in sorted(reasons.items()))}); the `not eval` column counts "
            "them per rule (f failed, h healthy), --format json or --out lists each with its reason.",
            highlight=False,
        )
    ens_missing = [r for r in result.not_evaluable if r["rule"] == "ensemble" and r["outcome"] == "failed"]
    if ens_missing:
        out.print(
            f"{len(ens_missing)} failed runs no rule could evaluate count as missed in the ensemble: "
            + escape(", ".join(r["run_id"] for r in ens_missing)),
            highlight=False,
        )
    for rule_id, why in result.skipped.items():
        out.print(
            f"[dim]not evaluable on any selected run:[/] {escape(rule_id)}: {escape(why)}", highlight=False
        )
    _families_note(out, result)


def _families_note(out: Console, result) -> None:
    if not result.attributes:
        out.print(
            'No leave-one-family-out figures: the labels carry no attributes (add e.g. trainer = "hf" '
            'or optimizer = "sgd" to the runs in labels.toml).',
            highlight=False,
        )
        return
    e = result.ensemble
    text = f"Leave one family out over {', '.join(map(escape, result.attributes))}"
    if e:
        sizes = {f"{f['attribute']}={f['family']}": f for f in result.families if f["rule"] == "ensemble"}

        def named(key: str, pct: bool, runs: str) -> str:
            fam = e.get(f"lofo_{key}_family")
            n = sizes.get(fam, {}).get(runs) if fam else None
            return f"{_fmt(e.get(f'lofo_{key}'), pct)} on {escape(fam or '-')} ({n} runs)" if fam else "-"

        text += (
            f"; the ensemble's worst family: recall {named('recall', True, 'evaluable_failed')} "
            f"(in-sample {_fmt(e['recall'], True)}), healthy runs triggered "
            f"{named('trigger_rate_healthy', True, 'evaluable_healthy')} (in-sample "
            f"{_fmt(e['trigger_rate_healthy'], True)}), false alarms per 1k steps "
            f"{named('false_alarms_per_1k', False, 'runs')}"
        )
    out.print(f"[bold]{text}[/]", highlight=False)


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
        f"({_fmt(e['false_alarms_per_1k'])} on all negative stretches), median lead {_fmt(e['lead_time_median'])}"
        + (
            f"; {e['not_evaluable_failed']} failed runs no member could evaluate count as missed"
            if e.get("not_evaluable_failed")
            else ""
        ),
        highlight=False,
    )


def backtest_summary(result) -> None:
    """The guides' table per rule (the in-job detector among them), the rule x failure-kind
    matrix, the ensemble, and the plateau predictors with the evaluation schedules they drive."""
    out = _out()
    _backtest_heading(out, "Backtest summary", result)
    table = Table(
        "rule",
        "origin",
        "eval",
        "first trigger (failed)",
        "trig fail (95% CI) | LOFO",
        "trig ok (95% CI) | LOFO",
        "separation | LOFO",
        "recall | LOFO",
        "FA/1k ok | LOFO",
        "lead med",
        "recovered auto",
        "recovered manual",
        "catches",
        header_style="bold",
        caption=_lofo_caption() + "; recovered: continuations that ended healthy / recoveries after an alarm",
    )
    for r in result.summary:
        table.add_row(
            escape(r["rule"]),
            escape(r["origin"] or ""),
            f"{r['runs_evaluable']} ({_not_evaluable(r)} not)",
            f"{_first(r)}, {r['never_fired']} never",
            _fmt(r["trigger_rate_failed"], True)
            + _ci(r["trigger_rate_failed_ci_low"], r["trigger_rate_failed_ci_high"])
            + " | "
            + _worst(r, "trigger_rate_failed", True),
            _fmt(r["trigger_rate_healthy"], True)
            + _ci(r["trigger_rate_healthy_ci_low"], r["trigger_rate_healthy_ci_high"])
            + " | "
            + _worst(r, "trigger_rate_healthy", True),
            _lofo(r, "separation", True),
            _lofo(r, "recall", True),
            _lofo(r, "false_alarms_per_1k_healthy"),
            _fmt(r["lead_time_median"]),
            _recovered(r, "automatic"),
            _recovered(r, "manual"),
            escape(", ".join(r["kinds_caught"])),
        )
    out.print(table)
    _kind_matrix(out, result)
    _ensemble_line(out, result.ensemble)
    _predictors(out, result)
    closing_note(out, result)


def _recovered(r: dict, mode: str) -> str:
    n = r.get(f"recoveries_{mode}") or 0
    return f"{r[f'recoveries_{mode}_healthy']}/{n}" if n else "-"


def scorecard(result, fmt: str = "table") -> None:
    """Every rule at its published default, per failure kind: precision, recall, FA/1k, median
    lead, first trigger mean ± std, in-sample | leave one family out; as a table or Markdown."""
    header = [
        "rule",
        "origin",
        "kind",
        "failed (eval)",
        "precision",
        "recall",
        "FA/1k",
        "lead med",
        "first trigger",
    ]
    rows = []
    for r in result.scorecard:
        if r["kind"] != "all" and not r["recall"]:
            continue  # a kind the rule detects none of (CSV and JSON carry every row)
        lofo_first = (
            f" | {_fmt(r['lofo_first_trigger_mean'])} ({r['lofo_first_trigger_mean_family']})"
            if r["lofo_first_trigger_mean"] is not None
            else ""
        )
        rows.append(
            [
                r["rule"],
                r["origin"] or "",
                r["kind"],
                f"{r['runs']} ({r['evaluable']})",
                _plain_lofo(r, "precision", True),
                _plain_lofo(r, "recall", True),
                _plain_lofo(r, "false_alarms_per_1k"),
                _plain_lofo(r, "lead_time_median"),
                (_first(r) if r["first_trigger_mean"] is not None else "-") + lofo_first,
            ]
        )
    note = (
        f"{_lofo_caption()}; families by {', '.join(result.attributes) or 'none (no label attributes)'}; "
        f"precision, FA/1k over the kind's failed runs and every healthy run; per rule, all kinds "
        f"and each kind it detects; failed (eval): labelled failed runs (those it could evaluate); "
        f"{result.runs} runs"
    )
    if fmt == "markdown":
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
        sys.stdout.write("\n".join(lines) + f"\n\n{note}\n")
        return
    table = Table(*header, header_style="bold", title="detector scorecard", caption=note)
    for row in rows:
        table.add_row(*map(escape, row))
    _out().print(table)


def _plain_lofo(r: dict, key: str, pct: bool = False) -> str:
    v, fam = r.get(f"lofo_{key}"), r.get(f"lofo_{key}_family")
    return f"{_fmt(r.get(key), pct)} | " + ("-" if v is None else f"{_fmt(v, pct)} ({fam})")


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


def _predictors(out: Console, result, schedule: bool = True) -> None:
    """The plateau callers and final-loss forecasts beside the naive ones, with their verdict."""
    if not result.predictors:
        return
    pt = Table(
        "predictor",
        "plateau calls",
        "came true",
        "precision",
        "recall (plateaus)",
        "false calls/1k",
        "timing err",
        "plateau-step err @10/25/50%",
        "final-loss err @10/25/50%",
        "last-value err @10/25/50%",
        "EMA err @10/25/50%",
        "verdict",
        header_style="bold",
        title="'plateau within 200 steps' and final-loss forecasts, beside naive baselines",
        caption=escape(result.predictors[0]["criterion"])
        + f" ({result.predictors[0]['plateaus_from_eval']} of the plateaus from eval curves); "
        "false calls per 1k steps of runs that never plateau; always: calls at every checkpoint",
    )
    for p in result.predictors:
        found = "-" if p["recall"] is None else f"{_fmt(p['recall'], True)} of {p['plateaus']}"
        pt.add_row(
            p["predictor"],
            _fmt(p["calls"]),
            _fmt(p["calls_true"]),
            _fmt(p["precision"], True),
            found,
            _fmt(p["false_calls_per_1k"]),
            _fmt(p["timing_error_median"]),
            " / ".join(_fmt(p[f"plateau_step_error_at_{f}"]) for f in (10, 25, 50)),
            " / ".join(_fmt(p[f"final_loss_error_at_{f}"]) for f in (10, 25, 50)),
            " / ".join(_fmt(p[f"baseline_error_at_{f}"]) for f in (10, 25, 50)),
            " / ".join(_fmt(p[f"ema_error_at_{f}"]) for f in (10, 25, 50)),
            escape(p["verdict"]),
        )
    out.print(pt)
    if not schedule or not result.schedule:
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
    cols += ["LOFO recall (worst family)", "LOFO FA/1k (worst family)"]
    if holdout:
        cols += [f"holdout ({t0['holdout_runs']} runs) picked", "holdout default"]
    table = Table(
        *cols,
        header_style="bold",
        title=f"tuning within {t0['budget']:g} FA/1k, {t0['folds']} folds",
        caption="LOFO: picked on every other family, scored on the held-out one; the worst family"
        + ("" if result.tuning_families else " (no label attributes with two families or more)"),
    )
    for t in result.tuning:
        row = [
            escape(t["rule"]),
            escape(_changed(t["picked_params"], t["default_params"])),
            _fmt(t["pick_agreement"], True),
            f"{_fmt(t['in_sample_recall'], True)} / {_fmt(t['in_sample_false_alarms_per_1k'])}",
            f"{_fmt(t['cv_recall'], True)} / {_fmt(t['cv_false_alarms_per_1k'])}",
            _fmt(t["optimism_recall"], True),
            _worst(t, "recall", True),
            _worst(t, "false_alarms_per_1k"),
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
