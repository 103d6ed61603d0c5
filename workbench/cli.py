"""The `workbench` command: a thin shell over the library (parse, call, format)."""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from workbench.store import Store, StoreError

STORE_HELP = "Store folder (default: $WORKBENCH_STORE or .workbench/)."
FORMATS = click.Choice(["table", "csv", "json"])
err = Console(stderr=True)


def _store_option(f):
    return click.option("--store", "store", default=None, metavar="DIR", help=STORE_HELP)(f)


def _format_option(f):
    return click.option(
        "--format",
        "fmt",
        type=FORMATS,
        default="table",
        show_default=True,
        help="table for people; csv (as DuckDB renders it) or json (one array of objects) for programs.",
    )(f)


def _rules_option(f):
    return click.option(
        "--rules",
        "rules_file",
        default=None,
        metavar="FILE",
        help="A TOML rule file (default: the built-ins and the guides' rules).",
    )(f)


def _fail(message: str, code: int = 2):
    err.print(f"[red]error:[/] {message}", highlight=False)
    sys.exit(code)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="training-log-workbench")
def main():
    """Training-log workbench: ingest training logs into one store, query them, and
    backtest alert rules against what really happened.

    \b
    Example:
      workbench ingest sample_runs/
      workbench runs
      workbench sql "SELECT run_id, max(step) FROM scalars GROUP BY run_id"
    """


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@_store_option
@click.option("--strict", is_flag=True, help="Exit non-zero when any file or record had a problem.")
@click.option("--no-crc", is_flag=True, help="Skip TensorBoard CRC checks (faster; damage goes unnoticed).")
@click.option(
    "--hash",
    "hash_checkpoints",
    is_flag=True,
    help="Hash checkpoint files (sha256) and check them against their metadata and the last ingest.",
)
@click.option(
    "--wait",
    "wait_s",
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="How long to wait for another ingest writing to the same store.",
)
def ingest(paths, store, strict, no_crc, hash_checkpoints, wait_s):
    """Read every log under PATHS into the store, incrementally.

    A run is a folder holding log files; its id is its path relative to PATH. Unchanged files
    are not re-read, grown files are read from where the last ingest stopped, and damaged
    records are skipped and reported with their byte offset. Exits 0 when problems were only
    per file or record, 1 with --strict if there were any, 2 when nothing could be read.

    \b
    Example:
      workbench ingest ./runs --store .workbench
      workbench sql "SELECT * FROM problems"
    """
    from ingest.pipeline import ingest as run_ingest
    from ingest.pipeline import print_report

    try:
        report = run_ingest(
            list(paths),
            Store(store),
            check_crc=not no_crc,
            hash_checkpoints=hash_checkpoints,
            wait_s=wait_s,
            console=err,
        )
    except StoreError as e:
        _fail(str(e))
    print_report(report, err)
    if report.log_files == 0:
        _fail(
            f"no log files found under {', '.join(map(str, paths))} "
            "(looked for TensorBoard event files); check the path"
        )
    if strict and report.problems:
        sys.exit(1)


@main.command()
@click.argument("query")
@_store_option
@_format_option
def sql(query, store, fmt):
    """Run a read-only SQL query (DuckDB dialect) over the store's views.

    \b
    Views: runs, files, scalars (current points, unique on run_id, tag, step),
    scalars_all (every stored point, with source, segment, superseded),
    events, problems.

    \b
    Example:
      workbench sql "SELECT tag, count(*) FROM scalars WHERE run_id = 'run_a' GROUP BY tag"
      workbench sql "SELECT * FROM scalars_all WHERE superseded" --format csv
    """
    _print_query(Store(store), query, fmt)


@main.command()
@_store_option
@_format_option
def runs(store, fmt):
    """List the runs in the store with their status, formats, steps and points.

    \b
    Example:
      workbench runs --format csv
    """
    _print_query(
        Store(store),
        "SELECT run_id, status, formats, files, segments, points, tags, first_step, last_step, "
        "problems, evidence FROM runs ORDER BY run_id",
        fmt,
    )


