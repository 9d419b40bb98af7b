"""SysV shared memory (shmget + shmat) gets its culprit like POSIX shm and memfd do (tests/test_shapes.py): the
library that attached the segments, the call site, the rate and the bytes outstanding, checked against the
fixture's own bookkeeping (tests/fixtures/shapes.c, shape ``sysv``: attached, IPC_RMID'd, never detached).
shmat is no mmap: the eBPF probe traces shmat/shmdt themselves. A program that detaches what it attaches
holds nothing and is no shm culprit."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from conftest import REPO, is_root
from fixtures.bpf_harness import Traced
from shapes_helpers import MB, hunt_shape

from leaktrace.session import SessionReader

pytestmark = [pytest.mark.bpf, pytest.mark.skipif(not is_root(), reason="BPF needs root")]
KIB_PER_S = 1024  # 60 MB/min
PAGE = 4096

# A SysV client driven line by line on stdin (ctypes over libc): "at SIZE" attaches a new segment and
# prints "ADDR SHMID"; "dt ADDR" detaches; "rm SHMID" removes (IPC_RMID); "churn N SIZE HOLD_S" attaches
# and touches N segments, holds them HOLD_S seconds, then detaches and removes them. One line per command.
SYSV_CLIENT = r"""
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.shmdt.argtypes = [ctypes.c_void_p]
def attach(size):
    sid = libc.shmget(0, size, 0o1600)
    addr = libc.shmat(sid, None, 0)
    ctypes.memset(addr, 1, size)
    return addr, sid
print("ready", flush=True)
for line in sys.stdin:
    cmd, *a = line.split()
    if cmd == "at":
        print(*attach(int(a[0])), flush=True)
    elif cmd == "dt":
        print(libc.shmdt(int(a[0])), flush=True)
    elif cmd == "rm":
        print(libc.shmctl(int(a[0]), 0, None), flush=True)
    elif cmd == "churn":
        segs = [attach(int(a[1])) for _ in range(int(a[0]))]
        time.sleep(float(a[2]))
        for addr, sid in segs:
            libc.shmdt(addr)
            libc.shmctl(sid, 0, None)
        print("ok", flush=True)
"""


class SysvClient:
    def __init__(self) -> None:
        self.p = subprocess.Popen([sys.executable, "-c", SYSV_CLIENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, start_new_session=True)
        assert self.p.stdout.readline().strip() == "ready"  # type: ignore[union-attr]
        self.pid = self.p.pid

    def cmd(self, *words: object) -> list[int]:
        self.p.stdin.write(" ".join(map(str, words)) + "\n")  # type: ignore[union-attr]
        self.p.stdin.flush()  # type: ignore[union-attr]
        return [int(x) for x in self.p.stdout.readline().split() if x != "ok"]  # type: ignore[union-attr]

    def close(self) -> None:
        self.p.kill()
        self.p.wait(timeout=10)


@pytest.fixture
def client():
    c = SysvClient()
    yield c
    c.close()


def _sysv_maps(pid: int) -> dict[int, int]:
    """start -> size of the process's SysV mappings, from /proc/PID/maps."""
    out = {}
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[5].startswith("/SYSV"):
                a, b = (int(x, 16) for x in fields[0].split("-"))
                out[a] = b - a
    return out


def _ledger_shm(tr: Traced, pid: int) -> dict[int, int]:
    with tr.probe.lock:
        return {iv.start: iv.size for iv in tr.probe.ledger.intervals(pid) if iv.origin.kind == "shm"}


