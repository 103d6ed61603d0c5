"""The Curves page at 10 runs x 1M points: time per control change in a real browser, next to
the server-side time of the same change.

The store is written directly (10 runs x N steps of a noisy decaying loss with a few spikes).
Server side: the page under Streamlit's AppTest (the script, the cached reads, smoothing over
every point, downsampling, the figures and their messages). Browser side: `streamlit run` and
Playwright driving Debian's Chromium at 1440 x 900, from the action until Streamlit has stopped
running and every chart has drawn (plotly's `afterplot`), with a check that the change shows.
Peer, in the same browser and run: bare plotly.js drawing the same figures (`Plotly.react` in
an empty page), the floor for any page that draws them.

    python benchmarks/curves_page.py [--runs 10] [--points 1000000] [--store DIR]
    python benchmarks/curves_page.py --runs 500 --points 2000     # a sweep
    python benchmarks/curves_page.py --runs 500 --points 2000 --group 'run_(\\d)'  # in 10 groups

The last line: `curves_page: runs=N first_view=X.XXs worst_change=Y.YYs bare_plotly=Z.ZZs`
(browser seconds; first view with cold server caches). Requests the page makes to any host but
the app's own are counted (the app must make none).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from synthetic import write_run  # noqa: E402

from workbench.store import Store  # noqa: E402
from workbench.store.points import Points  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
TAG = "train/loss"


def build(root: Path, runs: int, steps: int) -> Store:
    store = Store(root)
    rng = np.random.default_rng(0)
    with store.writer() as w:
        for i in range(runs):
            t = np.arange(steps)
            y = 1 + 3 * np.exp(-t / (steps / 5)) + rng.normal(0, 0.05, steps)
            y[rng.choice(steps, 5, replace=False)] += 5
            run = run_id(i)
            write_run(w, run, Points([TAG], np.zeros(steps, np.int32), t, 1.7e9 + t * 0.5, y))
        w.commit()
    return store


def run_id(i: int) -> str:
    return f"run_{i:02d}"


# (name, how a user does it, what the page shows afterwards: a JS predicate over the first chart)
ACTIONS = [
    ("smoothing 0.600 -> 0.601", "slider:ArrowRight", "gd => gd.data.length > 0"),
    ("log y on", "click:log y", "gd => gd.layout.yaxis.type === 'log'"),
    (
        "x = relative time",
        "click:relative time",
        "gd => gd.layout.xaxis.title.text.startsWith('relative time')",
    ),
    ("x = wall time", "click:wall time", "gd => gd.layout.xaxis.type === 'date'"),
    ("x = step (seen before)", "click:step", "gd => gd.layout.xaxis.title.text === 'step'"),
    ("raw line off", "click:raw line", "gd => gd.data.every(t => t.opacity !== 0.25)"),
    ("smoothing back to 0.600", "slider:ArrowLeft", "gd => gd.data.length > 0"),
]


def actions(runs: int) -> list[tuple[str, str, str]]:
    """The actions that change what a chart of this many runs shows (a sweep has no raw lines)."""
    from workbench.app.charts import LEGEND_MAX

    return [a for a in ACTIONS if runs <= LEGEND_MAX or a[0] != "raw line off"]


def page_params(run_ids: list[str], group: str | None) -> list[tuple[str, str]]:
    """The Curves page's URL for these runs (grouped by name with the regex `group`)."""
    params = [("run", r) for r in run_ids] + [("tags", f"^{TAG}$")]
    return params + ([("group", "name"), ("by", group)] if group else [])


