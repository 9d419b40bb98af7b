"""The gdb sampler's checks: gdb present, its version and Python support, the sampler script, ptrace
permission (``leaktrace doctor``), and the preflight that stops a hunt when gdb cannot sample."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from typing import Any

from leaktrace import procfs, resources
from leaktrace.errors import AccessDenied, GdbUnavailable, NoSuchProcess

# The installed copy or the checkout's (leaktrace/resources.py). Never fails at import: when absent,
# gdb_doctor_checks reports it and preflight stops the hunt with its remedy.
SCRIPTS_DIR = resources.GDB_SCRIPTS.located()
SAMPLER_SCRIPT = SCRIPTS_DIR / "sampler.py"
SEED002_SCRIPT = SCRIPTS_DIR / "seed002_syscall_mmap.gdb"

CAP_SYS_PTRACE = 19
GDB_VERSION_TIMEOUT_S = 45  # `gdb --version` with its Python: well under 1 s idle, 20+ s seen under load


def find_gdb() -> str | None:
    return os.environ.get("LEAKTRACE_GDB") or shutil.which("gdb")


def has_cap_sys_ptrace() -> bool:
    return bool(procfs.status_int(procfs.read_self_status(), "CapEff", 16) >> CAP_SYS_PTRACE & 1)


def tracer_of(pid: int) -> int:
    """The pid tracing ``pid``; 0 when none, or when the process is gone or unreadable."""
    try:
        return procfs.status_int(procfs.read_status(pid), "TracerPid")
    except (NoSuchProcess, AccessDenied, OSError):
        return 0


def proc_state(pid: int) -> str | None:
    """The state letter of /proc/PID/stat (R, S, T, t, Z…); None when the process is gone or unreadable."""
    try:
        return str(procfs.read_stat(pid)["state"])
    except (NoSuchProcess, AccessDenied, OSError):
        return None


def gdb_environment() -> dict[str, str]:
    # gdb embeds the system Python: leaktrace's venv settings must not leak into it.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "PYTHONPATH", "PYTHONSTARTUP")}
    env["LC_ALL"] = "C"
    return env


def gdb_doctor_checks() -> list[dict[str, Any]]:
    """gdb present, its version, Python support, ptrace permission. Each: name, ok, detail, fix."""
    checks: list[dict[str, Any]] = []
    gdb = find_gdb()
    checks.append({"name": "gdb", "ok": gdb is not None, "detail": gdb or "gdb not found on PATH",
                   "fix": "" if gdb else "apt-get install gdb"})
    if gdb:
        try:
            out = subprocess.run([gdb, "-nx", "-batch", "-ex", "show version", "-ex",
                                  "python import sys; print('python', sys.version.split()[0])"],
                                 capture_output=True, text=True, timeout=GDB_VERSION_TIMEOUT_S, env=gdb_environment())
            first = out.stdout.splitlines()[0] if out.stdout else out.stderr.strip()[:120]
            m = re.search(r"(\d+)\.(\d+)", first)
            major = int(m.group(1)) if m else 0
            checks.append({"name": "gdb version", "ok": major >= 12, "detail": first,
                           "fix": "" if major >= 12 else "the sampler needs gdb ≥ 12 (gdb.format_address, "
                                                         "gdb_exiting): upgrade gdb"})
            py = re.search(r"^python (\S+)", out.stdout, re.M)
            checks.append({"name": "gdb python", "ok": py is not None,
                           "detail": f"gdb's Python {py.group(1)}" if py else "gdb was built without Python",
                           "fix": "" if py else "install a gdb built with Python (Debian's gdb package is)"})
        except subprocess.TimeoutExpired:
            # Slow, not broken: gdb loading its Python can take over 20 s beside a vLLM pair on 2 busy cores.
            # The sampler has its own time budget; a hunt is not refused for a loaded machine.
            checks.append({"name": "gdb version", "ok": True,
                           "detail": f"gdb did not answer within {GDB_VERSION_TIMEOUT_S} s (a loaded machine?): "
                                     "version not checked", "fix": ""})
        except OSError as e:
            checks.append({"name": "gdb version", "ok": False, "detail": f"gdb did not run: {e}",
                           "fix": "reinstall gdb"})
    checks.append(resources.GDB_SCRIPTS.doctor_check("gdb sampler script", SAMPLER_SCRIPT))
    scope = procfs.read_sysctl("kernel/yama/ptrace_scope")
    privileged = os.geteuid() == 0 or has_cap_sys_ptrace()
    if scope is None:
        ok, detail = True, "no Yama LSM: classic ptrace permissions (same uid, or CAP_SYS_PTRACE)"
    elif scope == "3":
        ok, detail = False, "kernel.yama.ptrace_scope=3: no process may attach"
    elif scope in ("1", "2") and not privileged:
        ok, detail = False, f"kernel.yama.ptrace_scope={scope} and no CAP_SYS_PTRACE: cannot attach"
    else:
        ok, detail = True, f"kernel.yama.ptrace_scope={scope}" + (" (privileged)" if privileged else "")
    checks.append({"name": "ptrace", "ok": ok, "detail": detail,
                   "fix": "" if ok else "run as root / with CAP_SYS_PTRACE, or sysctl kernel.yama.ptrace_scope=1 "
                                        "(3 needs a reboot)"})
    return checks


def preflight(pids: list[int]) -> None:
    """Raise GdbUnavailable with one line when gdb cannot sample these processes."""
    if platform.machine() != "x86_64":
        raise GdbUnavailable(f"gdb sampler supports x86-64 only (this is {platform.machine()})",
                             "pass --gdb-samples 0 or --no-gdb")
    for check in gdb_doctor_checks():
        if not check["ok"]:
            raise GdbUnavailable(f"gdb sampler unavailable: {check['detail']}",
                                 f"{check['fix']}; or pass --gdb-samples 0 or --no-gdb")
    privileged = os.geteuid() == 0 or has_cap_sys_ptrace()
    for pid in pids:
        tracer = tracer_of(pid)
        if tracer:
            raise GdbUnavailable(f"ptrace not permitted: pid {pid} is already traced by pid {tracer}",
                                 "detach the other debugger/tracer, or pass --gdb-samples 0 or --no-gdb")
        try:
            uid = procfs.read_owner_uid(pid)
        except (NoSuchProcess, AccessDenied, OSError):
            continue
        if not privileged and uid != os.geteuid():
            raise GdbUnavailable(f"ptrace not permitted: pid {pid} belongs to uid {uid}",
                                 "run as root or with CAP_SYS_PTRACE, or pass --gdb-samples 0 or --no-gdb")
