"""Can this machine trace? Each check says what it found and how to fix it. Pure data: the command renders."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from leaktrace.probes.bpf.checks import TRACEPOINTS, bpf_doctor_checks
from leaktrace.probes.gdb.checks import gdb_doctor_checks

CAP_SYS_PTRACE = 19
CAP_SYS_ADMIN = 21
CAP_PERFMON = 38
CAP_BPF = 39


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
    missing = [tp.split("/")[1] for tp in TRACEPOINTS if not os.path.isdir(f"{root}/events/{tp}")]
    if missing:
        return Check("syscall tracepoints", False, f"missing under {root}: {', '.join(missing)}",
                     "a kernel built with CONFIG_FTRACE_SYSCALLS is needed for the eBPF probe; use --no-bpf")
    return Check("syscall tracepoints", True, f"{root}/events/syscalls and sched present" + (f" ({done})" if done else ""))










def _family_checks(name: str, fn: Callable[[], list[dict[str, Any]]]) -> list[Check]:
    out = []
    try:
        for c in fn():
            out.append(Check(c["name"], bool(c["ok"]), str(c.get("detail", "")), str(c.get("fix", "")),
                             bool(c.get("required", False))))
    except Exception as e:  # a failing check is a finding, not a crash
        out.append(Check(name, False, f"check failed: {e.__class__.__name__}: {e}",
                         "run `leaktrace -v doctor` as root to see why", False))
    return out


def run_checks() -> list[Check]:
    # check_tracepoints first: as root it mounts tracefs where a fresh machine has none.
    checks = [check_privileges(), check_tracepoints()]
    # The eBPF layer's own checks (bcc module, libbcc, bpf(), tracepoints, pid namespace, BTF, headers or
    # the bundled stub), then the gdb sampler's (gdb, version, Python support, ptrace).
    checks += _family_checks("leaktrace.probes.bpf", bpf_doctor_checks)
    checks += _family_checks("leaktrace.probes.gdb", gdb_doctor_checks)
    return checks


def checks_as_dicts(checks: list[Check]) -> list[dict[str, Any]]:
    return [asdict(c) for c in checks]
