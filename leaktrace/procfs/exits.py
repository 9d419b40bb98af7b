"""How a process ended, from the kernel's wait status (``task->exit_code``, as waitpid(2) would see it):
read by the eBPF probe at the exit, or from /proc/PID/stat (field 52, ``exit_code``) while the process is a
zombie its parent has not reaped yet. leaktrace is not the parent: it cannot wait for it.

``describe_exit`` turns a status into report.json's ``exit`` block:
``{"how": "exited"|"signal"|"oom-killed"|"unknown", "status": int|None, "signal": "SIGKILL"|None,
"core": bool, "source": "ebpf"|"proc"|None}``.
"""

from __future__ import annotations

import signal as _signal
from typing import Any

from leaktrace.errors import AccessDenied, ProcessGone
from leaktrace.procfs import read_proc_text, stat_field


def signal_name(sig: int) -> str:
    try:
        return _signal.Signals(sig).name
    except ValueError:
        return f"SIG{sig}"


def describe_exit(code: int | None, oom: bool = False, source: str | None = None) -> dict[str, Any]:
    """The ``exit`` block for a wait status ``code`` (None: not known). ``oom``: the OOM killer chose the
    process (its status then says SIGKILL)."""
    out: dict[str, Any] = {"how": "unknown", "status": None, "signal": None, "core": False, "source": source}
    if code is None or code < 0:
        if oom:
            out.update(how="oom-killed", signal="SIGKILL")
        return out
    sig = code & 0x7F
    if sig == 0:
        out.update(how="oom-killed" if oom else "exited", status=(code >> 8) & 0xFF)
    else:
        out.update(how="oom-killed" if oom else "signal", signal=signal_name(sig), core=bool(code & 0x80))
    return out


def exit_phrase(ex: dict[str, Any] | None) -> str:
    """One line for the reports: "exited with status 0", "killed by SIGKILL", "OOM-killed (SIGKILL)"."""
    if not ex or ex.get("how") in (None, "unknown"):
        return "ended, how unknown"
    if ex["how"] == "exited":
        return f"exited with status {ex.get('status')}"
    if ex["how"] == "oom-killed":
        return "OOM-killed" + (f" ({ex['signal']})" if ex.get("signal") else "")
    return f"killed by {ex.get('signal')}" + (" (core dumped)" if ex.get("core") else "")


def zombie_exit_code(pid: int) -> int | None:
    """The wait status of ``pid`` while it is a zombie (state Z in /proc/PID/stat), else None."""
    try:
        text = read_proc_text(pid, "stat")
        if stat_field(text, 3) != "Z":
            return None
        return int(stat_field(text, 52))
    except (ProcessGone, AccessDenied, OSError, ValueError, IndexError):
        return None
