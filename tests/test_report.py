"""Reports: a hunt killed with SIGKILL still yields every output; report.html renders its plots in a real
headless Chromium; reporters cope with a watcher-only session."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import LEAKTRACE, REPO, run_cli
from ops_helpers import live_rollup, wait_rollup

from leaktrace.report.flame_svg import flame_svg
from leaktrace.report.folded import folded_text

OUTPUTS = ("report.json", "report.md", "report.html", "outstanding.folded")


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def render_in_chromium(html: Path, tmp: Path) -> tuple[str, Path]:
    """(DOM after load, screenshot path) from headless Chromium with no network side effects."""
    exe = chromium()
    assert exe
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars"]
    profile = tempfile.mkdtemp(dir=tmp, prefix="chromium-")
    dom = subprocess.run([exe, *flags, f"--user-data-dir={profile}", "--dump-dom", html.as_uri()],
                         capture_output=True, text=True, timeout=90).stdout
    shot = tmp / "shot.png"
    subprocess.run([exe, *flags, f"--user-data-dir={profile}", "--window-size=1200,3000",
                    f"--screenshot={shot}", html.as_uri()], capture_output=True, text=True, timeout=90)
    return dom, shot


def assert_renders(html: Path, tmp: Path, min_svgs: int) -> None:
    if chromium() is None:
        pytest.skip("Debian `chromium` not installed (.ci/setup.d/40-report.sh installs it)")
    dom, shot = render_in_chromium(html, tmp)
    assert dom.count("<svg") >= min_svgs, dom[:500]
    # self-contained: nothing loaded from elsewhere (namespace URIs in SVG metadata are only names)
    assert not re.search(r"""(src|href|url)\s*[=(]\s*["']?(https?:|//)""", dom), re.findall(r".{40}https?:.{40}", dom)[:3]
    import matplotlib.image as mpimg
    import numpy as np

    img = mpimg.imread(str(shot))
    assert img.shape[0] >= 1000
    # Plots draw lines and bars in colour: a page of only text would be (nearly) grey-scale.
    rgb = img[..., :3]
    colourful = np.abs(rgb[..., 0] - rgb[..., 2]) > 0.25
    assert colourful.mean() > 0.002, colourful.mean()


@pytest.fixture(scope="module")
def killed_session(leaker_bin, tmp_path_factory):
    """A watcher-only hunt of a leaking process, killed with SIGKILL mid-hunt."""
    d = tmp_path_factory.mktemp("killed") / "session"
    target = subprocess.Popen([str(leaker_bin), "--leak-kib-per-s", "512", "--mremap-kib-per-s", "256"],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert target.stdout.readline().startswith("ready")
        hunt = subprocess.Popen([*LEAKTRACE, "hunt", "--pid", str(target.pid), "--duration", "120",
                                 "--smaps-every", "2", "--no-bpf", "--no-gdb", "--out", str(d), "-q"],
                                cwd=str(REPO), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Killed once 14 s of hunt time are on disk (the hunt's ticks, not a sleep that a loaded machine
        # may fill with fewer of them).
        assert wait_rollup(d, span_s=14.0, timeout=120), f"{len(live_rollup(d))} rollup rows in 120 s"
        hunt.send_signal(signal.SIGKILL)
        hunt.wait(timeout=10)
    finally:
        os.killpg(target.pid, signal.SIGKILL)
        target.wait(timeout=10)
    return d


def test_report_on_killed_hunt_writes_all_outputs(killed_session):
    assert not any((killed_session / f).exists() for f in OUTPUTS)
    r = run_cli("report", killed_session, "--format", "json,md,html,folded")
    assert r.returncode == 0, r.stderr
    for f in OUTPUTS:
        assert (killed_session / f).stat().st_size > 0, f
    rep = json.loads((killed_session / "report.json").read_text())
    assert rep["session_complete"] is False
    assert "killed" in rep["stop_reason"]
    assert rep["verdict"] == "leak", rep["verdict_reason"]
    assert rep["culprits"][0]["mb_per_min"] == pytest.approx(45.0, rel=0.25)  # 512 + 256 KiB/s
    assert rep["regions"]["growing"], "the leaking anonymous regions are listed"
    md = (killed_session / "report.md").read_text()
    assert "not finalized" in md and "| pid |" in md
    # watcher only: the folded "stacks" are process;[class] pairs
    assert "[anon]" in (killed_session / "outstanding.folded").read_text()


def test_killed_hunt_html_renders_in_chromium(killed_session, tmp_path):
    html = killed_session / "report.html"
    if not html.exists():
        assert run_cli("report", killed_session).returncode == 0
    # memory over time, growth by class, top regions, flame graph
    assert_renders(html, tmp_path, min_svgs=4)


def test_report_on_empty_session_is_inconclusive(tmp_path):
    from leaktrace.session import SessionWriter

    w = SessionWriter(tmp_path / "s")
    w.close()
    r = run_cli("report", tmp_path / "s")
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "s" / "report.json").read_text())
    assert rep["verdict"] == "inconclusive" and rep["culprits"] == [] and rep["processes"] == []
    assert (tmp_path / "s" / "report.html").exists()


def test_flame_graph_from_folded_stacks():
    stacks = [(["proc (1)", "main", "xfer_send", "syscall"], 3 << 20), (["proc (1)", "main", "recv"], 1 << 20)]
    text = folded_text(stacks)
    assert text.splitlines()[0] == f"proc (1);main;xfer_send;syscall {3 << 20}"
    svg = flame_svg(stacks)
    assert svg.count("<rect") == 6 and "xfer_send" in svg and "75.0%" in svg
