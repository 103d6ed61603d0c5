"""Webhook deliveries against a real HTTP server on 127.0.0.1: only http(s) URLs are accepted, a
POST is never turned into a body-less GET by a redirect, and every delivery of one alert carries
the same id, so a receiver can drop the duplicate a retry after a timeout makes."""

from __future__ import annotations

import http.server
import json
import threading
import time

import pytest

from workbench.errors import WorkbenchError
from workbench.notify import WebhookNotifier, alert_id, notifiers

ALERT = {
    "run_id": "sweep/a",
    "rule": "loss_spike",
    "tag": "loss",
    "step_start": 120,
    "step_fired": 124,
    "step_end": 124,
    "value": float("nan"),
    "message": "loss spike",
    "severity": "warning",
}


class Receiver(http.server.BaseHTTPRequestHandler):
    """/slow answers after `delay` s (the sender times out first), /moved/<code> redirects to /in."""

    got: list = []
    delay = 0.0

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"] or 0))
        if self.path.startswith("/moved/"):
            self.send_response(int(self.path.rsplit("/", 1)[1]))
            self.send_header("Location", "/in")
            self.end_headers()
            return
        type(self).got.append((self.command, self.path, self.headers["Idempotency-Key"], json.loads(body)))
        if self.path == "/slow" and len(type(self).got) == 1:
            time.sleep(type(self).delay)
        self.send_response(204)
        self.end_headers()

    def do_GET(self):  # noqa: N802  (what urllib makes of a POST after a 302)
        type(self).got.append((self.command, self.path, None, None))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    Receiver.got, Receiver.delay = [], 0.0
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def deliver(url: str, **kw) -> list[str]:
    errors: list[str] = []
    hook = WebhookNotifier(url, errors.append, **kw)
    hook.send(ALERT)
    hook.close()
    return errors


@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "data:,x", "ftp://host/x", "http://", "127.0.0.1:9000/hook"]
)
def test_only_http_urls_are_webhooks(url):
    with pytest.raises(WorkbenchError, match="http:// or https://"):
        notifiers(None, url, print)


@pytest.mark.parametrize("code", [301, 302, 303])
def test_a_redirect_that_would_drop_the_body_is_a_failure(server, code):
    errors = deliver(f"{server}/moved/{code}", retries=0)
    assert Receiver.got == []  # no GET without the alert at the new place
    assert len(errors) == 1 and f"HTTP {code}" in errors[0] and "not followed" in errors[0]


@pytest.mark.parametrize("code", [307, 308])
def test_307_and_308_keep_the_post_and_its_body(server, code):
    assert deliver(f"{server}/moved/{code}", retries=0) == []
    [(method, path, key, body)] = Receiver.got
    assert (method, path, body["rule"], body["value"]) == ("POST", "/in", "loss_spike", None)
    assert key == body["alert_id"] == alert_id(ALERT)


def test_a_retry_after_a_timeout_carries_the_same_id(server):
    Receiver.delay = 1.0
    errors = deliver(f"{server}/slow", timeout=0.3, backoff=0.01, retries=2)
    assert errors == []
    assert len(Receiver.got) == 2  # the first try arrived, its answer came too late: sent again
    assert {key for _, _, key, _ in Receiver.got} == {alert_id(ALERT)}  # one id: the receiver dedupes


def test_the_id_names_the_interval_not_its_growth():
    grown = {**ALERT, "step_end": 180, "step_fired": 130}
    assert alert_id(grown) == alert_id(ALERT)
    assert alert_id({**ALERT, "step_start": 121}) != alert_id(ALERT)
