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
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from detectors.live import LiveEvaluator
from detectors.rules import Rule
from ingest.pipeline import ingest
from workbench.errors import WorkbenchError
from workbench.notify import Notifier
from workbench.store import Store, aliases, coded, layout, reads

END_STATUSES = ("completed", "crashed", "diverged")
REFRESH_S = 60.0  # lineage and catalog.duckdb are brought up to date this often


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


class Watch:
    """The state of one `workbench watch`; `poll()` once, or `run()` until told to stop."""

    def __init__(
        self,
        paths: list[Path],
        store: Store,
        rules: list[Rule],
        notifiers: list[Notifier] = (),
        stale_after: float = 600.0,
        console: Console | None = None,
        notify_history: bool = False,
        note_unevaluable: bool = False,
    ):
        self.paths, self.store, self.rules = paths, store, rules
        self.notifiers = list(notifiers)
        self.stale_after = stale_after
        self.console = console or Console(stderr=True)
        self.evaluator = LiveEvaluator(rules)
        self.runs: dict[str, RunView] = {}
        self.polls = 0
        self.notify_history = notify_history
        self._refreshed = time.time()
        self._metric: dict[str, str | None] = {}
        self._unstored: set[tuple[str, str]] = set()  # (run, rule) whose alerts changed, not yet stored
        self._staged: set[tuple[str, str]] = set()  # of those, the ones in the commit under way
        self._said: set[str] = set()  # rules already reported as not evaluable
        self.note_unevaluable = note_unevaluable  # say which rules no run can evaluate (a rule file's)

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
        self._unstored -= self._staged  # committed with this ingest
        if full:
            self._refreshed = now
        for path, p in report.problems:  # this poll's: the files it read
            self.console.print(
                f"[yellow]problem[/] {escape(path)} @ {p.offset}: {escape(p.message)}", highlight=False
            )
        gen = self.store.current_generation()
        changed = self._feed(gen, report)
        changed |= self._update_status(gen, sorted(report.runs), changed, now, final)
        update, again = self.evaluator.evaluate(sorted(changed), now)
        while again:  # inputs changed under a rule: evaluate those runs again from their start
            for run_id in sorted(again):
                self._reload(run_id)
            more, again = self.evaluator.evaluate(sorted(again), now)
            update.raised += more.raised
            update.extended += more.extended
            update.withdrawn += more.withdrawn
            update.changed |= more.changed
        self._unstored |= update.changed
        if final and self._unstored:
            with self.store.writer() as w:
                self._stage(w)
                w.commit()
            self._unstored -= self._staged
        self._announce(update)
        for rule_id, why in self.evaluator.not_evaluable.items() if self.note_unevaluable else ():
            if rule_id not in self._said:
                self._said.add(rule_id)
                self.console.print(
                    f"[yellow]note[/] {escape(why)} (it is evaluated once it is)", highlight=False
                )
        self.polls += 1
        return PollResult(update.raised, update.extended, update.withdrawn, time.perf_counter() - t0)

    def _stage(self, w) -> bool:
        """The live alerts of the runs whose alerts changed since the last commit (they ride
        along with the next poll's ingest commit: stored one poll after they were sent)."""
        self._staged = set(self._unstored)
        by_rule: dict[str, list[str]] = {}
        for run_id, rule_id in sorted(self._staged):
            by_rule.setdefault(rule_id, []).append(run_id)
        for rule_id, runs in by_rule.items():
            w.set_alerts([rule_id], runs, self.evaluator.alerts(runs, {rule_id}), source="live")
        return bool(self._staged)

    def _feed(self, gen: Path, report) -> set[str]:
        """New points and events of the chunks this ingest wrote, to the evaluator; runs not
        seen before, or whose earlier points changed, are reloaded whole from the store."""
        changed = set()
        known = set(self.evaluator.runs)
        for run_id in sorted(report.runs - known) + sorted(report.reread & known):
            self._reload(run_id)
            changed.add(run_id)
        fresh = [c for c in report.chunks if c[0] not in changed]
        if not fresh:
            return changed
        chunks, points, events = coded.chunk_rows(
            self.store.root, gen, [(r, src, c) for r, _, src, c in fresh]
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
        for run_id in sorted(set(by_run_p) | set(by_run_e)):
            if not self.evaluator.add(run_id, by_run_p.get(run_id, points.clear()), by_run_e.get(run_id)):
                self._reload(run_id)
            changed.add(run_id)
        return changed

    def _metrics(self, tags: list[str]) -> dict[str, str | None]:
        """Canonical metric of each tag, as the store's views resolve it (cached per tag)."""
        new = [t for t in tags if t not in self._metric]
        if new:
            self._metric.update(
                aliases.metrics_of(new, aliases.load_user_aliases(self.store.root, Path.cwd()))
            )
        return {t: self._metric[t] for t in tags}

    def _reload(self, run_id: str) -> None:
        """Every current point and event of a run, from the store, into a fresh evaluation."""
        self.evaluator.reset(run_id)
        con = self.store.connect()
        try:
            points = reads.ranked_points(run_id).frame(con)
            events = reads.events_with_format(run_id).frame(con)
        finally:
            con.close()
        self._metric.update(points.select("tag", "metric").unique().iter_rows())
        if not self.evaluator.add(run_id, points, events):  # cannot be late after a reset
            raise AssertionError(f"reloading {run_id} was refused")

    def _update_status(
        self, gen: Path, run_ids: list[str], changed: set[str], now: float, final: bool
    ) -> None:
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

    def _announce(self, update) -> None:
        history = self.polls == 0 and not self.notify_history
        for a in update.raised:
            view = self.runs.setdefault(a["run_id"], RunView())
            view.alerts += 1
            view.last_alert = f"{a['rule']} @ {a['step_fired']}"
            if history:
                continue
            self.console.print(
                f"[red]alert[/] {escape(a['run_id'])} [bold]{escape(a['rule'])}[/] ({a['severity']}) "
                f"step {a['step_start']}→{a['step_fired']}: {escape(a['message'])}",
                highlight=False,
            )
            for n in self.notifiers:
                n.send(a)
        if history and update.raised:
            self.console.print(
                f"{len(update.raised)} alerts in what was already logged (not sent); "
                "list them with: workbench sql \"SELECT * FROM alerts WHERE source = 'live'\"",
                highlight=False,
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
    ) -> None:
        """Poll until `stop` is set (or Ctrl-C), or every run finished with `until_finished`;
        the last poll evaluates every pending step."""
        stop = stop or threading.Event()
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
                try:
                    result = self.poll()
                except WorkbenchError as e:  # e.g. another ingest held the store: try again
                    self.console.print(f"[red]error:[/] {escape(str(e))}; the watch goes on", highlight=False)
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
            self.poll(final=True)
            if live is not None:
                live.update(self.table(), refresh=True)
                live.stop()
            if observer is not None:
                observer.stop()
            for n in self.notifiers:
                n.close()


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
