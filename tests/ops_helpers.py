"""Helpers for the operations tests (faults, bad input, secrets, live view, exporter): start a real
`leaktrace hunt` process, wait on its session, inspect kernel state."""

from __future__ import annotations

import ctypes
import os
import subprocess
import time
from pathlib import Path

from conftest import LEAKTRACE, REPO, wait_for


def start_hunt(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`leaktrace hunt ARGS` as a child process (stdout/stderr captured as text)."""
    return subprocess.Popen(
        [*LEAKTRACE, "hunt", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(REPO),
        env={**os.environ, **(env or {})},
    )


def parts(out: Path, table: str = "rollup") -> list[Path]:
    d = out / "tables" / table
    return sorted(d.glob("part-*.parquet")) if d.is_dir() else []


def wait_attached(out: Path, timeout: float = 60) -> bool:
    """Until the hunt recorded attach_s and flushed some rollup rows."""
    import json

    def ok() -> bool:
        try:
            meta = json.loads((out / "meta.json").read_text())
        except (OSError, ValueError):
            return False
        return meta.get("attach_s") is not None and bool(parts(out))

    return wait_for(ok, timeout=timeout, step=0.2)


def live_rollup(out: Path):
    """The rollup table of a session being written (empty DataFrame until its first part)."""
    import pandas as pd

    from leaktrace.errors import SessionError
    from leaktrace.session import SessionReader

    try:
        return SessionReader(out).table("rollup")
    except (SessionError, OSError, ValueError):
        return pd.DataFrame(columns=["t", "pid", "rss"])


def wait_rollup(out: Path, rows: int = 1, span_s: float = 0.0, timeout: float = 120) -> bool:
    """Until the session's rollup holds ≥ ``rows`` rows covering ≥ ``span_s`` seconds of hunt time: a
    wait on the hunt's own progress (its ticks on disk), not on the wall clock."""

    def ok() -> bool:
        r = live_rollup(out)
        return len(r) >= rows and (float(r["t"].max() - r["t"].min()) if len(r) else 0.0) >= span_s

    return wait_for(ok, timeout=timeout, step=0.25)


def session_now(out: Path) -> float:
    """The session's clock (``t`` of its tables: CLOCK_MONOTONIC since the hunt started) read here."""
    import json

    return time.monotonic() - json.loads((out / "meta.json").read_text())["t0_monotonic"]


def proc_status(pid: int) -> dict[str, str]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        out[k] = v.strip()
    return out


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc/PID/task/*/children)."""
    kids: list[int] = []
    for t in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            kids += [int(x) for x in t.read_text().split()]
        except OSError:
            pass
    return kids


# bpf(BPF_PROG_GET_NEXT_ID): every BPF program loaded on the machine, whoever loaded it.
_SYS_BPF = {"x86_64": 321, "aarch64": 280}.get(os.uname().machine)
_BPF_PROG_GET_NEXT_ID = 11


def bpf_prog_ids() -> set[int] | None:
    """Ids of all loaded BPF programs, or None when this process may not ask (not root, no syscall)."""
    if _SYS_BPF is None:
        return None
    libc = ctypes.CDLL(None, use_errno=True)

    class Attr(ctypes.Structure):
        _fields_ = [
            ("start_id", ctypes.c_uint32),
            ("next_id", ctypes.c_uint32),
            ("open_flags", ctypes.c_uint32),
            ("pad", ctypes.c_uint8 * 116),
        ]

    ids: set[int] = set()
    attr = Attr()
    while True:
        r = libc.syscall(_SYS_BPF, _BPF_PROG_GET_NEXT_ID, ctypes.byref(attr), ctypes.sizeof(attr))
        if r != 0:
            return ids if ctypes.get_errno() == 2 else None  # ENOENT: end of the list
        ids.add(attr.next_id)
        attr.start_id = attr.next_id


def prog_ids_held_by(pid: int) -> set[int]:
    """BPF programs whose fds ``pid`` holds (from /proc/PID/fdinfo)."""
    ids: set[int] = set()
    for f in Path(f"/proc/{pid}/fdinfo").glob("*"):
        try:
            for line in f.read_text().splitlines():
                if line.startswith("prog_id:"):
                    ids.add(int(line.split()[1]))
        except (OSError, ValueError):
            pass
    return ids


def wait_gone(pid: int, timeout: float = 15) -> bool:
    return wait_for(
        lambda: not Path(f"/proc/{pid}").exists() or proc_status(pid).get("State", "").startswith("Z"),
        timeout=timeout,
    )


def stop_hunt(p: subprocess.Popen, timeout: float = 120) -> tuple[int, str, str]:
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
    return p.returncode, out, err


def one_error_line(stderr: str) -> str:
    """The single `leaktrace: error:` line of a failed command (asserts there is exactly one and no
    traceback)."""
    assert "Traceback" not in stderr, stderr
    lines = [ln for ln in stderr.splitlines() if ln.startswith("leaktrace: error:")]
    assert len(lines) == 1, stderr
    return lines[0]


def now() -> float:
    return time.monotonic()