@main.command()
@click.argument("run")
@_store_option
@_format_option
def tags(run, store, fmt):
    """List the tags of RUN with their canonical metric, point counts and step range.

    \b
    Example:
      workbench tags run_a
    """
    s = Store(store)
    lit = "'" + run.replace("'", "''") + "'"
    q = (
        "SELECT tag, metric, count(*) AS points, min(step) AS first_step, max(step) AS last_step, "
        "count(*) FILTER (WHERE NOT isfinite(value)) AS non_finite "
        f"FROM scalars WHERE run_id = {lit} GROUP BY tag, metric ORDER BY tag"
    )
    try:
        known = s.connect().execute(f"SELECT count(*) FROM runs WHERE run_id = {lit}").fetchall()[0][0]
    except StoreError as e:
        _fail(str(e))
    if not known:
        _fail(f"no run {run!r} in {s.root}; list them with: workbench runs")
    _print_query(s, q, fmt)


@main.command()
@click.argument("run")
@click.option("--outcome", type=click.Choice(["failed", "healthy", "unknown"]), required=True)
@click.option("--onset", type=int, default=None, help="Step where the failure starts (failed runs).")
@click.option("--kind", default=None, help="What failed, e.g. divergence_nan, loss_spike, plateau.")
@click.option("--note", default=None)
@_store_option
def label(run, outcome, onset, kind, note, store):
    """Label RUN by hand. It overrides labels.toml and evidence-based (auto) labels.

    \b
    Example:
      workbench label exp1 --outcome failed --onset 424 --kind divergence_nan
      workbench sql "SELECT * FROM labels"
    """
    from workbench.store import CLI_LABEL_ORIGIN

    s = Store(store)
    lit = "'" + run.replace("'", "''") + "'"
    try:
        known = s.connect().execute(f"SELECT count(*) FROM runs WHERE run_id = {lit}").fetchall()[0][0]
    except StoreError as e:
        _fail(str(e))
    if not known:
        _fail(f"no run {run!r} in {s.root}; list them with: workbench runs")
    if outcome == "failed" and onset is None:
        err.print("note: a failed run without --onset is counted, but gives no lead time", highlight=False)
    try:
        with s.writer() as w:
            w.set_labels(
                CLI_LABEL_ORIGIN,
                [{"run_id": run, "outcome": outcome, "onset": onset, "kind": kind, "note": note}],
            )
            w.commit()
    except StoreError as e:
        _fail(str(e))
    err.print(
        f"labelled {run}: {outcome}" + (f" at step {onset}" if onset is not None else ""), highlight=False
    )


def _load_rules(rules_file):
    from detectors.rules import RuleFileError, load_rule_file

    if rules_file is None:
        return None
    try:
        return load_rule_file(rules_file)
    except RuleFileError as e:
        _fail(str(e), 1)


@main.command()
@_rules_option
@_format_option
def rules(rules_file, fmt):
    """List rules with their conditions and parameters (built-ins and the guides' set, or FILE).

    \b
    Example:
      workbench rules
      workbench rules --rules my_rules.toml --format csv
    """
    import json as _json

    import polars as pl

    from workbench.replay import default_rules

    loaded = _load_rules(rules_file) or default_rules()
    rows = [
        {
            "id": r.id,
            "when": r.when or "(computed in code)",
            "for_steps": r.for_steps,
            "cooldown": r.cooldown,
            "params": _json.dumps(r.params),
            "sweep": _json.dumps(r.sweep) if r.sweep else "",
            "description": " ".join((r.description or "").split()),
        }
        for r in loaded
    ]
    _print_frame(pl.DataFrame(rows), fmt)


