"""`workbench watch`: follow runs that are being written and raise the alerts of a rule file
live, the same alerts a replay over the finished logs raises.

Each poll: `ingest` reads only the new bytes of every log under the paths (its manifest knows
the offsets; half-written records and lines wait for the next poll; a truncated or rotated log
is read again, with a problem row); the points of the chunks it just wrote go to the live
evaluator (`detectors.live`), which evaluates the new final steps; alerts it raises go to the
store (`alerts`, source 'live', with the time they were raised), the terminal and the
notifiers. A run whose earlier steps changed (a resumed writer, a rewritten file) is reloaded
from the store and evaluated again.

Polls start every `interval` seconds, and sooner (at most twice an interval) when the file
system says something under the paths changed (watchdog; on network file systems, where no
events come, the interval alone). A run with an end marker in its logs (evidence: completed, crashed, diverged) is
finished; one that has not grown for `stale_after` seconds is stale; both have every step
evaluated. With `until_finished`, the watch returns once every run it follows has finished.

One watch per store (`Store.watching`: a second one refuses, or waits with `wait_s`, naming the
first). The evaluator is fed every chunk under the paths that the store's live generation
holds and it has not had, whoever ingested it (this watch, a `workbench ingest` beside it, a
watch before it). What the watch did with each alert is stored by alert id (`deliveries`, see
`Ledger`): a restarted watch sends what no watch delivered, and alerts that were in the logs
before any watch followed their folder are stored, not sent. A poll that fails (a full disk, a
vanished file, a damaged part) is said on stderr and in `problems`, and the next poll goes on
from what the store holds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from detectors.live import LiveEvaluator, Update
from detectors.rules import Rule
from ingest.pipeline import ingest
from workbench.errors import WorkbenchError
from workbench.notify import Dispatch, Notifier, alert_id, history_record
from workbench.store import Store, aliases, coded, layout, leases, reads
from workbench.store.config import settings_folders

END_STATUSES = ("completed", "crashed", "diverged")
REFRESH_S = 60.0  # lineage and catalog.duckdb are brought up to date this often
FED = {"run_id": pl.String, "chunk_id": pl.Int64, "path": pl.String, "start_offset": pl.Int64}
FAILED_POLL = "watch_failed"  # the problems kind of a poll that failed
KEEP_FAILURES = 50  # problem rows of failed polls kept in the store


@dataclass
class RunView:
    """What the terminal shows of a run."""

    last_step: int | None = None
    steps_per_s: float | None = None
    last_growth: float = field(default_factory=time.time)
    status: str = "running"  # running | finished | stale
    alerts: int = 0
    last_alert: str = ""
    end_markers: int = 0


@dataclass
class PollResult:
    raised: list[dict]
    extended: list[dict]
    withdrawn: list[dict]
    seconds: float


class Ledger:
    """What the store says, and this watch has yet to store, of each alert's delivery.

    Stored by alert id (`deliveries`): `sent`, `failed` (sent again by the next watch) or
    `history`; and the folders a watch followed (`watched`). At a watch's first poll, an alert
    of a run under no folder a watch followed before is history (it was in the logs before any
    watch); once that poll is decided, the watch's own folders are recorded as followed (before
    anything of a later poll is sent, so no later alert can be taken for history)."""

    def __init__(self, roots: list[str], root: Path):
        self.roots, self.store_root = roots, str(root)
        self.since = time.time()
        self.outcomes: dict[str, str] | None = None  # alert id -> stored outcome; None: not read yet
        self.before: set[str] = set()  # runs under a folder some watch followed before this one
        self.roots_stored = False
        self.records: list[dict] = []  # delivery records not yet stored
        self.failures: list[dict] = []  # problem rows of failed polls not yet stored
        self._staged = (0, 0, False)

    def load(self, gen: Path | None) -> None:
        """The deliveries and followed folders the store holds (at the first poll that worked)."""
        stored = layout.read_meta("deliveries", gen)
        self.outcomes = dict(stored.select("alert_id", "outcome").iter_rows())
        followed = layout.read_meta("watched", gen)["root"].to_list()
        files = layout.read_meta("files", gen).select("run_id", "path")
        self.before = set(files.filter(under(followed))["run_id"].to_list()) if followed else set()
        self.roots_stored = all(under(followed, r) for r in self.roots)

    def decide(self, alert: dict, first_poll: bool) -> str:
        """skip (delivered or stored as history before), history, or send."""
        outcome = (self.outcomes or {}).get(alert_id(alert))
        if outcome in ("sent", "history"):
            return "skip"
        if first_poll and alert["run_id"] not in self.before and outcome is None:
            return "history"
        return "send"

    def add(self, records: list[dict]) -> None:
        self.records += records
        if self.outcomes is not None:
            self.outcomes.update((r["alert_id"], r["outcome"]) for r in records)

    def failed(self, message: str) -> None:
        when = time.strftime("%Y-%m-%d %H:%M:%S")
        self.failures.append(
            {
                "path": self.store_root,
                "run_id": None,
                "offset": None,
                "kind": FAILED_POLL,
                "message": f"{when}: {message}",
            }
        )

    def stage(self, w, decided: bool) -> bool:
        """Stage what is not stored yet; `decided`: the first poll's history is settled (the
        folders may be recorded). `stored()` once the commit is published."""
        roots = decided and not self.roots_stored
        w.set_deliveries(self.records)
        if roots:
            w.set_watched(self.roots, self.since)
        if self.failures:
            old = w.table("problems").filter(
                (pl.col("path") == self.store_root) & (pl.col("kind") == FAILED_POLL)
            )
            rows = (old.to_dicts() + self.failures)[-KEEP_FAILURES:]
            w.set_problems(self.store_root, rows, kind=FAILED_POLL)
        self._staged = (len(self.records), len(self.failures), roots)
        return bool(self.records or self.failures or roots)

    def stored(self) -> None:
        n_records, n_failures, roots = self._staged
        del self.records[:n_records]
        del self.failures[:n_failures]
        self.roots_stored |= roots
        self._staged = (0, 0, False)

    def pending(self, decided: bool) -> bool:
        return bool(self.records or self.failures or (decided and not self.roots_stored))


def under(roots: list[str], path: str | None = None):
    """Whether `path` lies under (or is) one of `roots`; without `path`, the same as a polars
    expression on the `path` column."""
    if path is not None:
        return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)
    expr = pl.lit(False)
    for r in roots:
        expr = expr | (pl.col("path") == r) | pl.col("path").str.starts_with(r.rstrip("/") + "/")
    return expr


class Watch:
    """The state of one `workbench watch`; `poll()` once, or `run()` until told to stop."""

    def __init__(
        self,
        paths: list[Path],
        store: Store,
        rules: list[Rule],
        notifiers: Sequence[Notifier] = (),
        stale_after: float = 600.0,
        console: Console | None = None,
        notify_history: bool = False,
        note_unevaluable: bool = False,
    ):
        self.paths, self.store, self.rules = paths, store, rules
        self.dispatch = Dispatch(list(notifiers))
        self.notifiers = self.dispatch.notifiers
        self.stale_after = stale_after
        self.console = console or Console(stderr=True)
        self.evaluator = LiveEvaluator(rules)
        self.runs: dict[str, RunView] = {}
        self.polls = 0
        self.notify_history = notify_history
        self.ledger = Ledger([str(Path(p).absolute()) for p in paths], store.root)
        self._refreshed = time.time()
        self._metric: dict[str, str | None] = {}
        self._unstored: set[tuple[str, str]] = set()  # (run, rule) whose alerts changed, not yet stored
        self._staged: set[tuple[str, str]] = set()  # of those, the ones in the commit under way
        self._said: set[str] = set()  # rules already reported as not evaluable
        self.note_unevaluable = note_unevaluable  # say which rules no run can evaluate (a rule file's)
        self._fed = pl.DataFrame(schema=FED)  # the chunks the evaluator has
        self._listing = pl.DataFrame(
            schema={**FED, "source": pl.String}
        )  # this poll's chunks under the paths
        self._gen: Path | None = None  # this poll's generation
        self._decided = False  # the first poll's history is settled: what comes later is sent
        self._in_doubt = False  # a poll failed while evaluating: evaluate every run next time
        self._reloading: set[str] = set()  # runs whose reload a failed poll cut short
        self._failing: str | None = None  # what the last failed poll said (None: it worked)

    # ---- one poll ---------------------------------------------------------------------------
    def poll(self, final: bool = False) -> PollResult:
        """Ingest what is new, evaluate the new final steps, store and send what changed.
        `final`: evaluate every pending step (the watch is ending). Lineage and catalog.duckdb
        are refreshed every `REFRESH_S` seconds and on the final poll, not on every poll."""
        t0 = time.perf_counter()
        now = time.time()
        full = final or now - self._refreshed >= REFRESH_S
        self._staged = set()
        report = ingest(
            self.paths,
            self.store,
            console=Console(stderr=True, quiet=True),
            light=not full,
            stage=self._stage,
        )
        self._stored()  # what _stage staged is published
        if full:
            self._refreshed = now
        for path, p in report.problems:  # this poll's: the files it read
            self.console.print(
                f"[yellow]problem[/] {escape(path)} @ {p.offset}: {escape(p.message)}", highlight=False
            )
        self._gen = gen = self.store.current_generation()
        if self.ledger.outcomes is None:
            self.ledger.load(gen)
        first = not self._decided
        update = Update()  # nothing stored yet: nothing to evaluate
        if gen is not None:
            with leases.holding(self.store.root, gen):  # its parts stay while they are read
                update = self._evaluate(gen, report, now, final)
        self._unstored |= update.changed
        self._announce(update, first)
        self._decided = True
        if (final and self._unstored) or ((final or first) and self.ledger.pending(True)):
            self._commit()  # the first poll's history and folders are stored before more is sent
        for rule_id, why in self.evaluator.not_evaluable.items() if self.note_unevaluable else ():
            if rule_id not in self._said:
                self._said.add(rule_id)
                self.console.print(
                    f"[yellow]note[/] {escape(why)} (it is evaluated once it is)", highlight=False
                )
        self.polls += 1
        if self._failing is not None:
            self.console.print("[green]the watch's polls work again[/]", highlight=False)
            self._failing = None
        return PollResult(update.raised, update.extended, update.withdrawn, time.perf_counter() - t0)

    def _evaluate(self, gen: Path, report, now: float, final: bool):
        """Feed the new chunks and evaluate the runs they changed (every run, after a poll that
        failed half way through)."""
        doubt, self._in_doubt = self._in_doubt, True  # until this evaluation is through
        changed = self._feed(gen)
        if doubt:
            changed |= set(self.evaluator.runs)
        changed |= self._update_status(gen, sorted(report.runs | changed), changed, now, final)
        update, again = self.evaluator.evaluate(sorted(changed), now)
        while again:  # inputs changed under a rule: evaluate those runs again from their start
            for run_id in sorted(again):
                self._reload(run_id)
            more, again = self.evaluator.evaluate(sorted(again), now)
            update.raised += more.raised
            update.extended += more.extended
            update.withdrawn += more.withdrawn
            update.changed |= more.changed
        if doubt:
            self._recover(update)
        self._in_doubt = False
        return update

    def _recover(self, update) -> None:
        """After a poll that failed half way through: the alerts the evaluator holds that were
        neither sent nor stored as history (raised by the failed poll, never announced) join
        this poll's, and every run's alerts are stored again."""
        self.ledger.add(self.dispatch.records())
        known = self.ledger.outcomes or {}
        raised = {alert_id(a) for a in update.raised}
        for a in self.evaluator.alerts(sorted(self.evaluator.runs)).iter_rows(named=True):
            key = alert_id(a)
            if key not in raised and known.get(key) is None and not self.dispatch.under_way(key):
                update.raised.append(a)
            update.changed.add((a["run_id"], a["rule"]))

    def _commit(self) -> None:
        """A commit of the watch's own: alerts, deliveries, folders, failures not yet stored."""
        with self.store.writer() as w:
            self._stage(w)
            w.commit(catalog=False)
        self._stored()

    def _stage(self, w) -> bool:
        """The live alerts of the runs whose alerts changed since the last commit (they ride
        along with the next poll's ingest commit: stored one poll after they were sent), and
        the delivery records and failures not stored yet."""
        self._staged = set(self._unstored)
        by_rule: dict[str, list[str]] = {}
        for run_id, rule_id in sorted(self._staged):
            by_rule.setdefault(rule_id, []).append(run_id)
        for rule_id, runs in by_rule.items():
            w.set_alerts([rule_id], runs, self.evaluator.alerts(runs, {rule_id}), source="live")
        self.ledger.add(self.dispatch.records())
        return self.ledger.stage(w, self._decided) or bool(self._staged)

    def _stored(self) -> None:
        self._unstored -= self._staged
        self._staged = set()
        self.ledger.stored()

    def _chunks(self, gen: Path) -> pl.DataFrame:
        """The chunks of the generation read from files under the watched paths."""
        return layout.read_meta("chunks", gen).filter(under(self.ledger.roots)).select(*FED, "source")

    def _feed(self, gen: Path) -> set[str]:
        """New points and events of the chunks under the paths that the evaluator has not had
        (this watch's ingest wrote them, or another process did), in the order they were
        written; runs not seen before, or that lost a chunk it had (a rewritten file), are
        reloaded whole from the store."""
        self._listing = listing = self._chunks(gen)
        key = list(FED)
        fresh = listing.join(self._fed, on=key, how="anti")
        lost = set(self._fed.join(listing, on=key, how="anti")["run_id"].to_list())
        known = set(self.evaluator.runs) - self._reloading
        whole = (set(fresh["run_id"].to_list()) - known) | (lost & known) | self._reloading
        for run_id in sorted(whole):
            self._reload(run_id)
        changed = set(whole)
        fresh = fresh.filter(~pl.col("run_id").is_in(sorted(whole)))
        if not fresh.height:
            return changed
        chunks, points, events = coded.chunk_rows(
            self.store.root, gen, fresh.select("run_id", "source", "chunk_id").rows()
        )
        points = points.with_columns(
            metric=pl.col("tag").replace_strict(
                self._metrics(points["tag"].unique().to_list()), return_dtype=pl.String
            )
        )
        # chunk ids rise in the order a run's files were read (a task numbers its run's chunks in
        # its own block of ids; a later ingest's blocks lie above), so within a run they are its order
        points = points.join(chunks, on="chunk_id").sort("chunk_id", maintain_order=True)
        events = events.join(chunks, on="chunk_id").sort("chunk_id", maintain_order=True)
        by_run_p = (
            {k[0]: v for k, v in points.partition_by("run_id", as_dict=True).items()} if points.height else {}
        )
        by_run_e = (
            {k[0]: v for k, v in events.partition_by("run_id", as_dict=True).items()} if events.height else {}
        )
        for run_id in sorted(set(fresh["run_id"].to_list())):
            if not self.evaluator.add(run_id, by_run_p.get(run_id, points.clear()), by_run_e.get(run_id)):
                self._reload(run_id)
            else:
                self._fed = pl.concat([self._fed, fresh.filter(pl.col("run_id") == run_id).select(key)])
            changed.add(run_id)
        if self._fed.n_chunks() > 64:
            self._fed = self._fed.rechunk()
        return changed

    def _metrics(self, tags: list[str]) -> dict[str, str | None]:
        """Canonical metric of each tag, as the store's views resolve it (cached per tag)."""
        new = [t for t in tags if t not in self._metric]
        if new:
            self._metric.update(
                aliases.metrics_of(new, aliases.load_user_aliases(*settings_folders(self.store.root)))
            )
        return {t: self._metric[t] for t in tags}

    def _reload(self, run_id: str) -> None:
        """Every current point and event of a run in this poll's generation, from the store,
        into a fresh evaluation; the evaluator then has every chunk of it under the paths."""
        self._reloading.add(run_id)
        self.evaluator.reset(run_id)
        self._fed = self._fed.filter(pl.col("run_id") != run_id)
        con = self.store.connect(generation=self._gen)
        try:
            points = reads.ranked_points(run_id).frame(con)
            events = reads.events_with_format(run_id).frame(con)
        finally:
            con.close()
        self._metric.update(points.select("tag", "metric").unique().iter_rows())
        if not self.evaluator.add(run_id, points, events):  # cannot be late after a reset
            raise AssertionError(f"reloading {run_id} was refused")
        mine = self._listing.filter(pl.col("run_id") == run_id).select(list(FED))
        self._fed = pl.concat([self._fed, mine])
        self._reloading.discard(run_id)

    def _update_status(
        self, gen: Path, run_ids: list[str], changed: set[str], now: float, final: bool
    ) -> set[str]:
        ends = dict(
            layout.read_meta("evidence", gen)
            .filter(pl.col("status").is_in(END_STATUSES))
            .group_by("run_id")
            .len()
            .iter_rows()
        )
        now_final = set()
        for run_id in run_ids:
            view = self.runs.setdefault(run_id, RunView())
            state = self.evaluator.runs.get(run_id)
            last = max(state.seen.values(), default=None) if state is not None else None
            if run_id in changed and last is not None and last != view.last_step:
                if view.last_step is not None and now > view.last_growth:
                    rate = (last - view.last_step) / (now - view.last_growth)
                    view.steps_per_s = (
                        rate if view.steps_per_s is None else 0.7 * view.steps_per_s + 0.3 * rate
                    )
                view.last_step, view.last_growth = last, now
                if view.status != "running":
                    view.status = "running"
            n_end = ends.get(run_id, 0)
            if n_end > view.end_markers or (self.polls == 0 and n_end):
                view.status = "finished"  # a new end marker (a resumed run can end again)
            view.end_markers = n_end
            if view.status == "running" and now - view.last_growth > self.stale_after:
                view.status = "stale"
                self.console.print(f"[dim]{escape(run_id)}: no new data for {self.stale_after:g}s (stale)[/]")
            is_final = final or view.status != "running"
            if self.evaluator.mark_final(run_id, is_final) and is_final:
                now_final.add(run_id)
        return now_final

    def _announce(self, update, first: bool) -> None:
        """Say and send the alerts raised; on the first poll, those of runs no watch followed
        before are history (stored, not sent), and those an earlier watch delivered are not
        sent again."""
        history, resent = 0, 0
        for a in update.raised:
            view = self.runs.setdefault(a["run_id"], RunView())
            view.alerts += 1
            view.last_alert = f"{a['rule']} @ {a['step_fired']}"
            what = self.ledger.decide(a, first and not self.notify_history)
            if what == "history":
                history += 1
                self.ledger.add([history_record(a)])
            if what != "send":
                continue
            resent += first
            self.console.print(
                f"[red]alert[/] {escape(a['run_id'])} [bold]{escape(a['rule'])}[/] ({a['severity']}) "
                f"step {a['step_start']}→{a['step_fired']}: {escape(a['message'])}",
                highlight=False,
            )
            self.dispatch.send(a)
        if history:
            self.console.print(
                f"{history} alerts in what was already logged (not sent); "
                "list them with: workbench sql \"SELECT * FROM alerts WHERE source = 'live'\"",
                highlight=False,
            )
        if resent and self.ledger.before and not self.notify_history:
            self.console.print(
                f"{resent} alerts no earlier watch of this store delivered: sent now", highlight=False
            )
        for a in update.withdrawn:
            view = self.runs.setdefault(a["run_id"], RunView())
            view.alerts = max(0, view.alerts - 1)
            self.console.print(
                f"[dim]withdrawn {escape(a['run_id'])} {escape(a['rule'])} @ {a['step_start']}: "
                "its steps were logged again (resumed or rewritten)[/]",
                highlight=False,
            )

    # ---- the loop ---------------------------------------------------------------------------
    def all_finished(self) -> bool:
        return bool(self.runs) and all(v.status == "finished" for v in self.runs.values())

    def table(self) -> Table:
        t = Table(
            title=f"workbench watch · {len(self.rules)} rules · poll {self.polls}", title_justify="left"
        )
        for col in ("run", "status", "last step", "steps/s", "open alerts", "alerts", "last alert"):
            t.add_column(
                col, justify="right" if col in ("last step", "steps/s", "open alerts", "alerts") else "left"
            )
        for run_id, v in sorted(self.runs.items()):
            colour = {"running": "green", "finished": "blue", "stale": "yellow"}[v.status]
            t.add_row(
                escape(run_id),
                f"[{colour}]{v.status}[/]",
                "-" if v.last_step is None else f"{v.last_step:,}",
                "-" if v.steps_per_s is None else f"{v.steps_per_s:,.1f}",
                str(self.evaluator.open_alerts(run_id)),
                str(v.alerts),
                escape(v.last_alert),
            )
        return t

    def run(
        self,
        interval: float = 1.0,
        until_finished: bool = False,
        stop: threading.Event | None = None,
        on_poll: Callable[[PollResult], None] | None = None,
        wait_s: float = 0.0,
    ) -> None:
        """Poll until `stop` is set (or Ctrl-C), or every run finished with `until_finished`;
        the last poll evaluates every pending step. Holds the store's watch lock throughout
        (another process's watch is waited for up to `wait_s` seconds, then StoreError)."""
        try:
            with self.store.watching(self.paths, wait_s):
                self._loop(interval, until_finished, stop or threading.Event(), on_poll)
        except KeyboardInterrupt:  # Ctrl-C while waiting for another watch to end
            pass

    def _loop(self, interval: float, until_finished: bool, stop: threading.Event, on_poll) -> None:
        changed = threading.Event()
        observer = _observe(self.paths, self.store.root, changed)
        live = (
            Live(self.table(), console=self.console, auto_refresh=False, transient=False)
            if self.console.is_terminal
            else None
        )
        try:
            if live is not None:
                live.start()
            while not stop.is_set():
                changed.clear()
                result = self.poll_safely()
                if result is None:  # said why; the next poll starts from what the store holds
                    stop.wait(interval)
                    continue
                if live is not None:
                    live.update(self.table(), refresh=True)
                if on_poll is not None:
                    on_poll(result)
                if until_finished and self.all_finished():
                    break
                # the next poll starts `interval` after this one, or as soon as a file-system
                # event says something was written, but no sooner than half an interval after
                # this one began (a job writing every step would otherwise keep a core busy)
                stop.wait(max(0.0, interval / 2 - result.seconds))
                changed.wait(max(0.0, interval - max(interval / 2, result.seconds)))
        except KeyboardInterrupt:
            pass
        finally:
            self.poll_safely(final=True)
            if live is not None:
                live.update(self.table(), refresh=True)
                live.stop()
            if observer is not None:
                observer.stop()
            self.dispatch.close()
            self._store_records()

    def poll_safely(self, final: bool = False) -> PollResult | None:
        """A poll, or None when it failed: any failure (a full disk, another writer holding the
        store too long, a vanished or damaged file) is said once on stderr and stored in
        `problems`, and the watch goes on."""
        try:
            return self.poll(final=final)
        except Exception as e:  # noqa: BLE001 - no failed poll ends the watch
            why = str(e) if isinstance(e, WorkbenchError) else f"{type(e).__name__}: {str(e).strip()}"
            why = why.splitlines()[0] if why else type(e).__name__
            if why != self._failing:  # a full disk fails every poll: said once, until one works
                self.console.print(f"[red]poll failed:[/] {escape(why)}; the watch goes on", highlight=False)
                self.ledger.failed(why)
            self._failing = why
            return None

    def _store_records(self) -> None:
        """The delivery records the notifiers made since the last poll (the watch is ending)."""
        self.ledger.add(self.dispatch.records())
        if not (self._unstored or self.ledger.pending(self._decided)):
            return
        try:
            self._commit()
        except Exception as e:  # noqa: BLE001 - at the end, say what is lost and how it comes back
            self.console.print(
                f"[red]error:[/] the last delivery records were not stored ({escape(str(e).strip())}); "
                "the next watch of this store sends those alerts again",
                highlight=False,
            )


def _observe(paths: list[Path], store_root: Path, changed: threading.Event):
    """A watchdog observer setting `changed` on any write under the paths (the store's own
    writes aside); None when the file system cannot deliver events (the watch then polls at
    its interval)."""
    try:
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer
    except ImportError:
        return None

    class Handler(FileSystemEventHandler):
        def on_any_event(self, event):
            if event.event_type in ("opened", "closed_no_write"):
                return
            if str(event.src_path).startswith(store):
                return
            changed.set()

    store = str(store_root) + "/"
    observer = Observer()
    try:
        for p in paths:
            p = Path(p)
            observer.schedule(Handler(), str(p if p.is_dir() else p.parent), recursive=True)
        observer.start()
    except OSError:
        return None
    return observer
