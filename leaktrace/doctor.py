"""Can this machine trace? Each check says what it found and how to fix it. Pure data: the command renders."""

from __future__ import annotations

import ctypes
import importlib
import os
import platform
import shutil
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

CAP_SYS_PTRACE = 19
CAP_SYS_ADMIN = 21
CAP_PERFMON = 38
CAP_BPF = 39
SYSCALL_EVENTS = ("sys_enter_mmap", "sys_exit_mmap", "sys_enter_munmap", "sys_enter_mremap", "sys_enter_brk")
SCHED_EVENTS = ("sched_process_fork", "sched_process_exec", "sched_process_exit")


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True


def _cap_eff() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def _has_cap(caps: int, bit: int) -> bool:
    return bool(caps >> bit & 1)


def check_privileges() -> Check:
    caps = _cap_eff()
    root = os.geteuid() == 0
    bpf = _has_cap(caps, CAP_BPF) or _has_cap(caps, CAP_SYS_ADMIN)
    detail = f"euid {os.geteuid()}; CAP_BPF {'yes' if _has_cap(caps, CAP_BPF) else 'no'}, " \
             f"CAP_SYS_ADMIN {'yes' if _has_cap(caps, CAP_SYS_ADMIN) else 'no'}, " \
             f"CAP_PERFMON {'yes' if _has_cap(caps, CAP_PERFMON) else 'no'}"
    return Check("root / CAP_BPF", root or bpf, detail,
                 "run as root (sudo), or in a privileged container / pod with CAP_BPF+CAP_PERFMON+CAP_SYS_PTRACE")


def check_bpf_syscall() -> Check:
    """Create (and close) a one-entry BPF array map: proves the bpf() syscall works for us."""
    nr_bpf = {"x86_64": 321, "aarch64": 280}.get(platform.machine())
    if nr_bpf is None:
        return Check("bpf() syscall", False, f"unknown syscall number on {platform.machine()}", "")
    libc = ctypes.CDLL(None, use_errno=True)
    # union bpf_attr for BPF_MAP_CREATE: map_type, key_size, value_size, max_entries (u32 each)
    attr = ctypes.create_string_buffer(struct.pack("IIII", 2, 4, 8, 1) + b"\0" * 112)
    fd = libc.syscall(nr_bpf, 0, attr, ctypes.sizeof(attr))
    if fd >= 0:
        os.close(fd)
        return Check("bpf() syscall", True, "BPF_MAP_CREATE works")
    err = ctypes.get_errno()
    unpriv = _read("/proc/sys/kernel/unprivileged_bpf_disabled")
    return Check("bpf() syscall", False, f"BPF_MAP_CREATE failed: {os.strerror(err)} "
                 f"(unprivileged_bpf_disabled={unpriv})", "run as root; in containers add CAP_BPF/CAP_SYS_ADMIN "
                 "and do not block bpf() in the seccomp profile")


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return "?"


def check_tracepoints() -> Check:
    from leaktrace.tracefs import ensure_mounted

    root, done = ensure_mounted()
    if root is None:
        return Check("syscall tracepoints", False, "tracefs not mounted or not readable",
                     "mount -t tracefs nodev /sys/kernel/tracing (and run as root)")
    missing = [e for e in SYSCALL_EVENTS if not os.path.isdir(f"{root}/events/syscalls/{e}")]
    missing += [e for e in SCHED_EVENTS if not os.path.isdir(f"{root}/events/sched/{e}")]
    if missing:
        return Check("syscall tracepoints", False, f"missing under {root}: {', '.join(missing)}",
                     "a kernel built with CONFIG_FTRACE_SYSCALLS is needed for the eBPF probe; use --no-bpf")
    return Check("syscall tracepoints", True, f"{root}/events/syscalls and sched present" + (f" ({done})" if done else ""))


def check_btf() -> Check:
    ok = os.path.exists("/sys/kernel/btf/vmlinux")
    return Check("BTF", ok, "/sys/kernel/btf/vmlinux present" if ok else "no /sys/kernel/btf/vmlinux",
                 "" if ok else "not needed by the BCC path (tracepoint formats come from tracefs)", required=False)


def check_kernel_headers() -> Check:
    build = Path(f"/lib/modules/{platform.release()}/build")
    ikheaders = Path("/sys/kernel/kheaders.tar.xz")
    if build.exists():
        return Check("kernel headers", True, f"{build} (BCC compiles against them)", required=False)
    if ikheaders.exists():
        return Check("kernel headers", True, "in-kernel headers (CONFIG_IKHEADERS)", required=False)
    return Check("kernel headers", True, "none installed: using leaktrace's bundled stub headers (bpf/kheaders); "
                 "tracepoint programs need nothing else", "apt-get install linux-headers-$(uname -r) (optional)",
                 required=False)


def check_gdb() -> Check:
    gdb = shutil.which("gdb")
    if not gdb:
        return Check("gdb", False, "gdb not on PATH", "apt-get install gdb (or hunt with --no-gdb)")
    return Check("gdb", True, gdb)


def check_ptrace() -> Check:
    scope = _read("/proc/sys/kernel/yama/ptrace_scope")
    caps = _cap_eff()
    can = os.geteuid() == 0 or _has_cap(caps, CAP_SYS_PTRACE)
    if scope == "3":
        return Check("ptrace", False, "kernel.yama.ptrace_scope=3 (ptrace disabled until reboot)",
                     "reboot with ptrace_scope<3, or hunt with --no-gdb")
    if scope in ("1", "2") and not can:
        return Check("ptrace", False, f"ptrace_scope={scope} and no CAP_SYS_PTRACE",
                     "run as root, or sysctl kernel.yama.ptrace_scope=0, or --no-gdb")
    return Check("ptrace", True, f"ptrace_scope={scope}; {'CAP_SYS_PTRACE' if can else 'same-uid only'}")


def _extra_checks(module: str, func: str) -> list[Check]:
    try:
        fn = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError):
        return []
    out = []
    try:
        for c in fn():
            out.append(Check(c["name"], bool(c["ok"]), str(c.get("detail", "")), str(c.get("fix", "")),
                             bool(c.get("required", False))))
    except Exception as e:  # noqa: BLE001 - a failing check is a finding, not a crash
        out.append(Check(f"{module}", False, f"check failed: {e.__class__.__name__}: {e}",
                         "run `leaktrace -v doctor` as root to see why", False))
    return out


def run_checks() -> list[Check]:
    # check_tracepoints first: as root it mounts tracefs where a fresh machine has none.
    checks = [check_privileges(), check_tracepoints()]
    # The eBPF layer's own checks (bcc module, libbcc, bpf(), tracepoints, pid namespace, BTF, headers or
    # the bundled stub); the generic ones when that layer is absent from this build.
    checks += _extra_checks("leaktrace.bccload", "bpf_doctor_checks") or [
        check_bpf_syscall(), check_btf(), check_kernel_headers()]
    # The gdb sampler's own checks (gdb, version, Python support, ptrace); the generic ones otherwise.
    checks += _extra_checks("leaktrace.probes.gdb", "gdb_doctor_checks") or [check_gdb(), check_ptrace()]
    return checks


def checks_as_dicts(checks: list[Check]) -> list[dict[str, Any]]:
    return [asdict(c) for c in checks]