def test_ledger_follows_attach_detach_and_rmid_exactly(tmp_path, client) -> None:
    """Segments of odd sizes attached, some detached, some IPC_RMID'd while attached: the ledger holds
    exactly what /proc/PID/maps shows as SysV mappings (a removed segment stays mapped until detached)."""
    tr = Traced(tmp_path / "s", [client.pid])
    segs = [client.cmd("at", size) for size in (PAGE, 3 * PAGE + 100, 64 * 1024, 1 << 20, 5 * PAGE)]
    client.cmd("dt", segs[1][0])  # detached, still existing
    client.cmd("rm", segs[1][1])
    client.cmd("rm", segs[2][1])  # removed while attached: still mapped, still counted
    client.cmd("dt", segs[3][0])
    client.cmd("rm", segs[3][1])
    gone = client.cmd("at", 2 * PAGE + 1)  # detached at once but not removed: sized from /proc/sysvipc/shm
    client.cmd("dt", gone[0])
    client.cmd("churn", 200, 16 * 1024, 0)  # balanced, detached before the probe could size them
    client.cmd("churn", 20, 16 * 1024, 0.3)  # balanced, sized while held
    time.sleep(0.3)
    tr.tick()
    held = _ledger_shm(tr, client.pid)
    assert held == _sysv_maps(client.pid)
    assert held == {segs[0][0]: PAGE, segs[2][0]: 64 * 1024, segs[4][0]: 5 * PAGE}
    client.cmd("rm", gone[1])
    reader = tr.stop()
    ev = reader.table("bpf_events")
    shmat = ev[ev["type"] == "shmat"]
    assert len(shmat) == 226 and len(ev[ev["type"] == "shmdt"]) == 223
    # The size read from /proc: the mapping's, page-rounded. Attaches detached before the probe read /proc
    # have none and are left out (their shmdt follows: balanced either way).
    assert int(shmat["len"].iloc[2]) == 64 * 1024
    assert int(shmat["len"].iloc[5]) == 3 * PAGE
    assert (shmat["len"].iloc[-20:] == 16 * 1024).all()
    assert int(reader.table("bpf_counters")["shm_unsized"].iloc[-1]) == 0  # none may still be held
    reg = reader.table("ledger_regions")
    shm = reg[(reg["pid"] == client.pid) & (reg["kind"] == "shm")]
    assert int(shm["size"].sum()) == PAGE + 64 * 1024 + 5 * PAGE


def test_sysv_segments_name_the_attacher(spawn, shapes_bin, tmp_path):
    rep, pid, expected, rate = hunt_shape(spawn, shapes_bin, tmp_path, KIB_PER_S, "sysv")
    assert rep["verdict"] == "leak", rep["verdict_reason"]
    top = rep["culprits"][0]
    assert top["pid"] == pid
    assert (top["kind"], top["library"]) == ("shm", "libshape.so"), top
    assert any("libshape.so!shape_sysv_tick" in f for f in top["stack"]), top["stack"]
    assert top["mb_per_min"] == pytest.approx(rate, rel=0.15)
    assert top["outstanding_bytes"] == pytest.approx(expected, rel=0.05)
    assert any("joined by address" in e for e in top["evidence"]), top["evidence"]
    assert rate > 0.8 * KIB_PER_S * 1024 * 60 / MB  # the fixture kept the rate asked


def test_sysv_churn_is_no_shm_culprit(tmp_path, client):
    """Control: a process attaching and detaching (and removing) thousands of segments holds none of
    them: no shm culprit, and the ledger holds no shm at the end."""
    client.cmd("at", PAGE)  # the interpreter's one-off growth from ctypes, before the hunt
    stop = time.monotonic() + 60
    hunt = subprocess.Popen([sys.executable, "-m", "leaktrace", "hunt", "--pid", str(client.pid), "--duration", "20",
                             "--format", "json", "--out", str(tmp_path / "s")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(REPO))
    while hunt.poll() is None and time.monotonic() < stop:
        client.cmd("churn", 20, 256 * 1024, 0.2)  # 5 MB attached at a time: the ledger sizes them, then sees them go
    _, err = hunt.communicate(timeout=120)
    assert hunt.returncode == 0, err
    rep = json.loads((tmp_path / "s" / "report.json").read_text())
    assert not [c for c in rep["culprits"] if c["kind"] == "shm"], rep["culprits"]
    reader = SessionReader(tmp_path / "s")
    ev = reader.table("bpf_events")
    sized = ev[(ev["type"] == "shmat") & (ev["len"] == 256 * 1024)]
    assert len(sized) > 500  # it churned, and the probe sized what it attached
    # every detach seen, but those of the one churn batch (20 segments) in flight when the hunt stopped tracing
    assert (ev["type"] == "shmdt").sum() >= len(sized) - 20
    # No tick of the ledger holds more shm than one round attaches (the table has no row at a tick that
    # held nothing): every detach was applied.
    snaps = reader.table("ledger_snapshots")
    if not snaps.empty:
        shm = snaps[snaps["kind"] == "shm"].groupby("t")["outstanding_bytes"].sum()
        assert int(shm.max() if len(shm) else 0) <= 20 * 256 * 1024
    # Unsized attaches still waiting for their shmdt at the end: at most the round the hunt stopped in
    # (read just after the client detached it, its shmdt after the last drain).
    assert int(reader.table("bpf_counters")["shm_unsized"].iloc[-1]) <= 20
