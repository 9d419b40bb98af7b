"""``leaktrace doctor``'s eBPF checks: BCC's Python module and libbcc, the bpf() syscall, the
tracepoints, the PID namespace, kernel BTF, the program's source, the kernel headers (or the stub tree)
bcc would compile with, and bpftrace (the benchmark's anchor). Each check is {name, ok, detail, fix}.
"""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
from pathlib import Path
from typing import Any

from leaktrace import resources
from leaktrace.probes.bpf.btf import kernel_member_offset
from leaktrace.probes.bpf.loader import (
    SYSV_TRACEPOINTS,
    choose_headers,
    find_bcc_dir,
    pid_namespace,
    stub_headers,
)

TRACEFS = [Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing")]
TRACEPOINTS = [  # what bpf/leaktrace.bpf.c attaches (mmap, mremap, brk, mprotect: at their exit only)
    "syscalls/sys_exit_mmap", "syscalls/sys_enter_munmap", "syscalls/sys_exit_mremap", "syscalls/sys_exit_brk",
    "syscalls/sys_exit_mprotect", "sched/sched_process_fork", "sched/sched_process_exec", "sched/sched_process_exit",
]


def _check(name: str, ok: bool, detail: str, fix: str = "") -> dict[str, Any]:
    return {"name": name, "ok": bool(ok), "detail": detail, "fix": "" if ok else fix}


def _bpf_syscall_works() -> tuple[bool, str]:
    # BPF_PROG_LOAD with an empty program is rejected by the verifier (EINVAL) when the syscall
    # exists and we may use it; EPERM means no privilege, ENOSYS no BPF at all.
    libc = ctypes.CDLL(None, use_errno=True)
    nr = {"x86_64": 321, "aarch64": 280}.get(platform.machine())
    if nr is None:
        return False, f"unknown bpf syscall number on {platform.machine()}"
    attr = (ctypes.c_char * 128)()
    ret = libc.syscall(nr, 5, attr, 128)  # BPF_PROG_LOAD
    err = ctypes.get_errno()
    if ret >= 0:
        os.close(ret)
        return True, "bpf() works"
    names = {1: "EPERM", 22: "EINVAL", 38: "ENOSYS", 7: "E2BIG"}
    ok = err in (22, 7)
    return ok, (f"bpf() is there and allowed (an empty test program is refused with {names.get(err, err)})" if ok
                else f"bpf(BPF_PROG_LOAD) -> {names.get(err, err)}")


def _exists(path: Path) -> bool:
    """Path.exists() that says False where a non-root user may not look (tracefs is root-only)."""
    try:
        return path.exists()
    except OSError:
        return False


def _readable_dir(path: Path) -> bool:
    return _exists(path) and os.access(path, os.R_OK | os.X_OK)


def bpf_doctor_checks() -> list[dict[str, Any]]:
    """Checks for ``leaktrace doctor``: each {name, ok, detail, fix}."""
    checks: list[dict[str, Any]] = []
    d = find_bcc_dir()
    checks.append(_check("bcc python module", d is not None, f"found at {d}" if d else "not found",
                         "apt-get install -y bpfcc-tools python3-bpfcc"))
    try:
        ctypes.CDLL("libbcc.so.0")
        checks.append(_check("libbcc", True, "libbcc.so.0 loads"))
    except OSError as e:
        checks.append(_check("libbcc", False, f"libbcc.so.0: {e}", "apt-get install -y libbpfcc"))
    ok, detail = _bpf_syscall_works()
    checks.append(_check("bpf syscall", ok, detail, "run as root (or grant CAP_BPF and CAP_PERFMON)"))
    tracefs = next((t for t in TRACEFS if _readable_dir(t / "events")), None)
    missing = [tp for tp in TRACEPOINTS if tracefs is None or not _exists(tracefs / "events" / tp / "id")]
    # optional: without them (no CONFIG_SYSVIPC) SysV segments are the watcher's alone (loader.sysv_defines)
    sysv = tracefs is not None and all(_exists(tracefs / "events" / "syscalls" / tp / "id") for tp in SYSV_TRACEPOINTS)
    checks.append(_check("syscall/sched tracepoints", tracefs is not None and not missing,
                         f"{len(TRACEPOINTS) - len(missing)}/{len(TRACEPOINTS)} present under {tracefs}"
                         + (f"; missing {', '.join(missing)}" if missing else "")
                         + ("; SysV shmat/shmdt traced" if sysv else "; no shmat/shmdt tracepoints: SysV shm "
                            "segments get no call site"),
                         "mount tracefs (mount -t tracefs nodev /sys/kernel/tracing); kernel needs "
                         "CONFIG_FTRACE_SYSCALLS"))
    ns = pid_namespace()
    checks.append(_check("pid namespace", ns is not None, ns.describe() if ns else "/proc/*/ns/pid unreadable",
                         "mount /proc (and run as root) so /proc/1/ns/pid can be read"))
    btf = Path("/sys/kernel/btf/vmlinux").exists()
    checks.append(_check("kernel BTF", btf, "/sys/kernel/btf/vmlinux" if btf else "absent",
                         "a kernel built with CONFIG_DEBUG_INFO_BTF (needed for bpf_task_pt_regs)"))
    off = kernel_member_offset("task_struct", "exit_code")
    oom = tracefs is not None and _exists(tracefs / "events" / "oom" / "mark_victim" / "id")
    checks.append(_check("how targets end", off is not None,
                         (f"task_struct.exit_code at offset {off} (kernel BTF)" if off is not None
                          else "task_struct.exit_code not found in the kernel BTF: exits are reported 'unknown'")
                         + ("; oom:mark_victim present" if oom else "; no oom:mark_victim: OOM kills read as SIGKILL"),
                         "a kernel built with CONFIG_DEBUG_INFO_BTF"))
    checks.append(resources.BPF.doctor_check("leaktrace BPF program", resources.BPF.located() / "leaktrace.bpf.c"))
    choice = choose_headers()
    stub_ok = (stub_headers() / "include" / "linux" / "kconfig.h").is_file()
    checks.append(_check("kernel headers for bcc", choice.kind == "real" or stub_ok,
                         f"{choice.kind}: {choice.detail}",
                         "apt-get install linux-headers-$(uname -r), or restore bpf/kheaders/"))
    checks.append(_check("bpftrace (benchmark anchor only)", shutil.which("bpftrace") is not None,
                         shutil.which("bpftrace") or "not installed", "apt-get install -y bpftrace"))
    return checks
