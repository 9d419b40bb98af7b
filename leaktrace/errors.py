"""Typed errors. Each carries what failed, what to do about it, and a distinct exit code.

The CLI prints ``str(err)`` as one line (no traceback unless -v) and exits with ``err.exit_code``.
"""

from __future__ import annotations


class LeaktraceError(Exception):
    exit_code = 1
    default_remedy = ""

    def __init__(self, message: str, remedy: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.remedy = remedy if remedy is not None else self.default_remedy

    def __str__(self) -> str:
        if self.remedy:
            return f"{self.message} — {self.remedy}"
        return self.message


class UsageError(LeaktraceError):
    exit_code = 2


class NoSuchProcess(LeaktraceError):
    """The PID does not exist (at start) or vanished between two reads."""

    exit_code = 3
    default_remedy = "check the PID with `leaktrace ps`"

    def __init__(self, pid: int, message: str | None = None, remedy: str | None = None) -> None:
        super().__init__(message or f"no such process: {pid}", remedy)
        self.pid = pid


class ProcessGone(NoSuchProcess):
    """A process that existed went away while we were reading it (a race, not a user error)."""

    def __init__(self, pid: int, what: str = "") -> None:
        super().__init__(pid, f"process {pid} exited" + (f" while reading {what}" if what else ""))


class AccessDenied(LeaktraceError):
    exit_code = 4
    default_remedy = "run as root (sudo) or with CAP_SYS_PTRACE"

    def __init__(self, pid: int | None, what: str, remedy: str | None = None) -> None:
        msg = f"permission denied reading {what}" + (f" of pid {pid}" if pid is not None and str(pid) not in what else "")
        super().__init__(msg, remedy)
        self.pid = pid


class BpfUnavailable(LeaktraceError):
    exit_code = 5
    default_remedy = "run as root, install bpfcc (`apt-get install python3-bpfcc`), or pass --no-bpf"


class GdbUnavailable(LeaktraceError):
    exit_code = 6
    default_remedy = "install gdb (`apt-get install gdb`), allow ptrace (kernel.yama.ptrace_scope), or pass --no-gdb"


class SessionError(LeaktraceError):
    """Missing, unreadable or corrupt session directory."""

    exit_code = 7
    default_remedy = "point at a directory written by `leaktrace hunt`"


class MetricsUnreachable(LeaktraceError):
    exit_code = 8
    default_remedy = "check the URL (the vLLM API server serves /metrics on its --port)"


class OutputNotWritable(LeaktraceError):
    exit_code = 9
    default_remedy = "choose another --out directory or fix its permissions"


class ClusterError(LeaktraceError):
    exit_code = 10
    default_remedy = "install the cluster extra: pip install 'leaktrace[cluster]' and check --address"


class TargetError(LeaktraceError):
    """A target could not be prepared (e.g. the demo workload failed to build)."""

    exit_code = 11


class TargetBusy(LeaktraceError):
    """Another leaktrace is hunting this process (see leaktrace.targetlock)."""

    exit_code = 12


class SessionExists(LeaktraceError):
    """``--out`` already holds a session (or other files): never mixed, replaced only with --force."""

    exit_code = 13


class Interrupted(LeaktraceError):
    exit_code = 130
