"""The interactive flame graph of report.html and compare.html in a real headless Chromium, driven over the
DevTools protocol (--remote-debugging-pipe): its frames render, hovering a frame shows its bytes and
regions, search and the view selector work, nothing is requested from the network, and a screenshot of it
(1200x900) is saved in the session directory."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import re
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from conftest import run_cli
from golden import render

from leaktrace.session import SessionReader

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


class Browser:
    """Headless Chromium and one page, over the DevTools pipe (fd 3: commands in, fd 4: replies out,
    each message JSON ended by a NUL)."""

    def __init__(self, tmp: Path, window: str = "1200,900") -> None:
        exe = shutil.which("chromium") or shutil.which("chromium-browser")
        if exe is None:
            pytest.skip("Debian `chromium` not installed (.ci/setup.d/40-report.sh installs it)")
        cmd_r, self.cmd_w = os.pipe()
        self.res_r, res_w = os.pipe()

        def child() -> None:  # the pipe's ends as fds 3 and 4, wherever they were
            a, b = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10), fcntl.fcntl(res_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        profile = tempfile.mkdtemp(dir=tmp, prefix="chromium-")
        self.proc = subprocess.Popen([exe, *FLAGS, f"--user-data-dir={profile}", f"--window-size={window}",
                                      "--remote-debugging-pipe", "about:blank"], preexec_fn=child, pass_fds=(3, 4),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(cmd_r)
        os.close(res_w)
        self.buf = b""
        self.next_id = 0
        self.events: list[dict] = []
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Network", "Runtime"):
            self.call(f"{domain}.enable", page=True)
        width, height = (int(v) for v in window.split(","))  # the page's viewport exactly (the window has a frame)
        self.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                         "mobile": False}, page=True)

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self.buf:
            ready, _, _ = select.select([self.res_r], [], [], max(deadline - time.monotonic(), 0))
            chunk = os.read(self.res_r, 1 << 20) if ready else b""
            if not chunk:
                raise TimeoutError("no reply from chromium")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, params: dict | None = None, page: bool = False, timeout: float = 60) -> dict:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if page:
            msg["sessionId"] = self.session
        os.write(self.cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self.next_id:
                assert "error" not in reply, (method, reply["error"])
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        for i, e in enumerate(self.events):
            if e.get("method") == method:
                return self.events.pop(i)
        while True:
            e = self._read(deadline)
            if e.get("method") == method:
                return e
            self.events.append(e)

    def open(self, url: str) -> None:
        self.events = [e for e in self.events if e.get("method") != "Page.loadEventFired"]
        self.call("Page.navigate", {"url": url}, page=True)
        self.wait_event("Page.loadEventFired")

    def js(self, expression: str):
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True},
                      page=True)
        assert "exceptionDetails" not in r, r["exceptionDetails"]
        return r["result"].get("value")

    def requested(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]

    def screenshot(self, path: Path) -> Path:
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", {"format": "png"}, page=True)["data"]))
        return path

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=10)
        except (OSError, TimeoutError, AssertionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        os.close(self.cmd_w)
        os.close(self.res_r)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    b = Browser(tmp_path_factory.mktemp("browser"))
    yield b
    b.close()


def assert_offline(html: Path, browser: Browser) -> None:
    text = html.read_text()
    assert not re.search(r"""<(script|link|img|iframe)\b[^>]*\b(src|href)\s*=\s*["']?(https?:)?//""", text)
    assert all(u.startswith(("file:", "data:", "about:")) for u in browser.requested()), browser.requested()


def frames(browser: Browser, eid: str) -> list[dict]:
    return browser.js(f"""[...document.querySelectorAll('#{eid} g.frame')].map(g => {{
        const r = g.querySelector('rect').getBoundingClientRect();
        return {{name: g.getAttribute('name'), title: g.querySelector('title').textContent,
                 x: r.x + r.width / 2, y: r.y + r.height / 2, w: r.width}}; }})""")


