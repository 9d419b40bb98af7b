"""One hunt per target: a second ``hunt`` on a process another leaktrace is hunting is refused.

Two hunts on one process would both stop it under gdb (ptrace admits one tracer: the second sampler
fails mid-hunt) and double the eBPF overhead it pays, for two reports of the same figures. Each hunt
takes an exclusive ``flock`` per target process, keyed by pid, start time (a reused pid is another
process) and pid namespace. The kernel drops a flock when its holder dies, SIGKILL included, so no
stale lock outlives a killed hunt; the lock file keeps who holds it, for the message. Only the roots
given to ``hunt`` are locked (a hunt on a child of a hunted tree is not refused).
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from leaktrace import procfs
from leaktrace.errors import LeaktraceError, TargetBusy

LOCK_DIRS = (os.environ.get("LEAKTRACE_LOCK_DIR") or "/run/leaktrace", "/tmp/leaktrace-locks")


def _lock_dir() -> Path:
    for d in LOCK_DIRS:
        try:
            Path(d).mkdir(mode=0o1777, parents=True, exist_ok=True)
            if os.access(d, os.W_OK):
                return Path(d)
        except OSError:
            continue
    raise TargetBusy(
        f"no writable lock directory among {', '.join(LOCK_DIRS)}",
        "set LEAKTRACE_LOCK_DIR to a writable directory",
    )


class TargetLocks:
    """Held for the whole hunt; ``release()`` (or the process's death) frees them."""

    def __init__(self) -> None:
        self._files: list[tuple[int, Path]] = []

    def acquire(self, pids: list[int], out: str) -> None:
        d = _lock_dir()
        try:
            for pid in pids:
                try:
                    start = procfs.read_stat(pid)["starttime"]
                except LeaktraceError:
                    continue  # gone: run_hunt says so
                path = d / f"pid-{pid}-{start}{_pidns_suffix(pid)}.lock"
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = _read_holder(fd)
                    os.close(fd)
                    raise TargetBusy(
                        f"pid {pid} is already being hunted by leaktrace pid {holder.get('pid', '?')} "
                        f"(session {holder.get('out', '?')})",
                        "wait for that hunt to finish or stop it; one hunt per process",
                    ) from None
                os.ftruncate(fd, 0)
                os.write(fd, json.dumps({"pid": os.getpid(), "out": str(Path(out).resolve())}).encode())
                self._files.append((fd, path))
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        # The files stay (a few bytes each, keyed by start time so never reused, in /run: gone at
        # reboot): unlinking a lock file races with a hunt that opened it a moment before.
        for fd, _path in self._files:
            os.close(fd)
        self._files = []


def _pidns_suffix(pid: int) -> str:
    """The pid namespace's inode: pids and start times of processes in sibling namespaces (containers,
    per-node namespaces of a cluster test) can coincide, the namespace cannot."""
    try:
        return "-ns" + os.readlink(f"{procfs.PROC}/{pid}/ns/pid").strip("pid:[]")
    except OSError:
        return ""


def _read_holder(fd: int) -> dict:
    try:
        return json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
