"""Where a live watch sends the alerts it raises: stdout, a command, a webhook.

Each alert is one JSON object (the `alerts` columns: run_id, rule, tag, step_start, step_fired,
step_end, value, message, params, severity, raised_at) plus `alert_id`, the same for every
delivery of one alert interval, so a receiver can drop a duplicate (a retry after a timeout
whose first try did arrive, or a restarted watch sending what it cannot know arrived). Notifiers
that leave the process run on their own thread: a slow or failing command or webhook never
holds up ingest or evaluation, and a failure is reported (on stderr) and never stops the watch.
`Dispatch` sends each alert to every notifier and makes its delivery record (the `deliveries`
table) once all of them are through with it: the watch stores it, so a restarted watch sends
what was never delivered.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import queue
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable

from workbench.errors import WorkbenchError

Alert = dict
Done = Callable[[str | None], None]  # called once per alert: None when delivered, else why not


def _ignore(why: str | None) -> None:
    pass


def alert_id(alert: Alert) -> str:
    """What identifies one alert interval: its run, rule and first step (an interval that grows
    keeps its id; a replay of the same logs finds the same ids)."""
    key = "\0".join(str(alert[k]) for k in ("run_id", "rule", "step_start"))
    return hashlib.sha256(key.encode()).hexdigest()[:20]


def alert_json(alert: Alert) -> str:
    """One line of JSON with its `alert_id`; NaN/Inf values as null (JSON has no NaN)."""
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in alert.items()}
    clean.setdefault("alert_id", alert_id(alert))
    return json.dumps(clean, sort_keys=True)


class Notifier:
    name = "notifier"

    def send(self, alert: Alert, done: Done = _ignore) -> None:
        """Deliver the alert (perhaps later, on a thread); then `done(None)`, or `done(why)`."""
        raise NotImplementedError

    def close(self, timeout: float = 10.0) -> None:
        """Deliver what is queued (up to `timeout` seconds)."""


class StdoutNotifier(Notifier):
    """One JSON line per alert on stdout (machine-readable; the terminal table goes to stderr)."""

    name = "stdout"

    def send(self, alert: Alert, done: Done = _ignore) -> None:
        try:
            sys.stdout.write(alert_json(alert) + "\n")
            sys.stdout.flush()
        except (OSError, ValueError) as e:  # a closed pipe, a full disk behind a redirect
            done(f"stdout: {e}")
            return
        done(None)


class _Background(Notifier):
    """Delivers alerts in order on a worker thread; `deliver` raises to say it failed."""

    def __init__(self, report: Callable[[str], None]):
        self._queue: queue.Queue = queue.Queue()
        self._report = report
        self._thread = threading.Thread(target=self._work, name=f"notify-{self.name}", daemon=True)
        self._thread.start()

    def send(self, alert: Alert, done: Done = _ignore) -> None:
        self._queue.put((alert, done))

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            alert, done = item
            try:
                self.deliver(alert)
            except Exception as e:  # noqa: BLE001 - any failure is reported, never raised into the watch
                why = f"{self.name} failed for {alert['rule']} on {alert['run_id']}: {e}"
                self._report(why)
                done(why)
            else:
                done(None)
            finally:
                self._queue.task_done()

    def deliver(self, alert: Alert) -> None:
        raise NotImplementedError

    def close(self, timeout: float = 10.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout)


class CommandNotifier(_Background):
    """Runs a shell command per alert: the alert as JSON on its stdin and in WORKBENCH_ALERT,
    its fields in WORKBENCH_ALERT_<FIELD> (RULE, RUN_ID, STEP_FIRED, SEVERITY, MESSAGE, ...).
    The alert never becomes part of the command text."""

    name = "command"

    def __init__(self, command: str, report: Callable[[str], None], timeout: float = 60.0):
        self.command, self.timeout = command, timeout
        super().__init__(report)

    def deliver(self, alert: Alert) -> None:
        body = alert_json(alert)
        env = {**os.environ, "WORKBENCH_ALERT": body}
        env.update({f"WORKBENCH_ALERT_{k.upper()}": "" if v is None else str(v) for k, v in alert.items()})
        done = subprocess.run(
            self.command,
            shell=True,
            input=body,
            text=True,
            env=env,
            capture_output=True,
            timeout=self.timeout,
        )
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
            raise RuntimeError(f"exit {done.returncode} {tail[0]}".strip())


class _KeepPost(urllib.request.HTTPRedirectHandler):
    """Follows only 307/308 (they keep the method and body) to another http(s) URL; urllib would
    turn a POST redirected by 301/302/303 into a GET without the alert and call it delivered."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if code not in (307, 308) or urllib.parse.urlsplit(newurl).scheme not in ("http", "https"):
            raise urllib.error.HTTPError(newurl, code, f"redirected to {newurl}", headers, fp)
        return urllib.request.Request(newurl, data=req.data, headers=dict(req.header_items()), method="POST")


