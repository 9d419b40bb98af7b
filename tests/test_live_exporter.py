"""Live view (panel on a terminal, plain lines otherwise) and the Prometheus exporter, on a real hunt of
a process leaking at a known rate."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import socket
import subprocess
import time
import urllib.request

from conftest import LEAKTRACE, REPO, run_cli
from ops_helpers import one_error_line, start_hunt, stop_hunt, wait_attached
from prometheus_client.parser import text_string_to_metric_families

LEAK_KIB_S = 2048  # 2 MiB/s = 120 MB/min


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_prometheus_exporter(tmp_path, spawn, leaker_bin):
    target = spawn([leaker_bin, "--leak-kib-per-s", str(LEAK_KIB_S)])
    out = tmp_path / "s"
    # Runs until this test stops it (SIGTERM), so the checks below never race the hunt's deadline.
    hunt = start_hunt(
        "--pid",
        target.pid,
        "--duration",
        "300",
        "--interval",
        "0.5",
        "--out",
        out,
        "--no-gdb",
        "--no-bpf",
        "--prometheus-port",
        "0",
        "--no-live",
        "--format",
        "json",
    )
    try:
        assert wait_attached(out)
        port = json.loads((out / "meta.json").read_text())["prometheus"]["port"]
        # Loopback only: the listener answers on 127.0.0.1, not on another local address.
        try:
            socket.create_connection(("127.0.0.2", port), timeout=2).close()
            raise AssertionError("exporter reachable beyond 127.0.0.1")
        except ConnectionRefusedError:
            pass
        # Scrape until the hunt itself says 7 s have elapsed since attach (its clock, not a sleep here).
        scrapes = 0
        deadline = time.monotonic() + 120
        while True:
            m = _scrape(port)
            scrapes += 1
            if m[("leaktrace_hunt_elapsed_seconds", ())] >= 7 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        labels = (("pid", str(target.pid)), ("process", "leaker"))
        assert m[("leaktrace_targets", ())] == 1
        assert m[("leaktrace_hunt_elapsed_seconds", ())] >= 7
        assert m[("leaktrace_process_rss_bytes", labels)] > 8 << 20
        rate = m[("leaktrace_process_anon_growth_bytes_per_second", labels)]
        assert abs(rate - LEAK_KIB_S * 1024) < 0.25 * LEAK_KIB_S * 1024, rate
        # The same port cannot serve a second hunt: one line, usage exit code.
        other = spawn([leaker_bin])
        r = run_cli(
            "hunt",
            "--pid",
            other.pid,
            "--duration",
            "1",
            "--no-gdb",
            "--no-bpf",
            "--out",
            tmp_path / "b",
            "--prometheus-port",
            port,
        )
        assert r.returncode == 2, r.stderr
        assert "already in use" in one_error_line(r.stderr)
    finally:
        if hunt.poll() is None:
            hunt.send_signal(signal.SIGTERM)
        rc, _, stderr = stop_hunt(hunt)
    assert rc == 0, stderr
    meta = json.loads((out / "meta.json").read_text())
    assert meta["stop_reason"] == "SIGTERM"
    assert meta["probe_summaries"]["exporter"]["scrapes"] == scrapes  # each of ours, once; nobody else's


def test_live_view_plain_lines_when_not_a_tty(tmp_path, spawn, leaker_bin):
    target = spawn([leaker_bin, "--leak-kib-per-s", str(LEAK_KIB_S)])
    hunt = start_hunt(
        "--pid",
        target.pid,
        "--duration",
        "12",
        "--interval",
        "0.5",
        "--out",
        tmp_path / "s",
        "--no-gdb",
        "--no-bpf",
        "--format",
        "json",
    )
    rc, _, stderr = stop_hunt(hunt)
    assert rc == 0, stderr
    lines = [ln for ln in stderr.splitlines() if "] live " in ln]
    assert 2 <= len(lines) <= 3, stderr  # one every 10 s, not one per tick
    assert f"pid {target.pid}" in lines[-1] and "\x1b[" not in stderr
    rate = float(lines[-1].split(" anon ")[1].split()[0])
    assert abs(rate - 120.0) < 30.0, lines[-1]
    r = run_cli(
        "hunt",
        "--pid",
        target.pid,
        "--duration",
        "1",
        "--out",
        tmp_path / "q",
        "--no-gdb",
        "--no-bpf",
        "--no-live",
    )
    assert r.returncode == 0 and "] live " not in r.stderr, r.stderr


def test_live_panel_on_a_terminal(tmp_path, spawn, leaker_bin):
    target = spawn([leaker_bin, "--leak-kib-per-s", str(LEAK_KIB_S)])
    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "120", "LINES": "40", "TERM": "xterm"}
    p = subprocess.Popen(
        [
            *LEAKTRACE,
            "hunt",
            "--pid",
            str(target.pid),
            "--duration",
            "5",
            "--interval",
            "0.5",
            "--out",
            str(tmp_path / "s"),
            "--no-gdb",
            "--no-bpf",
            "--format",
            "json",
        ],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        cwd=str(REPO),
        env=env,
        start_new_session=True,
    )
    os.close(slave)
    buf = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        r, _, _ = select.select([master], [], [], 1)
        if r:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
        elif p.poll() is not None:
            break
    p.wait(timeout=30)
    os.close(master)
    text = buf.decode("utf-8", "replace")
    assert p.returncode == 0, text[-2000:]
    assert "leaktrace hunt —" in text and "anon MB/min" in text, text[-2000:]
    assert str(target.pid) in text and "verdict:" in text
