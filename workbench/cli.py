"""The `workbench` command: a thin shell over the library (parse, call one function, render).

Errors users can act on are `WorkbenchError`s, turned into `error: <message>` and the error's
exit code in one place (`WorkbenchGroup.invoke`). Imports of the heavy layers happen inside the
commands, so `--help` and small commands start quickly.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from workbench.errors import NotFoundError, WorkbenchError

if TYPE_CHECKING:
    from rich.console import Console

STORE_HELP = "Store folder (default: $WORKBENCH_STORE or .workbench/)."
FORMATS = click.Choice(["table", "csv", "json"])


@functools.cache
def err() -> Console:
    """stderr for people, made on first use (`--format csv` and `json` load no rich)."""
    from rich.console import Console

    console = Console(stderr=True)
    console.soft_wrap = (
        not console.is_terminal
    )  # a message piped to a log is one line, never cut at 80 columns
    return console


def escape(text: str) -> str:
    """`text` as Rich shows it literally (a `[` in a run id is no markup)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


class WorkbenchGroup(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except WorkbenchError as e:
            err().print(f"[red]error:[/] {escape(str(e))}", highlight=False)
            sys.exit(e.exit_code)


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


def _load_rules(rules_file):
    from detectors.rules import load_rule_file

    return None if rules_file is None else load_rule_file(rules_file)


def _answer(fmt: str) -> str:
    """What DuckDB renders for an output format (a table is drawn from its CSV)."""
    return "json" if fmt == "json" else "csv"


def _pyarrow_without_pandas() -> None:
    """pyarrow imports pandas (0.4 s of CPU, a fifth of a small ingest) on its first array,
    only to know pandas objects and pandas.NA when it meets them; a command that hands it none
    lets it find no pandas on that first look (`to_pandas` still imports it when called)."""
    if "pandas" in sys.modules:
        return
    import types

    import pyarrow.lib

    class NoPandas(types.ModuleType):
        def __getattr__(self, name):
            raise ImportError("pandas is not loaded by this command")

    sys.modules["pandas"] = NoPandas("pandas")
    try:
        with contextlib.suppress(ImportError, AttributeError):  # (a pyarrow without that private probe)
            pyarrow.lib._pandas_api.have_pandas  # noqa: B018 - pyarrow looks once, here
        pyarrow.array(["x"])  # and once for converting Python values
    finally:
        del sys.modules["pandas"]


_answered: list[bool] = []  # a read command printed its answer: the process has nothing left to do


def _show_answer(text: str, fmt: str) -> None:
    """DuckDB's CSV or JSON as it came, or a table drawn from its CSV."""
    from workbench import table

    try:
        table.query_text(text, fmt)
        sys.stdout.flush()  # a full disk is said here, not lost at exit
    except BrokenPipeError:
        pass  # the reader closed the pipe early (`| head`): it has what it wanted
    except OSError as e:
        raise WorkbenchError(f"the answer could not be written to standard output ({e.strerror})") from None
    _answered.append(True)


def run() -> None:
    """The `workbench` command (`main` as a process). A read that printed its answer ends
    without the interpreter's teardown, which unloads DuckDB and every module one by one: it
    took as long again as the whole read (benchmarks/cli_startup.py). Exit handlers still run
    (a connection's lease is let go, as on any exit)."""
    try:
        main()
    except SystemExit as e:
        if not (_answered and e.code in (0, None)):
            raise
    else:
        if not _answered:
            return
    import atexit
    import os

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError):  # (stdout was flushed with the answer: `_show_answer`)
            stream.flush()
    atexit._run_exitfuncs()
    os._exit(0)


def _store(store):
    from workbench.store import Store

    return Store(store)


@click.group(
    cls=WorkbenchGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100}
)
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


def _executor_options(f):
    f = click.option(
        "--address",
        default=None,
        metavar="ADDR",
        help="With --executor ray: the cluster to join (default: $RAY_ADDRESS, else a local one).",
    )(f)
    return click.option(
        "--executor",
        "executor_name",
        type=click.Choice(["local", "ray"]),
        default="local",
        show_default=True,
        help="Where per-run work runs: here, or as Ray tasks (pip install -e '.[ray]').",
    )(f)


