"""Typed errors. Each carries what failed, what to do about it, and a distinct exit code.

The CLI prints ``str(err)`` as one line (no traceback unless -v) and exits with ``err.exit_code``.
"""

from __future__ import annotations


class LeaktraceError(Exception):
    """The base of every error leaktrace reports. A subclass states its exit code and its default remedy (shown
    when the raise names none) in its class statement, ``class X(LeaktraceError, exit_code=5, remedy="...")``,
    so that each error's contract stands on one line; class attributes of the same names work too."""

    exit_code = 1
    default_remedy = ""

    def __init_subclass__(cls, exit_code: int | None = None, remedy: str | None = None, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if exit_code is not None:
            cls.exit_code = exit_code
        if remedy is not None:
            cls.default_remedy = remedy

    def __init__(self, message: str, remedy: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.remedy = remedy if remedy is not None else self.default_remedy

    def __str__(self) -> str:
        if self.remedy:
            return f"{self.message} — {self.remedy}"
        return self.message


class UsageError(LeaktraceError, exit_code=2):
    """Options that contradict each other or ask for what cannot be had (e.g. a --prometheus-port in use)."""


class NoSuchProcess(LeaktraceError, exit_code=3, remedy="check the PID with `leaktrace ps`"):
    """The PID does not exist (at start) or vanished between two reads."""

    def __init__(self, pid: int, message: str | None = None, remedy: str | None = None) -> None:
        super().__init__(message or f"no such process: {pid}", remedy)
        self.pid = pid


class ProcessGone(NoSuchProcess):
    """A process that existed went away while we were reading it (a race, not a user error)."""

    def __init__(self, pid: int, what: str = "") -> None:
        super().__init__(pid, f"process {pid} exited" + (f" while reading {what}" if what else ""))


class AccessDenied(LeaktraceError, exit_code=4, remedy="run as root (sudo) or with CAP_SYS_PTRACE"):
    """A /proc file (or another source) of a process may not be read by this user."""

    def __init__(self, pid: int | None, what: str, remedy: str | None = None) -> None:
        msg = f"permission denied reading {what}" + (f" of pid {pid}" if pid is not None and str(pid) not in what else "")
        super().__init__(msg, remedy)
        self.pid = pid


class BpfUnavailable(LeaktraceError, exit_code=5,
                     remedy="run as root, install bpfcc (`apt-get install python3-bpfcc`), or pass --no-bpf"):
    """The eBPF probe cannot run here (no privilege, no BCC, or the kernel refused the program)."""


class GdbUnavailable(LeaktraceError, exit_code=6,
                     remedy="install gdb (`apt-get install gdb`), allow ptrace (kernel.yama.ptrace_scope), "
                            "or pass --no-gdb"):
    """The gdb sampler cannot run on this target (no gdb, ptrace not permitted, not x86-64)."""


class SessionError(LeaktraceError, exit_code=7, remedy="point at a directory written by `leaktrace hunt`"):
    """Missing, unreadable or corrupt session directory."""


class MetricsUnreachable(LeaktraceError, exit_code=8,
                         remedy="check the URL (the vLLM API server serves /metrics on its --port)"):
    """A vLLM /metrics URL did not answer."""


class OutputNotWritable(LeaktraceError, exit_code=9, remedy="choose another --out directory or fix its permissions"):
    """The output directory cannot be created, read or written."""


class ClusterError(LeaktraceError, exit_code=10,
                   remedy="install the cluster extra: pip install 'leaktrace[cluster]' and check --address"):
    """A cluster hunt cannot start or go on (no Ray, no head at the address, no alive node)."""


class TargetError(LeaktraceError, exit_code=11):
    """A target could not be prepared (e.g. the demo workload failed to build)."""


class TargetBusy(LeaktraceError, exit_code=12):
    """Another leaktrace is hunting this process (see leaktrace.targetlock)."""


class SessionExists(LeaktraceError, exit_code=13):
    """``--out`` already holds a session (or other files): never mixed, replaced only with --force."""