def check_webhook_url(url: str) -> str:
    """An http(s) URL with a host, or a WorkbenchError saying why not (file:, data:, ftp: ...
    would take each alert nowhere and call it delivered)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WorkbenchError(
            f"--notify-url {url!r}: a webhook is an http:// or https:// URL with a host, "
            "e.g. http://127.0.0.1:9000/hook"
        )
    return url


class WebhookNotifier(_Background):
    """POSTs the alert as a JSON body with an `Idempotency-Key` header (the alert's id); retries
    with exponential backoff on connection errors, timeouts, 5xx and 429 answers (`retries` times,
    first wait `backoff` seconds, doubling). A redirect other than 307/308 is a failure."""

    name = "webhook"

    def __init__(
        self,
        url: str,
        report: Callable[[str], None],
        retries: int = 5,
        backoff: float = 0.5,
        timeout: float = 10.0,
    ):
        self.url, self.retries, self.backoff, self.timeout = check_webhook_url(url), retries, backoff, timeout
        self._opener = urllib.request.build_opener(_KeepPost)
        super().__init__(report)

    def deliver(self, alert: Alert) -> None:
        body = alert_json(alert).encode()
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "training-log-workbench",
            "Idempotency-Key": alert_id(alert),
        }
        wait = self.backoff
        for attempt in range(self.retries + 1):
            req = urllib.request.Request(self.url, data=body, method="POST", headers=headers)
            try:
                with self._opener.open(req, timeout=self.timeout) as resp:
                    resp.read()
                return
            except urllib.error.HTTPError as e:
                if 300 <= e.code < 400:
                    raise RuntimeError(f"HTTP {e.code} from {self.url}: {e.msg}; not followed") from None
                if e.code < 500 and e.code != 429:
                    raise RuntimeError(f"HTTP {e.code} from {self.url}") from None
                why = f"HTTP {e.code}"
            except (urllib.error.URLError, OSError) as e:
                why = str(getattr(e, "reason", e))
            if attempt == self.retries:
                raise RuntimeError(f"{why} from {self.url}, gave up after {self.retries + 1} tries")
            time.sleep(wait)
            wait *= 2


class Dispatch:
    """Sends each alert to every notifier (once while it is under way) and makes its delivery
    record (DELIVERIES columns) when all of them are through with it: `sent` when each delivered
    it, else `failed` with why. `records()` hands over the records made since it was last
    called; an alert still under way when the process ends has none (the next watch sends it)."""

    def __init__(self, notifiers: list[Notifier]):
        self.notifiers = list(notifiers)
        self._lock = threading.Lock()
        self._open: dict[str, tuple[Alert, list[int], list[str]]] = {}  # id -> alert, [left], failures
        self._records: list[dict] = []

    def send(self, alert: Alert) -> bool:
        """Hand the alert to every notifier; False when it is under way already."""
        key = alert_id(alert)
        with self._lock:
            if key in self._open:
                return False
            self._open[key] = (alert, [len(self.notifiers)], [])
        if not self.notifiers:
            self._finish(key)
        done: Done = functools.partial(self._done, key)
        for n in self.notifiers:
            try:
                n.send(alert, done)
            except Exception as e:  # noqa: BLE001 - a notifier that breaks fails this delivery only
                self._done(key, f"{n.name} failed: {e}")
        return True

    def _done(self, key: str, why: str | None) -> None:
        with self._lock:
            _, left, failures = self._open[key]
            left[0] -= 1
            if why:
                failures.append(why)
            last = left[0] <= 0
        if last:
            self._finish(key)

    def _finish(self, key: str) -> None:
        with self._lock:
            alert, _, failures = self._open.pop(key)
            self._records.append(
                {
                    "alert_id": key,
                    "run_id": alert["run_id"],
                    "rule": alert["rule"],
                    "step_start": alert["step_start"],
                    "outcome": "failed" if failures else "sent",
                    "notified_at": None if failures else time.time(),
                    "detail": "; ".join(failures) or None,
                }
            )

    def under_way(self, key: str) -> bool:
        """Whether the alert with this id is with the notifiers now."""
        with self._lock:
            return key in self._open

    def records(self) -> list[dict]:
        with self._lock:
            out, self._records = self._records, []
        return out

    def close(self, timeout: float = 10.0) -> None:
        """Deliver what is queued (up to `timeout` seconds per notifier)."""
        for n in self.notifiers:
            n.close(timeout)


def history_record(alert: Alert) -> dict:
    """The delivery record of an alert that was in the logs before any watch followed its run."""
    return {
        "alert_id": alert_id(alert),
        "run_id": alert["run_id"],
        "rule": alert["rule"],
        "step_start": alert["step_start"],
        "outcome": "history",
        "notified_at": None,
        "detail": None,
    }


def notifiers(
    notify_cmd: str | None, notify_url: str | None, report: Callable[[str], None]
) -> list[Notifier]:
    """stdout always; a command and a webhook when asked for."""
    out: list[Notifier] = [StdoutNotifier()]
    if notify_cmd:
        out.append(CommandNotifier(notify_cmd, report))
    if notify_url:
        out.append(WebhookNotifier(notify_url, report))
    return out