@main.command()
@_rules_option
@click.option(
    "--runs", "runs_glob", default=None, metavar="GLOB", help="Only runs whose id matches (e.g. 'sweep_*')."
)
@_store_option
def replay(rules_file, runs_glob, store):
    """Replay rules over stored runs as they would have fired live; store the alerts.

    Each rule runs at its own parameters ([rule.params]); `workbench backtest` also sweeps.
    The alerts land in the `alerts` view (run_id, rule, tag, step_start, step_fired, step_end,
    value, message, params, severity).

    \b
    Example:
      workbench replay --rules detectors/guides.toml --runs 'exp*'
      workbench sql "SELECT rule, run_id, step_fired, message FROM alerts ORDER BY step_fired"
    """
    import polars as pl

    from workbench.replay import ReplayError, run_replay

    try:
        result, skipped = run_replay(Store(store), _load_rules(rules_file), runs_glob)
    except (ReplayError, StoreError) as e:
        _fail(str(e), 1)
    by_rule = result.alerts.group_by("rule").agg(
        alerts=pl.len(), runs_alerted=pl.col("run_id").n_unique(), first_fired=pl.col("step_fired").min()
    )
    summary = pl.DataFrame(
        {"rule": list(result.evaluable), "runs_evaluable": [len(v) for v in result.evaluable.values()]}
    )
    summary = summary.join(by_rule, on="rule", how="left").with_columns(
        pl.col("alerts", "runs_alerted").fill_null(0)
    )
    table = Table("rule", "evaluable runs", "alerts", "runs alerted", "first fired at", header_style="bold")
    for r in summary.iter_rows(named=True):
        table.add_row(
            r["rule"],
            f"{r['runs_evaluable']}/{len(result.runs)}",
            str(r["alerts"]),
            str(r["runs_alerted"]),
            "" if r["first_fired"] is None else str(r["first_fired"]),
        )
    err.print(table)
    for rule_id, why in skipped.items():
        err.print(f"[dim]not evaluable here:[/] {rule_id}: {why.split(';')[0]}", highlight=False)
    err.print(
        f"{result.alerts.height} alerts from {len(result.evaluable)} rules over {len(result.runs)} runs; "
        'see them with: workbench sql "SELECT * FROM alerts"',
        highlight=False,
    )


@main.command()
@_rules_option
@click.option("--runs", "runs_glob", default=None, metavar="GLOB", help="Only runs whose id matches.")
@click.option(
    "--horizon",
    default=100,
    show_default=True,
    metavar="N",
    help="Steps after the onset an alarm still counts.",
)
@click.option(
    "--lead",
    default=500,
    show_default=True,
    metavar="N",
    help="Steps before the onset an alarm counts as a detection (earlier: a false alarm).",
)
@click.option(
    "--warmup",
    default=0,
    show_default=True,
    metavar="N",
    help="Steps from each run's start whose alarms are ignored.",
)
@click.option(
    "--budget",
    default=1.0,
    show_default=True,
    metavar="FA",
    help="False alarms per 1k steps allowed when picking a sweep's best point.",
)
@click.option(
    "--bootstrap",
    default=1000,
    show_default=True,
    metavar="B",
    help="Bootstrap resamples over runs for the 95 % intervals (0: none).",
)
@click.option(
    "--out",
    "out_dir",
    default=None,
    type=click.Path(path_type=Path),
    metavar="DIR",
    help="Also write backtest.json, rules.csv, rules.parquet, predictors.csv there.",
)
@_store_option
@_format_option
def backtest(rules_file, runs_glob, horizon, lead, warmup, budget, bootstrap, out_dir, store, fmt):
    """Score rules (and each point of their sweeps) and convergence predictors on labelled runs.

    Trigger rates on failed vs healthy runs, recall within [onset - lead, onset + horizon],
    precision, false alarms per 1k steps, lead time and first-trigger step (mean, std, never
    fired), 95 % bootstrap intervals over runs. Runs need labels: a labels.toml beside them,
    `workbench label`, or evidence (NaN loss, loss-scale floor, crash) for automatic ones.

    \b
    Example:
      workbench backtest
      workbench backtest --rules detectors/guides.toml --horizon 200 --format json > scores.json
    """
    import polars as pl

    from workbench.backtest import Settings, best_under_budget, frontier
    from workbench.backtest import backtest as run_backtest
    from workbench.replay import ReplayError

    settings = Settings(horizon=horizon, lead=lead, warmup=warmup, bootstrap=bootstrap)
    try:
        result = run_backtest(Store(store), _load_rules(rules_file), runs_glob, settings)
    except (ReplayError, StoreError) as e:
        _fail(str(e), 1)
    rules_df = pl.DataFrame(result.rules, infer_schema_length=None)
    preds_df = pl.DataFrame(result.predictors, infer_schema_length=None)
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "backtest.json").write_text(result.to_json() + "\n")
        rules_df.write_csv(out_dir / "rules.csv")
        rules_df.write_parquet(out_dir / "rules.parquet")
        preds_df.write_csv(out_dir / "predictors.csv")
    if fmt == "json":
        sys.stdout.write(result.to_json() + "\n")
        return
    if fmt == "csv":
        sys.stdout.write(rules_df.write_csv())
        return
    _print_backtest_tables(result, rules_df, budget, frontier, best_under_budget)


def _fmt(x, pct=False):
    if x is None:
        return "-"
    if pct:
        return f"{100 * x:.0f}%"
    return f"{x:.3g}" if isinstance(x, float) else str(x)