def _executor(name, address):
    """None for the local default (the library picks in-process or a process per core); Ray
    only when asked for."""
    from workbench.executor import make_executor

    if name == "local" and not address:
        return None
    return make_executor(name, address)


@main.command()
@click.argument("paths", nargs=-1, required=True, metavar="PATHS...")
@_store_option
@click.option("--strict", is_flag=True, help="Exit non-zero when any file or record had a problem.")
@click.option("--no-crc", is_flag=True, help="Skip TensorBoard CRC checks (faster; damage goes unnoticed).")
@click.option(
    "--hash",
    "hash_checkpoints",
    is_flag=True,
    help="Hash checkpoint files (sha256) when first seen or changed, and check each against its "
    "copies (metadata JSON, .tar/.tar.gz/.tar.zst archive) and the last ingest.",
)
@click.option(
    "--wait",
    "wait_s",
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="How long to wait for another ingest writing to the same store.",
)
@click.option(
    "-v", "--verbose", is_flag=True, help="List every note (assumptions readers made), not just their count."
)
@_executor_options
def ingest(paths, store, strict, no_crc, hash_checkpoints, wait_s, verbose, executor_name, address):
    """Read every log under PATHS (folders, files, or object-storage URLs) into the store,
    incrementally.

    A run is a folder holding log files; its id is its path relative to PATH. Unchanged files
    are not re-read, grown files are read from where the last ingest stopped, and damaged
    records are skipped and reported with their byte offset. Exits 0 when problems were only
    per file or record, 1 with --strict if there were any, 2 when nothing could be read.
    An s3:// (gs://, az://, any fsspec) URL is mirrored into the store, fetching only what
    changed (pip install -e '.[s3]'; credentials and endpoint as fsspec takes them, e.g.
    $FSSPEC_S3_ENDPOINT_URL).

    \b
    Example:
      workbench ingest ./runs --store .workbench
      workbench ingest s3://lab-logs/pretrain --store .workbench
      workbench sql "SELECT * FROM problems"
    """
    from ingest.pipeline import ingest as run_ingest
    from ingest.source import as_urls, resolve
    from workbench import render

    _pyarrow_without_pandas()
    st = _store(store)
    paths, synced = resolve(list(paths), st.root)
    for s in synced:
        err().print(escape(s.line()), highlight=False)
    report = run_ingest(
        paths,
        st,
        check_crc=not no_crc,
        hash_checkpoints=hash_checkpoints,
        wait_s=wait_s,
        console=err(),
        executor=_executor(executor_name, address),
    )
    as_urls(report, synced)
    render.ingest_report(report, err(), verbose=verbose)
    if report.log_files == 0:
        raise NotFoundError(
            f"no log files found under {', '.join(map(str, paths))}; check the path "
            "(formats read: workbench ingest --help, and the README's format list)"
        )
    if strict and report.problems:
        sys.exit(1)


@main.command()
@click.option(
    "--repair",
    is_flag=True,
    help="Mend what is damaged: go back to the newest intact generation, read damaged parts "
    "again from their logs, drop what cannot be read again (reported).",
)
@_store_option
@click.option(
    "--wait",
    "wait_s",
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="With --repair: how long to wait for an ingest writing to the same store.",
)
def check(repair, store, wait_s):
    """Verify the store against its own records: the format version, CURRENT, every table of
    the live generation and every Parquet part (present, size, sha256 as written).

    Prints what is damaged and exits 1 while anything is; with --repair, prints what it
    mended and exits 0 when the store is whole again.

    \b
    Example:
      workbench check
      workbench check --repair --store .workbench
    """
    from workbench import render

    s = _store(store)
    if repair:
        from ingest.pipeline import repair as run_repair

        report = run_repair(s, wait_s=wait_s)
    else:
        report = s.check()
    render.check_report(report)
    if not report.ok:
        sys.exit(1)


@main.command()
@_store_option
@click.option(
    "--wait",
    "wait_s",
    type=float,
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="How long to wait for an ingest writing to the same store.",
)
def compact(store, wait_s):
    """Merge every scalar part of the store, and the compacted files, into one file sorted by
    run, tag and step (rows of dropped chunks left out), so that a query for one run reads a
    few row groups. Ingest compacts by itself past a number of small parts; this also sheds
    the rows that re-ingests left behind in compacted files.

    \b
    Example:
      workbench compact --store .workbench
    """
    s = _store(store)
    merged = s.compact(wait_s=wait_s)
    err().print(f"compacted {merged} Parquet files into one", highlight=False)