def server_side(run_ids: list[str], group: str | None) -> tuple[float, list[tuple[str, float]]]:
    """First view and each action under AppTest (the same Python the server runs)."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=900)
    for k, v in page_params(run_ids, group):
        at.query_params[k] = [*at.query_params.get(k, []), v] if k == "run" else v
    t0 = time.perf_counter()
    at.run()
    at.switch_page("workbench/app/pages/curves.py").run()
    first = time.perf_counter() - t0
    assert not at.exception, [e.message for e in at.exception]
    steps = {
        "smoothing 0.600 -> 0.601": lambda: at.slider(key="curves_smoothing").set_value(0.601),
        "log y on": lambda: at.checkbox(key="curves_log").check(),
        "x = relative time": lambda: at.radio(key="curves_x").set_value("relative time"),
        "x = wall time": lambda: at.radio(key="curves_x").set_value("wall time"),
        "x = step (seen before)": lambda: at.radio(key="curves_x").set_value("step"),
        "raw line off": lambda: at.checkbox(key="curves_raw").uncheck(),
        "smoothing back to 0.600": lambda: at.slider(key="curves_smoothing").set_value(0.6),
    }
    out = []
    for name, _, _ in actions(len(run_ids)):
        t0 = time.perf_counter()
        steps[name]().run()
        out.append((name, time.perf_counter() - t0))
        assert not at.exception, [e.message for e in at.exception]
    return first, out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


HOOK = """() => {
  const hook = gd => { if (gd.__timed || !gd.on) return; gd.__timed = true;
    gd.on('plotly_afterplot', () => { window.__lastPlot = performance.now(); }); };
  document.querySelectorAll('.js-plotly-plot').forEach(hook);
  if (!window.__observer) {
    window.__observer = new MutationObserver(() => document.querySelectorAll('.js-plotly-plot').forEach(hook));
    window.__observer.observe(document.body, {childList: true, subtree: true});
  }
}"""
# the benchmark's own predicate (a JS arrow function) is written into the page function
STATE = """() => {
  const gd = document.querySelector('.js-plotly-plot');
  const check = __CHECK__;
  let ok = false;
  try { ok = !!gd && !!gd.layout && check(gd); } catch (e) {}
  return [document.querySelector('[data-testid=stApp]')?.getAttribute('data-test-script-state'),
          window.__lastPlot || 0, performance.now(), ok];
}"""


def settle(page, t0: float, check: str, quiet_ms: float = 1200, timeout_s: float = 300) -> float:
    """Seconds from t0 until the script stopped, the change shows and the last draw after t0
    has had `quiet_ms` without another."""
    page.evaluate(HOOK)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        state, last, now, ok = page.evaluate(STATE.replace("__CHECK__", check))
        if state == "notRunning" and ok and last > t0 and now - last > quiet_ms:
            return (last - t0) / 1000
        time.sleep(0.05)
    raise TimeoutError(f"the page did not settle within {timeout_s} s")


def browser_side(store: Store, run_ids: list[str], group: str | None) -> dict:
    from playwright.sync_api import sync_playwright

    port = free_port()
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
        env={**os.environ, "WORKBENCH_STORE": str(store.root)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    url = f"{base}/curves?" + urllib.parse.urlencode(page_params(run_ids, group))
    out: dict = {"actions": []}
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if urllib.request.urlopen(base + "/_stcore/health", timeout=2).read() == b"ok":
                    break
            except OSError:
                time.sleep(0.5)
        # every run drawn: a trace named after it, or (a sweep, one trace per colour) named in its
        # hover; grouped, every group's mean line ("<group> (N runs)")
        all_lines = (
            "gd => new Set(gd.data.flatMap(t => (t.name || '').startsWith('run_') ? [t.name] : "
            f"(Array.isArray(t.text) ? t.text : []))).size === {len(run_ids)}"
        )
        if group:
            groups = len({m.group(1) if (m := re.search(group, r)) else r for r in run_ids})
            all_lines = (
                "gd => gd.data.filter(t => t.mode === 'lines' && / runs?\\)$/.test(t.name || '')).length "
                f"=== {groups}"
            )
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM)
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            out["off_machine"] = []
            page.on(
                "request",
                lambda r: (
                    None if r.url.startswith((base, "data:", "blob:")) else out["off_machine"].append(r.url)
                ),
            )
            page.goto(base + "/")  # load Streamlit and plotly's bundle once, as a user already in the app
            page.wait_for_selector(
                '[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=120_000
            )
            page.goto(url)
            page.evaluate("() => { window.__lastPlot = 0; }")
            out["first_view_cold"] = settle(page, 0.0, all_lines)  # the server reads every point here
            print(f"  browser: first view {out['first_view_cold']:.2f}s", file=sys.stderr, flush=True)
            page.reload()
            out["first_view_warm"] = settle(page, 0.0, all_lines)
            for name, how, check in actions(len(run_ids)):
                kind, arg = how.split(":")
                t0 = page.evaluate("performance.now()")
                if kind == "slider":
                    page.get_by_role("slider").first.focus()
                    page.keyboard.press(arg)
                else:  # a radio option or a checkbox, by its label
                    page.locator("label").filter(has_text=re.compile(f"^{arg}$")).first.click()
                try:
                    out["actions"].append((name, settle(page, t0, check)))
                except TimeoutError:
                    page.screenshot(path=str(ROOT / "test-artifacts" / "curves_page_timeout.png"))
                    raise
                print(f"  browser: {name}: {out['actions'][-1][1]:.2f}s", file=sys.stderr, flush=True)
            page.screenshot(path=str(ROOT / "test-artifacts" / f"curves_page_{len(run_ids)}runs.png"))
            figures = page.evaluate(
                "() => Array.from(document.querySelectorAll('.js-plotly-plot')).map("
                "gd => JSON.stringify({data: gd.data, layout: gd.layout}))"
            )
            out["bare_plotly"] = bare_plotly(browser, figures)
            out["message_bytes"] = sum(len(f) for f in figures)
            browser.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    return out


def bare_plotly(browser, figures: list[str]) -> float:
    """The peer: the same figures drawn by plotly.js in an empty page (react after a first plot,
    as on a control change), best of 3."""
    import plotly

    page = browser.new_page(viewport={"width": 1440, "height": 900})
    page.set_content("<div id=g></div>")
    page.add_script_tag(path=str(Path(plotly.__file__).parent / "package_data" / "plotly.min.js"))
    times = page.evaluate(
        """async figs => { const out = [];
          for (let i = 0; i < 4; i++) { const t0 = performance.now();
            for (const [j, f] of figs.entries()) { let g = document.getElementById('g' + j);
              if (!g) { g = document.createElement('div'); g.id = 'g' + j; document.body.appendChild(g); }
              const F = JSON.parse(f); await Plotly.react(g, F.data, F.layout); }
            out.push(performance.now() - t0); }
          return out; }""",
        figures,
    )
    page.close()
    return min(times[1:]) / 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--points", "--steps", dest="steps", type=int, default=1_000_000, help="points per run")
    ap.add_argument("--store", type=Path, help="reuse (or create) the synthetic store here")
    ap.add_argument("--group", metavar="REGEX", help="group the runs by name (e.g. 'run_(\\d)': 10 groups)")
    args = ap.parse_args()
    tmp = None
    if args.store and (args.store / "CURRENT").exists():
        store = Store(args.store)
    else:
        tmp = None if args.store else Path(tempfile.mkdtemp())
        store = build(args.store or tmp / "store", args.runs, args.steps)
    os.environ["WORKBENCH_STORE"] = str(store.root)
    run_ids = [run_id(i) for i in range(args.runs)]
    (ROOT / "test-artifacts").mkdir(exist_ok=True)
    first, server = server_side(run_ids, args.group)
    browser = browser_side(store, run_ids, args.group) if os.path.exists(CHROMIUM) else None
    if tmp:
        shutil.rmtree(tmp)

    total = args.runs * args.steps
    grouped = f", grouped by {args.group}" if args.group else ""
    print(
        f"Curves page, {args.runs} runs x {args.steps:,} points = {total:,} points, one chart per tag{grouped}"
    )
    print(f"{'':28} {'server':>8} {'browser':>8}")
    b = dict(browser["actions"]) if browser else {}
    print(
        f"{'first view (cold caches)':28} {first:7.2f}s {browser['first_view_cold'] if browser else float('nan'):7.2f}s"
    )
    if browser:
        print(f"{'reload (warm server)':28} {'':8} {browser['first_view_warm']:7.2f}s")
    for name, secs in server:
        print(f"{name:28} {secs:7.2f}s {b.get(name, float('nan')):7.2f}s")
    if browser:
        worst = max(b.values())
        peer = browser["bare_plotly"]
        print(
            f"bare plotly.js drawing the same figures (peer): {peer:.2f}s; "
            f"slowest control change / peer = {worst / peer:.1f}x; "
            f"figure JSON on the page {browser['message_bytes'] / 1e6:.2f} MB"
        )
        goal = 5 if args.runs > 20 else 3  # a sweep's first view reads every run
        print(f"targets: every control change < 1.5 s (slowest {worst:.2f}s), first view < {goal} s")
        print(f"requests to other hosts: {len(browser['off_machine'])} {browser['off_machine'][:5]}")
        print(json.dumps({"server": dict(server), **browser}, default=float))
        print(
            f"curves_page: runs={args.runs}{' grouped' if args.group else ''} first_view={browser['first_view_cold']:.2f}s "
            f"worst_change={worst:.2f}s bare_plotly={peer:.2f}s"
        )
    else:
        print(f"(no browser side: {CHROMIUM} is missing)")
        print(
            f"curves_page: runs={args.runs} first_view={first:.2f}s (server) worst_change={max(s for _, s in server):.2f}s (server)"
        )


if __name__ == "__main__":
    main()