def _print_backtest_tables(result, rules_df, budget, frontier, best_under_budget) -> None:
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
            r["rule"],
            r["params"][:40],
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
            f"[bold]{rule_id}[/] frontier (recall vs false alarms per 1k steps): {pts}", highlight=False
        )
        out.print(
            f"  best within {budget:g} FA/1k: "
            + (f"{best['params']} (recall {_fmt(best['recall'], True)})" if best else "none"),
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


@main.command()
@click.argument("run")
@click.option(
    "--stitch",
    "stitch_tag",
    default=None,
    metavar="TAG",
    help="Print one series stitched along the path from the root to RUN.",
)
@_store_option
@_format_option
def lineage(run, stitch_tag, store, fmt):
    """Show where RUN came from and what continued it: resumes, recovery restarts, forks.

    Each edge shows the checkpoint step it continued from and its evidence (a writer segment
    restarting below the previous one's last step, checkpoint metadata, a RECOVERY TRIGGERED line,
    a "Loading checkpoint" line). All edges: workbench sql "SELECT * FROM lineage".

    \b
    Example:
      workbench lineage attention_collapse_recovery
      workbench lineage attention_collapse_recovery --stitch loss --format csv
    """
    from rich.tree import Tree

    from workbench import lineage as L

    s = Store(store)
    try:
        con = s.connect()
    except StoreError as e:
        _fail(str(e))
    if not con.execute("SELECT count(*) FROM runs WHERE run_id = ?", [run]).fetchall()[0][0]:
        _fail(f"no run {run!r} in {s.root}; list them with: workbench runs")
    if stitch_tag:
        series = L.stitched(con, run, stitch_tag)
        if series.is_empty():
            _fail(
                f"no {stitch_tag!r} points along the lineage of {run}; list tags with: workbench tags {run}"
            )
        _print_frame(series, fmt)
        return
    path, edges, runs = L.tree_rows(con, run)
    info = {r["run_id"]: r for r in runs.iter_rows(named=True)}

    def label(r):
        i = info.get(r, {})
        return f"[bold]{r}[/] [dim]{i.get('status')} · steps {i.get('first_step')}–{i.get('last_step')} · {i.get('segments')} segments[/]"

    def grow(node, r, seen):
        for e in edges.filter(pl.col("parent_run") == r).iter_rows(named=True):
            if e["child_run"] == r:
                node.add(
                    f"[cyan]resume[/] at step {e['parent_step']} (segment {e['child_segment']}): [dim]{e['evidence']}[/]"
                )
            elif e["child_run"] not in seen:
                changes = f" changes {e['changes']}" if e["changes"] else ""
                child = node.add(
                    f"[magenta]{e['kind']}[/] from step {e['parent_step']}{changes} → "
                    + label(e["child_run"])
                )
                child.add(f"[dim]{e['evidence']}[/]")
                grow(child, e["child_run"], seen | {e["child_run"]})

    import polars as pl

    root = Tree(label(path[0][0]))
    grow(root, path[0][0], {path[0][0]})
    Console().print(root)


def _print_frame(frame, fmt: str) -> None:
    if fmt == "json":
        sys.stdout.write(frame.write_json() + "\n")
    elif fmt == "csv":
        sys.stdout.write(frame.write_csv())
    else:
        table = Table(*frame.columns, header_style="bold")
        for row in frame.iter_rows():
            table.add_row(*["" if v is None else str(v) for v in row])
        Console(width=None if sys.stdout.isatty() else 100_000).print(table, crop=False)


def _print_query(store: Store, query: str, fmt: str) -> None:
    from workbench.query import QueryError, run_query

    try:
        out = run_query(store, query, fmt="json" if fmt == "json" else "csv")
    except (QueryError, StoreError) as e:
        _fail(str(e), 1)
    if fmt == "table":
        rows = list(csv.reader(io.StringIO(out)))
        table = Table(header_style="bold")
        for name in rows[0] if rows else []:
            table.add_column(name, no_wrap=True, overflow="ellipsis")
        for r in rows[1:]:
            table.add_row(*r)
        out_console = Console()
        if not out_console.is_terminal:
            out_console = Console(width=100_000)  # piped: never cut a value
        out_console.print(table, crop=False)
        print(f"({len(rows) - 1} rows)", file=sys.stderr)
    else:
        sys.stdout.write(out)