@main.command()
@click.argument("query")
@_store_option
@_format_option
def sql(query, store, fmt):
    """Run a read-only SQL query (DuckDB dialect) over the store's views.

    \b
    Views: runs, files, scalars (current points, unique on run_id, tag, step, and
    on run_id, metric, step where sources agree), scalars_all (every stored
    point, with source, segment, superseded, superseded_by),
    events, histograms, problems, checkpoints, lineage, labels, alerts,
    file_tags.

    \b
    Example:
      workbench sql "SELECT tag, count(*) FROM scalars WHERE run_id = 'run_a' GROUP BY tag"
      workbench sql "SELECT * FROM scalars_all WHERE superseded" --format csv
    """
    from workbench.store.query import run_query

    _show_answer(run_query(_store(store), query, _answer(fmt)), fmt)


@main.command()
@_store_option
@_format_option
def runs(store, fmt):
    """List the runs in the store with their status, formats, steps and points.

    \b
    Example:
      workbench runs --format csv
    """
    from workbench.store import reads
    from workbench.store.query import run_query

    _show_answer(run_query(_store(store), reads.runs(reads.RUN_SUMMARY), _answer(fmt)), fmt)


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
    from workbench.store import reads
    from workbench.store.query import require_run, run_query

    s = _store(store)
    answer = run_query(s, reads.tags(run), _answer(fmt))
    empty = answer == "[]\n" if _answer(fmt) == "json" else answer.count("\n") <= 1
    if empty:  # no tag: is there such a run?
        require_run(s, run)  # one store read less for a run that is there
    _show_answer(answer, fmt)


@main.command()
@click.argument("run")
@click.option("--outcome", type=click.Choice(["failed", "healthy", "unknown"]), required=True)
@click.option(
    "--onset",
    type=click.IntRange(0, 2**63 - 1),
    default=None,
    help="Step where the failure starts (failed runs).",
)
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
    from workbench.store.query import onset_outside, require_run

    s = _store(store)
    require_run(s, run)
    if outcome == "failed" and onset is None:
        err().print("note: a failed run without --onset is counted, but gives no lead time", highlight=False)
    if onset is not None and (outside := onset_outside(s, run, onset)):
        err().print(f"[yellow]warning:[/] {escape(outside)}", highlight=False)
    s.label(run, outcome, onset, kind, note)
    err().print(
        f"labelled {escape(run)}: {outcome}" + (f" at step {onset}" if onset is not None else ""),
        highlight=False,
    )


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
    import polars as pl

    from detectors.replay import default_rules
    from detectors.rules import describe
    from workbench import render

    render.frame(pl.DataFrame(describe(_load_rules(rules_file) or default_rules())), fmt)


