"""Smoke check for the main job's last step: `streamlit run app.py` serves every page of the
store the main job just built, bound to localhost, without an exception.

Starts the real server on a free port, waits for its health endpoint and the page, stops it,
then renders each page with Streamlit's AppTest (the server alone never runs a page's script
until a browser connects).
"""

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from streamlit.testing.v1 import AppTest

from workbench.app import PAGES

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_once() -> None:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"), "--server.port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                    if r.read().strip() == b"ok":
                        break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    sys.exit(f"app smoke: the server did not come up:\n{server.stderr.read().decode()}")
                time.sleep(0.5)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
            assert r.status == 200 and b"<html" in r.read().lower()
    finally:
        server.terminate()
        server.wait(10)


def render_pages() -> None:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120).run()
    for page in PAGES:
        at.switch_page(page.path).run()
        if at.exception:
            sys.exit(f"app smoke: page {page.title!r} raised: {[e.message for e in at.exception]}")
        print(f"app smoke: {page.title} rendered")


if __name__ == "__main__":
    serve_once()
    render_pages()
    print("app smoke: the server answered on localhost and every page rendered")