def colourful_share(png: Path) -> float:
    import matplotlib.image as mpimg
    import numpy as np

    rgb = mpimg.imread(str(png))[..., :3]
    assert rgb.shape[:2] == (900, 1200), rgb.shape
    return float((np.abs(rgb[..., 0] - rgb[..., 2]) > 0.25).mean())


def test_report_flame_graph_renders_offline_and_interacts(browser, tmp_path):
    session = render("demo", tmp_path)  # a real session (libxfer_demo.so leaking through raw mmap)
    report = json.loads((session / "report.json").read_text())
    culprit = report["culprits"][0]
    browser.open((session / "report.html").as_uri())
    assert browser.js("document.getElementById('flamegraph').getAttribute('data-view')") == "all"
    shown = frames(browser, "flamegraph")
    names = [f["name"] for f in shown]
    assert names[:2] == ["all processes", f"{culprit['process_label']} ({culprit['pid']})"], names
    assert "libxfer_demo.so!xfer_send+0x3d" in names
    # every frame drawn at its width (the whole width for this one-stack hunt), its bytes in its tooltip
    assert all(f["w"] > 500 for f in shown), shown
    top = next(f for f in shown if f["name"] == "libxfer_demo.so!xfer_send+0x3d")
    regs = SessionReader(session).table("ledger_regions")
    regions = int((~regs["preexisting"].astype(bool)).sum())  # the ledger's outstanding regions: one stack
    assert f"{culprit['outstanding_bytes'] / 2**20:.2f} MB" in top["title"] and f"{regions} regions" in top["title"]
    # hover: the details line says the frame's bytes and regions
    browser.js("document.getElementById('outstanding-by-stack').scrollIntoView()")
    top = next(f for f in frames(browser, "flamegraph") if f["name"] == "libxfer_demo.so!xfer_send+0x3d")
    browser.call("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": top["x"], "y": top["y"]}, page=True)
    details = browser.js("document.getElementById('flamegraph-details').textContent")
    assert details.startswith("libxfer_demo.so!xfer_send+0x3d") and f"{regions} regions" in details, details
    shot = browser.screenshot(session / "flamegraph.png")
    assert colourful_share(shot) > 0.01  # the boxes are drawn in warm colours
    # search highlights and sums the matching frames
    browser.js("const s = document.getElementById('flamegraph-search'); s.value = 'xfer_send';"
               "s.dispatchEvent(new Event('input'))")
    assert browser.js("document.getElementById('flamegraph-match').textContent").startswith("1 frame(s), 65.00 MB")
    # one view per culprit and per process
    titles = browser.js("[...document.querySelectorAll('#flamegraph-view option')].map(o => o.textContent)")
    assert titles[1].startswith("Culprit #1 libxfer_demo.so") and titles[2].startswith("Process other")
    browser.js("const v = document.getElementById('flamegraph-view'); v.value = '1'; v.dispatchEvent(new Event('change'))")
    assert browser.js("document.getElementById('flamegraph').getAttribute('data-view')") == "culprit-1"
    assert frames(browser, "flamegraph")[0]["name"].startswith("#1 libxfer_demo.so")
    assert_offline(session / "report.html", browser)


def test_compare_shows_both_flame_graphs(browser, tmp_path):
    before, after = render("ucx", tmp_path), render("demo", tmp_path)
    r = run_cli("compare", before, after, "--out", tmp_path / "cmp", timeout=120)
    assert r.returncode == 0, r.stderr
    html = tmp_path / "cmp" / "compare.html"
    browser.open(html.as_uri())
    b, a = frames(browser, "flamegraph-before"), frames(browser, "flamegraph-after")
    assert any(f["name"].startswith("libucm.so.0!") for f in b), b
    assert any(f["name"] == "libxfer_demo.so!xfer_send+0x3d" for f in a), a
    assert b[0]["x"] < a[0]["x"]  # side by side
    browser.js("document.getElementById('outstanding-by-stack').scrollIntoView()")
    assert colourful_share(browser.screenshot(after / "compare-flamegraphs.png")) > 0.01
    assert_offline(html, browser)