@main.command()
@_rules_option
@click.option(
    "--runs", "runs_glob", default=None, metavar="GLOB", help="Only runs whose id matches (e.g. 'sweep_*')."
)
@_store_option
@_executor_options
def replay(rules_file, runs_glob, store, executor_name, address):
    """Replay rules over stored runs as they would have fired live; store the alerts.

    Each rule runs at its own parameters ([rule.params]); `workbench backtest` also sweeps.
    The alerts land in the `alerts` view (run_id, rule, tag, step_start, step_fired, step_end,
    value, message, params, severity).

    \b
    Example:
      workbench replay --rules detectors/guides.toml --runs 'exp*'
      workbench sql "SELECT rule, run_id, step_fired, message FROM alerts ORDER BY step_fired"
    """
    from detectors.replay import replay as run_replay
    from workbench import render

    result = run_replay(_store(store), _load_rules(rules_file), runs_glob, _executor(executor_name, address))
    render.replay_summary(result.summary(), result, err())


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
    help="False alarms per 1k steps allowed when picking a sweep's best point (and with --tune).",
)
@click.option(
    "--bootstrap",
    default=1000,
    show_default=True,
    metavar="B",
    help="Bootstrap resamples over runs for the 95 % intervals (0: none).",
)
@click.option(
    "--summary",
    is_flag=True,
    help="Per rule: first trigger step (mean ± std) on failed runs, trigger rate failed vs healthy "
    "with 95 % intervals, recovery success, the failure kinds it catches; the rule x kind matrix, "
    "the any-of-the-rules ensemble, the plateau predictors and the evaluation schedules.",
)
@click.option(
    "--tune",
    is_flag=True,
    help="Pick each rule's parameters (its sweep; built-ins bring a grid) within --budget false "
    "alarms per 1k steps, and score that pick by cross-validation over runs next to its "
    "in-sample score (related runs, a run and its resume or restart, stay in one fold).",
)
@click.option(
    "--folds",
    default=None,
    type=click.IntRange(2),
    metavar="K",
    help="With --tune: K folds of runs instead of leaving one run (group) out at a time.",
)
@click.option(
    "--holdout",
    "holdout_glob",
    default=None,
    metavar="GLOB",
    help="With --tune: runs kept out of tuning, scored at the pick and at the shipped default.",
)
@click.option(
    "--family",
    "family_attrs",
    multiple=True,
    metavar="ATTR",
    help="Label attribute to hold families out by (repeatable; default: every attribute the "
    "labels carry, e.g. trainer, optimizer, size): each score's worst family is shown beside it.",
)
@click.option(
    "--scorecard",
    "with_scorecard",
    is_flag=True,
    help="Every rule at its own parameters per failure kind: precision, recall, FA/1k, median lead, "
    "first trigger mean ± std, in-sample and leave one family out (--format markdown for a README).",
)
@click.option(
    "--out",
    "out_dir",
    default=None,
    type=click.Path(path_type=Path),
    metavar="DIR",
    help="Also write backtest.json, rules.csv and rules.parquet, and the other tables as CSV there.",
)
@_store_option
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "csv", "json", "markdown"]),
    default="table",
    show_default=True,
    help="table for people; csv or json (every table) for programs; markdown (with --scorecard).",
)
@_executor_options
def backtest(
    rules_file,
    runs_glob,
    horizon,
    lead,
    warmup,
    budget,
    bootstrap,
    summary,
    tune,
    folds,
    holdout_glob,
    family_attrs,
    with_scorecard,
    out_dir,
    store,
    fmt,
    executor_name,
    address,
):
    """Score rules (and each point of their sweeps) and convergence predictors on labelled runs.

    Trigger rates on failed vs healthy runs, recall within [onset - lead, onset + horizon],
    precision, false alarms per 1k steps, lead time and first-trigger step (mean, std, never
    fired), 95 % bootstrap intervals over runs; per failure kind (the `kind` of each label), for
    the ensemble of the rules at their own parameters, and with --tune the cross-validated pick.
    Beside each score, its worst family's (leave one family out over the labels' attributes),
    and the labelled runs each rule could not evaluate, with why. Runs need labels: a
    labels.toml beside them, `workbench label`, or evidence (NaN loss, loss-scale floor, crash)
    for automatic ones. JSON holds every table.

    \b
    Example:
      workbench backtest --summary
      workbench backtest --runs 'tune/*' --tune --budget 0.5 --family optimizer
      workbench backtest --tune --holdout 'holdout/*' --format json > scores.json
      workbench backtest --scorecard --format markdown
    """
    from detectors.backtest import Settings, best_under_budget, frontier
    from detectors.backtest import backtest as run_backtest
    from workbench import render

    if (folds or holdout_glob) and not tune:
        raise click.UsageError("--folds and --holdout go with --tune")
    if fmt == "markdown" and not with_scorecard:
        raise click.UsageError("--format markdown goes with --scorecard")
    settings = Settings(
        horizon=horizon, lead=lead, warmup=warmup, bootstrap=bootstrap, families=list(family_attrs) or None
    )
    result = run_backtest(
        _store(store),
        _load_rules(rules_file),
        runs_glob,
        settings,
        tune=tune,
        budget=budget,
        folds=folds,
        holdout_glob=holdout_glob,
        executor=_executor(executor_name, address),
        scorecard=with_scorecard,
    )
    if out_dir:
        result.write(out_dir)
    if fmt == "json":
        sys.stdout.write(result.to_json() + "\n")
    elif fmt == "csv":
        rows = result.scorecard if with_scorecard else result.summary if summary else result.rules
        sys.stdout.write(render.csv_rows(rows))
    elif with_scorecard:
        render.scorecard(result, fmt)
    else:
        if summary:
            render.backtest_summary(result)
        else:
            render.backtest_report(result, budget, frontier, best_under_budget)
        if tune:
            render.tuning_report(result)


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
    from ingest import lineage as lineage_graph
    from workbench import render
    from workbench.store.query import require_run

    s = _store(store)
    require_run(s, run)
    if stitch_tag:
        series = lineage_graph.stitched(s.connect(), run, stitch_tag)
        if series.is_empty():
            raise NotFoundError(
                f"no {stitch_tag!r} points along the lineage of {run}; list tags with: workbench tags {run}"
            )
        render.frame(series, fmt)
    else:
        render.lineage_tree(lineage_graph.tree(s.connect(), run))


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path, exists=True))
@_rules_option
@_store_option
@click.option(
    "--interval",
    default=1.0,
    show_default=True,
    metavar="S",
    help="Longest wait between polls; file-system events wake it sooner (not on network file systems).",
)
@click.option(
    "--notify-cmd",
    default=None,
    metavar="CMD",
    help="Shell command run per alert: the alert as JSON on stdin and in $WORKBENCH_ALERT, "
    "fields in $WORKBENCH_ALERT_RULE, _RUN_ID, _STEP_FIRED, _SEVERITY, _MESSAGE, ...",
)
@click.option(
    "--notify-url",
    default=None,
    metavar="URL",
    help="Webhook: POST the alert as JSON (retried with backoff; never holds up the watch).",
)
@click.option("--until-finished", is_flag=True, help="Exit once every run has an end marker in its logs.")
@click.option(
    "--stale-after",
    default=600.0,
    show_default=True,
    metavar="S",
    help="Mark a run stale (and evaluate all its steps) when it has not grown for S seconds.",
)
@click.option(
    "--wait",
    "wait_s",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="When another watch follows the store: wait this long for it to end and take over "
    "(inf: a standby), instead of refusing at once.",
)
def watch(paths, rules_file, store, interval, notify_cmd, notify_url, until_finished, stale_after, wait_s):
    """Follow runs being written under PATHS and raise a rule file's alerts live.

    Each poll ingests only the new bytes of every log (TensorBoard, JSONL, console logs,
    DeepSpeed CSVs, trainer_state rewrites, ...) and evaluates the rules on the new steps, the
    same way `workbench replay` would over the finished logs: the live alerts (the `alerts`
    view, source 'live', with raised_at) equal a replay's, rule by rule and step by step.
    Each alert interval is one notification: a JSON line on stdout, and --notify-cmd /
    --notify-url, with an `alert_id` a receiver can drop duplicates by. A rule's `cooldown`
    merges a storm of firings into one interval. The table on stderr shows each run's last
    step, steps/s and open alerts. Ctrl-C stops it.

    One watch per store: a second refuses, naming the first (or waits, --wait). What was
    delivered is stored per alert (the `deliveries` view), so a watch restarted after a
    crash sends what was never delivered; alerts already in the logs before any watch
    followed their folder are stored, not sent. A failed poll (a full disk, a vanished
    file) is said on stderr and in `problems`, and the watch goes on.

    \b
    Example:
      workbench backtest --rules my_rules.toml
      workbench watch ./runs --rules my_rules.toml --notify-url http://127.0.0.1:9000/hook
      workbench sql "SELECT run_id, rule, step_fired, message FROM alerts WHERE source = 'live'"
    """
    try:
        from detectors.replay import default_rules
        from workbench.notify import notifiers
        from workbench.watch import Watch

        rules = _load_rules(rules_file) or default_rules()
        sinks = notifiers(
            notify_cmd, notify_url, lambda msg: err().print(f"[yellow]notify:[/] {escape(msg)}")
        )
        w = Watch(
            list(paths),
            _store(store),
            rules,
            sinks,
            stale_after=stale_after,
            console=err(),
            note_unevaluable=rules_file is not None,
        )
    except KeyboardInterrupt:  # Ctrl-C before the watch began: it stops as it would later
        return
    w.run(interval=interval, until_finished=until_finished, wait_s=wait_s)
