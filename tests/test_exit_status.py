"""How a process ended, without a kernel: wait statuses decoded as the kernel stores them, the BTF reader
that finds task_struct.exit_code for the BPF program, and a zombie's status read from /proc."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import wait_for

from leaktrace.analysis.exits import process_exits
from leaktrace.analysis.ledger import native_culprits
from leaktrace.probes.bpf.btf import VMLINUX_BTF, kernel_member_offset, member_offset
from leaktrace.procfs.exits import describe_exit, exit_phrase, zombie_exit_code
from leaktrace.session import SessionReader, SessionWriter


@pytest.mark.parametrize(("code", "oom", "how", "status", "sig", "phrase"), [
    (0, False, "exited", 0, None, "exited with status 0"),
    (3 << 8, False, "exited", 3, None, "exited with status 3"),
    (9, False, "signal", None, "SIGKILL", "killed by SIGKILL"),
    (11 | 0x80, False, "signal", None, "SIGSEGV", "killed by SIGSEGV (core dumped)"),
    (9, True, "oom-killed", None, "SIGKILL", "OOM-killed (SIGKILL)"),
    (None, False, "unknown", None, None, "ended, how unknown"),
    (-1, True, "oom-killed", None, "SIGKILL", "OOM-killed (SIGKILL)"),
])
def test_wait_status_decoded(code, oom, how, status, sig, phrase):
    ex = describe_exit(code, oom=oom)
    assert (ex["how"], ex["status"], ex["signal"]) == (how, status, sig)
    assert exit_phrase(ex) == phrase


def _btf(types: list[bytes], strings: bytes) -> bytes:
    body = b"".join(types)
    return struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(body), len(body), len(strings)) + body + strings


def test_btf_member_offset_from_a_small_blob():
    strings = b"\0int\0s\0a\0exit_code\0other\0"
    name = {n: strings.index(b"\0" + n.encode() + b"\0") + 1 for n in ("int", "s", "a", "exit_code", "other")}
    int_t = struct.pack("<III", name["int"], 1 << 24, 4) + struct.pack("<I", 32)  # INT, 4 bytes
    # an unrelated struct first (same member name, another offset), then the one asked for
    other = struct.pack("<III", name["other"], (4 << 24) | 1, 8) + struct.pack("<III", name["exit_code"], 1, 0)
    s = struct.pack("<III", name["s"], (4 << 24) | 2, 16) + struct.pack("<III", name["a"], 1, 0) \
        + struct.pack("<III", name["exit_code"], 1, 96)
    blob = _btf([int_t, other, s], strings)
    assert member_offset(blob, "s", "exit_code") == 12
    assert member_offset(blob, "s", "missing") is None and member_offset(blob, "nope", "a") is None
    assert member_offset(b"\0" * 32, "s", "a") is None


@pytest.mark.skipif(not os.access(VMLINUX_BTF, os.R_OK), reason="no readable kernel BTF")
def test_kernel_task_struct_exit_code_found():
    off = kernel_member_offset("task_struct", "exit_code")
    assert off is not None and 0 < off < 16384 and off % 4 == 0


def test_zombie_status_from_proc():
    p = subprocess.Popen(["sh", "-c", "exit 7"])
    try:
        assert wait_for(lambda: zombie_exit_code(p.pid) is not None, timeout=10)
        assert describe_exit(zombie_exit_code(p.pid))["status"] == 7
    finally:
        p.wait()
    assert zombie_exit_code(p.pid) is None  # reaped: nothing left to read
    q = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.1)
        assert zombie_exit_code(q.pid) is None  # alive
        os.kill(q.pid, signal.SIGKILL)
        assert wait_for(lambda: zombie_exit_code(q.pid) is not None, timeout=10)
        assert describe_exit(zombie_exit_code(q.pid))["signal"] == "SIGKILL"
    finally:
        q.wait()


def _short_session(tmp_path: Path) -> SessionReader:
    """A target traced 1.5 s (two ledger snapshots: attach and exit) that mapped 64 KiB regions steadily,
    then was OOM-killed."""
    w = SessionWriter(tmp_path / "s")
    chunk, born = 64 * 1024, np.linspace(1.0, 2.5, 160, endpoint=False)
    w.append("bpf_counters", [{"t": t, "syscalls": 200, "lost_events": 0} for t in (1.0, 2.5)])
    w.append("ledger_snapshots", [{"t": 1.0, "pid": 42, "library": "libfoo.so", "kind": "anon",
                                   "outstanding_bytes": chunk, "regions": 1},
                                  {"t": 2.5, "pid": 42, "library": "libfoo.so", "kind": "anon",
                                   "outstanding_bytes": chunk * len(born), "regions": len(born)}])
    w.append("ledger_regions", [{"pid": 42, "start": i * chunk, "end": (i + 1) * chunk, "size": chunk,
                                 "library": "libfoo.so", "kind": "anon", "stack_key": "42:0x1", "preexisting": False,
                                 "t_born": float(t), "path": "", "at_exit": True} for i, t in enumerate(born)])
    w.append("ledger_exits", {"t": 2.5, "pid": 42, "outstanding_bytes": chunk * len(born), "regions": len(born),
                              "exit_code": 9, "oom": True})
    w.close()
    return SessionReader(tmp_path / "s")


def test_short_lived_ledger_rate_and_exit(tmp_path: Path):
    reader = _short_session(tmp_path)
    (c,) = native_culprits(reader, min_span_s=8.0)
    expected = 64 * 1024 * 159 / 1.5 * 60 / 2**20  # MB/min between the two snapshots
    assert c["short_lived"] and c["mb_per_min"] == pytest.approx(expected, rel=1e-6)
    assert c["confidence"] > 0.9  # steady births
    assert any(e.startswith("short-lived") for e in c["evidence"])
    ex = process_exits(reader)[42]
    assert (ex["how"], ex["signal"], ex["source"], ex["t"]) == ("oom-killed", "SIGKILL", "ebpf", 2.5)
