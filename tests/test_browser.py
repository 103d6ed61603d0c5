"""The main flows in a real browser: Playwright driving Debian's Chromium against `streamlit run`.

Select runs on Runs and open them in Curves; box-zoom a chart and keep the zoom through a
smoothing change; switch the x axis to relative and wall time on a
run whose current points come from JSONL (no wall times of their own) and on a TensorBoard run;
reload the URL and get the same view; run the backtest and show the runs where a rule fired on
the curves; the lineage of a resumed run; live refresh during an ingest. A screenshot of each step goes to
test-artifacts/browser/. No request leaves the machine (favicon, fonts). Skips only where /usr/bin/chromium is missing (CI installs it).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import copy_store, ingest_paths

ROOT = Path(__file__).parent.parent
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "test-artifacts" / "browser"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM),
        reason="needs Debian's chromium at /usr/bin/chromium (apt-get install chromium)",
    ),
]
WAIT_MS = 180_000  # a busy 2-core CI machine: the first chart can take tens of seconds


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def store(replayed_sample_runs, tmp_path_factory):
    return copy_store(replayed_sample_runs, tmp_path_factory.mktemp("browser"))  # the test ingests into it


@pytest.fixture(scope="module")
def server(store):
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
        ],  # fmt: skip
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


def wait_for_chart(page, predicate: str) -> None:
    """Until Streamlit stopped running and some chart satisfies `predicate` (JS, over a plotly div)."""
    page.wait_for_function(
        f"""() => document.querySelector('[data-testid=stApp]')?.getAttribute('data-test-script-state') === 'notRunning'
                  && Array.from(document.querySelectorAll('.js-plotly-plot')).some(gd => {{
                       try {{ return !!gd.data && ({predicate})(gd); }} catch (e) {{ return false; }} }})""",
        timeout=WAIT_MS,
    )
    page.wait_for_timeout(500)  # let the last draw reach the screen


def lines_of(run: str) -> str:
    """A line of this run with points (plotly keeps the arrays it was sent, decoded or base64)."""
    return f"gd => gd.data.some(t => t.name === '{run}' && t.mode === 'lines' && (t.x.length > 0 || !!t.x.bdata))"


def shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def test_main_flows(server, store, tmp_path):
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
            ],
        )
        page = browser.new_page(viewport={"width": 1440, "height": 1400})
        elsewhere = []  # requests to any host but the app (the favicon, fonts): there must be none
        page.on(
            "request",
            lambda r: None if r.url.startswith((server, "data:", "blob:")) else elsewhere.append(r.url),
        )

        # Runs: filter, tick two rows in the grid, open them in Curves
        n = store.query("SELECT count(*) n FROM runs")["n"][0]
        page.goto(server + "/")
        page.get_by_label("Run name (regex)").fill("^(attention_collapse|healthy_seed1_wide)$")
        page.keyboard.press("Enter")
        page.get_by_text(f"2 of {n} runs").wait_for(timeout=WAIT_MS)
        grid = page.locator('[data-testid="stDataFrame"]').first.bounding_box()
        for row in (1, 2):  # the row markers: first column, below the header (35 px rows)
            page.mouse.click(grid["x"] + 18, grid["y"] + 35 * row + 17)
            page.wait_for_timeout(1500)
        open_button = page.get_by_role("button", name="Open 2 run(s) in Curves")
        open_button.wait_for(timeout=WAIT_MS)
        shot(page, "1_runs_selected")
        assert page.get_by_text("Deploy", exact=True).count() == 0  # a local tool: no deploy button
        open_button.click()
        wait_for_chart(page, lines_of("attention_collapse"))
        wait_for_chart(page, lines_of("healthy_seed1_wide"))
        assert "run=attention_collapse" in page.url and "run=healthy_seed1_wide" in page.url
        shot(page, "2_curves_from_runs")

        # a zoom survives a control change: drag across the first chart (its x range is kept), then smooth
        area = page.locator(".js-plotly-plot .nsewdrag").first.bounding_box()
        y = area["y"] + area["height"] / 2
        page.mouse.move(area["x"] + area["width"] * 0.3, y)
        page.mouse.down()
        page.mouse.move(area["x"] + area["width"] * 0.6, y, steps=8)
        page.mouse.up()
        x_range = "() => document.querySelector('.js-plotly-plot').layout.xaxis.range.map(Number)"
        wait_for_chart(page, "gd => gd.layout.xaxis.autorange === false")  # the server drew the range
        zoomed = page.evaluate(x_range)
        page.get_by_role("slider").first.focus()
        page.keyboard.press("ArrowRight")
        page.wait_for_function("() => location.search.includes('smooth=0.601')", timeout=WAIT_MS)
        wait_for_chart(page, lines_of("attention_collapse"))
        assert page.evaluate(x_range) == pytest.approx(zoomed)
        shot(page, "2b_zoom_kept_after_smoothing")

        # x axis: relative, then wall time; both runs drawn on both (JSONL run: times from TensorBoard)
        page.locator("label").filter(has_text=re.compile("^relative time$")).click()
        both = f"gd => ({lines_of('attention_collapse')})(gd) && ({lines_of('healthy_seed1_wide')})(gd)"
        wait_for_chart(page, f"gd => gd.layout.xaxis.title.text.startsWith('relative time') && ({both})(gd)")
        shot(page, "3_relative_time")
        page.locator("label").filter(has_text=re.compile("^wall time$")).click()
        wait_for_chart(page, f"gd => gd.layout.xaxis.type === 'date' && ({both})(gd)")
        page.locator("label").filter(has_text=re.compile("^log y$")).click()
        wait_for_chart(page, "gd => gd.layout.yaxis.type === 'log' && gd.layout.xaxis.type === 'date'")
        assert "x=wall+time" in page.url and "logy=1" in page.url
        shot(page, "4_wall_time_log_y")

        # the URL is the view: reload it
        page.reload()
        wait_for_chart(
            page, f"gd => gd.layout.yaxis.type === 'log' && gd.layout.xaxis.type === 'date' && ({both})(gd)"
        )
        assert page.get_by_role("radio", name="wall time").is_checked()
        shot(page, "5_reloaded")

        # backtest (scored on arrival) -> the runs where P1 fired, on the curves with its alarms
        page.goto(server + "/backtest?rule=P1_attention_collapse")
        page.get_by_text("Where a rule fired or missed").wait_for(timeout=WAIT_MS)
        show = page.get_by_role(
            "button", name=re.compile(r"^Show the \d+ run\(s\) where it fired on the curves$")
        )
        show.wait_for(timeout=WAIT_MS)
        page.wait_for_timeout(2000)  # data grids paint a moment after they appear
        shot(page, "6_backtest")
        show.click()
        wait_for_chart(
            page,
            "gd => gd.data.some(t => (t.name || '').endsWith('(backtest)'))",
        )
        assert "run=attention_collapse" in page.url
        shot(page, "7_fired_runs_on_curves")

        # lineage of a run that resumed itself: a chain of segments, the resume marked on its curve
        page.goto(server + "/lineage?run=resumed_after_kill")
        wait_for_chart(
            page,
            "gd => (gd.layout.annotations || []).some(a => a.text === 'resumed_after_kill resumed @ 200')",
        )
        wait_for_chart(
            page, "gd => gd.data.some(t => (t.text || []).includes('resumed_after_kill · segment 0'))"
        )
        shot(page, "8_lineage_resumed_run")

        # live refresh: an ingest while the Runs page watches the store shows up on its own
        from writers import tbx_scalars

        page.goto(server + "/?live=1")
        page.get_by_text(f"{n} of {n} runs").wait_for(timeout=WAIT_MS)
        tbx_scalars(tmp_path / "new/late_run", {"loss": [(s, 1.0 / (s + 1)) for s in range(20)]})
        ingest_paths(store, tmp_path / "new")
        page.get_by_text(f"{n + 1} of {n + 1} runs").wait_for(timeout=WAIT_MS)
        shot(page, "9_live_refresh")
        browser.close()
    assert elsewhere == []
