"""`leaktrace hunt` inside a PID namespace (a container without hostPID, a node of the cluster test).

The kernel's pids (bpf_get_current_pid_tgid, sched_process_fork) are host pids; leaktrace names its targets
and reads /proc with the namespace's. A fresh namespace (``unshare --pid --fork --mount-proc``) holds the
driver of the stripped raw-syscall library and the hunt, started by its PID 1 shell with the driver's
namespace pid; the test feeds the driver through a FIFO once the probe is attached. The driver leaks, and a
child it forks after attach leaks too: both must be in the ledger, exact, and named by library. The hunt
is stopped (SIGTERM, through a second FIFO) once the driver says every mapping is made: a slow machine
stretches the hunt, it cannot cut the leaks short.
"""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO
from fixtures.bpf_harness import bpf_driver, is_root, wait_until

from leaktrace.session import SessionReader

pytestmark = [pytest.mark.bpf, pytest.mark.skipif(not is_root(), reason="BPF and unshare need root")]

LIB = "libbpfleak.so"
MIB = 1 << 20
HUNT_S = 300  # a cap only: the test stops the hunt once both leaks (~12 s each, a steady slope) are done
# PID 1 of the namespace: the driver (stdin from the FIFO), then the hunt on the driver's namespace pid,
# stopped with SIGTERM when a line arrives on the second FIFO.
SCRIPT = """
"$1" < "$2" &
drv=$!
echo "driver $drv"
"$5" -m leaktrace hunt --pid "$drv" --duration "$4" --interval 1 --no-gdb --out "$3" > "$3.log" 2>&1 &
hunt=$!
read _stop < "$6"
kill -TERM "$hunt"
wait "$hunt"
echo "hunt-rc $?"
"""


def _line(p: subprocess.Popen, timeout: float) -> str:
    ready, _, _ = select.select([p.stdout], [], [], timeout)
    return p.stdout.readline().strip() if ready else ""  # type: ignore[union-attr]


def _open_writer(fifo: Path, timeout: float) -> int:
    """The FIFO's write end, once the driver has opened its read end (bounded, never blocks)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            if e.errno != errno.ENXIO or time.monotonic() > deadline:
                raise
            time.sleep(0.05)
            continue
        os.set_blocking(fd, True)
        return fd


def test_hunt_inside_pid_namespace_names_library(tmp_path: Path) -> None:
    if subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "--", "true"],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot create a PID namespace here")
    driver = bpf_driver()
    fifo, stop_fifo, out = tmp_path / "cmd", tmp_path / "stop", tmp_path / "hunt"
    os.mkfifo(fifo)
    os.mkfifo(stop_fifo)
    ns = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child=SIGKILL", "--",
                           "sh", "-c", SCRIPT, "sh", str(driver), str(fifo), str(out), str(HUNT_S), sys.executable,
                           str(stop_fifo)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO),
                          start_new_session=True)
    log = Path(f"{out}.log")
    fd = -1
    try:
        first = _line(ns, 30)
        assert first.startswith("driver "), (first, ns.stderr.read() if ns.poll() is not None else "")  # type: ignore[union-attr]
        drv = int(first.split()[1])
        fd = _open_writer(fifo, 30)
        cmds = os.fdopen(fd, "w", buffering=1)
        fd = -1

        def cmd(text: str) -> list[str]:
            cmds.write(text + "\n")
            reply = _line(ns, 30).split()
            assert reply and reply[0] == "ok", (text, reply)
            return reply[1:]

        # The driver's own view: its pid is the namespace's, not the host's.
        assert _line(ns, 30) == f"ready {drv}"
        assert drv < 100
        attached = wait_until(lambda: log.exists() and "bpf: tracing" in log.read_text(), timeout=90, step=0.2)
        assert attached, log.read_text() if log.exists() else "no hunt log"
        assert "PID namespace" in log.read_text()

        rounds, per_round = 12, 4
        child_count, child_ms = 48, 250
        (child,) = cmd(f"forkleak {child_count} {MIB} {child_ms}")
        child_pid = int(child)
        for _ in range(rounds):
            assert cmd(f"leak {per_round} {MIB}") == [str(per_round * MIB)]
            cmd("churn 200 8192")  # balanced noise, settled in the kernel
            time.sleep(1.0)  # pacing: a slope over several ticks (the totals below do not depend on it)
        assert cmd("forkwait") == [str(child_count)]  # the child has made all its mappings
        stop_fd = _open_writer(stop_fifo, 30)
        os.write(stop_fd, b"stop\n")
        os.close(stop_fd)
        end = _line(ns, 180)
        assert end == "hunt-rc 0", (end, log.read_text())
    finally:
        if fd >= 0:
            os.close(fd)
        try:
            os.killpg(ns.pid, signal.SIGKILL)  # unshare's --kill-child then kills the namespace's PID 1
        except ProcessLookupError:
            pass
        ns.wait(timeout=30)

    report = json.loads((out / "report.json").read_text())
    assert report["stop_reason"] == "SIGTERM", report["stop_reason"]
    led = report["ledger"]
    assert led["events"] > rounds * (per_round + 400), led
    assert led["lost_events"] == 0
    top = report["culprits"][0]
    assert top["library"] == LIB and top["pid"] in (drv, child_pid), report["culprits"]
    native = {c["pid"]: c for c in report["culprits"] if c["kind"] == "native-mmap"}
    assert native.get(drv, {}).get("library") == LIB, report["culprits"]
    assert native[drv]["outstanding_bytes"] == rounds * per_round * MIB
    # The child was born after attach: followed from the kernel's fork, numbered in the namespace.
    assert native.get(child_pid, {}).get("library") == LIB, report["culprits"]
    assert native[child_pid]["outstanding_bytes"] == child_count * MIB

    reg = SessionReader(out).table("ledger_regions")
    assert set(reg["pid"]) <= {drv, child_pid}
    for pid, truth in ((drv, rounds * per_round * MIB), (child_pid, child_count * MIB)):
        mine = reg[(reg["pid"] == pid) & (reg["library"] == LIB) & (reg["kind"] == "anon")]
        assert int(mine["size"].sum()) == truth
        assert len(mine) == truth // MIB
