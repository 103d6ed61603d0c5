"""The main flow in a real browser: Playwright driving Debian's Chromium against `streamlit run`.

Open Curves, pick two runs and a tag, see the alert and event markers on the curves, open the
backtest page and run it. Screenshots go to test-artifacts/browser/. Skips only where
/usr/bin/chromium is missing (CI installs it: see .ci/run).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import ingest_paths

from workbench.store import Store

ROOT = Path(__file__).parent.parent
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "test-artifacts" / "browser"
pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM),
    reason="needs Debian's chromium at /usr/bin/chromium (apt-get install chromium)",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from detectors.replay import replay

    store = Store(tmp_path_factory.mktemp("browser") / "store")
    ingest_paths(store, ROOT / "sample_runs")
    replay(store, None, None)
    port = free_port()
    env = {**os.environ, "WORKBENCH_STORE": str(store.root)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            str(ROOT / "app.py"),
            "--server.headless",
            "true",
            "--server.address",
            "127.0.0.1",
            "--server.port",
            str(port),
            "--browser.gatherUsageStats",
            "false",
            "--server.fileWatcherType",
            "none",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            if urllib.request.urlopen(url + "/_stcore/health", timeout=2).read() == b"ok":
                break
        except OSError:
            time.sleep(0.5)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("streamlit did not come up within 60 s")
    yield url
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=20)


def plotly_trace_names(page) -> list[str]:
    return page.evaluate(
        "() => Array.from(document.querySelectorAll('.js-plotly-plot')).flatMap(p => (p.data || []).map(t => t.name || ''))"
    )


def test_main_flow_curves_alerts_then_backtest(server):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--no-first-run",
                "--disable-sync",
            ],
        )
        page = browser.new_page(viewport={"width": 1400, "height": 1300})
        page.goto(server + "/curves")
        page.get_by_text("Smoothing (TensorBoard EMA)").wait_for(timeout=60_000)
        runs = page.locator('[data-testid="stMultiSelect"]').nth(0)
        for name in (
            "attention_collapse_recovery",
            "deepspeed_default_log_level",
        ):  # keep attention_collapse, then add the fp16 run
            runs.get_by_role("button", name=f"Remove {name}").click()
            page.wait_for_timeout(800)
        runs.locator("input").fill("fp16_overflow_storm")
        runs.locator("input").press("Enter")
        tags = page.locator('[data-testid="stMultiSelect"]').nth(1)
        tags.locator("input").fill("attn_entropy")
        tags.locator("input").press("Enter")
        page.keyboard.press("Escape")
        page.wait_for_function(
            "() => Array.from(document.querySelectorAll('.js-plotly-plot')).some(p => (p.data || []).some(t => t.name === 'fp16_overflow_storm'))",
            timeout=60_000,
        )
        page.wait_for_function(  # the tag's own subplot is there too
            "() => Array.from(document.querySelectorAll('.js-plotly-plot .gtitle, .js-plotly-plot .annotation-text')).some(e => e.textContent === 'attn_entropy')",
            timeout=60_000,
        )
        names = plotly_trace_names(page)
        assert "attention_collapse" in names and "fp16_overflow_storm" in names and "diverge_nan" not in names
        assert any(n.startswith("alert P1_attention_collapse") for n in names)  # alert markers on the curves
        assert "overflow" in names  # DeepSpeed OVERFLOW events
        page.screenshot(path=str(ARTIFACTS / "curves.png"), full_page=True)

        page.get_by_role("link", name="Alerts & backtest").click()
        page.get_by_role("button", name="Run backtest").click()
        page.get_by_text("Threshold sweeps: recall vs false alarms").wait_for(timeout=120_000)
        assert page.get_by_text("Convergence predictors").is_visible()
        page.wait_for_timeout(3000)  # data grids paint a moment after they appear
        page.screenshot(path=str(ARTIFACTS / "backtest.png"), full_page=True)
        browser.close()
