"""Find and load BCC (Debian's python3-bpfcc) from any Python, with or without kernel headers.

The ``bcc`` module is pure Python over ``libbcc.so.0`` and lives in ``/usr/lib/python3/dist-packages``.
The project's virtual environment does not see that directory, and putting all of it on ``sys.path``
would shadow the venv's own packages with Debian's, so only the ``bcc`` package is imported, by path.
(The PyPI package named ``bcc`` is an unrelated library: never installed, never imported.)

BCC compiles at run time and needs a kernel-header tree. Real headers are used when the machine has
them; otherwise ``BCC_KERNEL_SOURCE`` points at the stub tree in ``bpf/kheaders`` (enough for
tracepoint programs, whose argument layouts come from tracefs). The doctor's check (:mod:`.checks`)
reports which path is taken. ``bpf/`` is found by :mod:`leaktrace.resources` (installed copy or checkout).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import platform
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from leaktrace import resources
from leaktrace.errors import BpfUnavailable
from leaktrace.probes.bpf.compiler_memory import release_compiler_memory

BCC_DIRS = [
    Path("/usr/lib/python3/dist-packages/bcc"),
    Path("/usr/lib/python3/site-packages/bcc"),
    Path("/usr/share/bcc/python/bcc"),
]
# struct pt_regs offsets of the user ip and sp saved at syscall entry, per architecture.
REGS_OFFSETS = {"x86_64": (128, 152)}

_bcc: ModuleType | None = None


def bpf_dir() -> Path:
    """bpf/ of this installation; BpfUnavailable when absent, so the hunt's message offers --no-bpf."""
    try:
        return resources.bpf_dir()
    except resources.ResourceMissing as e:
        raise BpfUnavailable(e.message, f"{e.remedy}; or pass --no-bpf") from e


def stub_headers() -> Path:
    # located(), not bpf_dir(): the doctor describes the header choice even when bpf/ is missing.
    return resources.BPF.located() / "kheaders"


@dataclass
class HeaderChoice:
    kind: str  # "real" | "stub"
    path: str
    detail: str


def find_bcc_dir() -> Path | None:
    override = os.environ.get("LEAKTRACE_BCC_DIR")
    for d in ([Path(override)] if override else []) + BCC_DIRS:
        if (d / "__init__.py").is_file():
            return d
    return None


def import_bcc() -> ModuleType:
    """Import Debian's ``bcc`` package by path (cached)."""
    global _bcc
    if _bcc is not None:
        return _bcc
    existing = sys.modules.get("bcc")
    if existing is not None and hasattr(existing, "BPF"):
        _bcc = existing
        return existing
    d = find_bcc_dir()
    if d is None:
        raise BpfUnavailable("BCC's Python module was not found (/usr/lib/python3/dist-packages/bcc)",
                             "install it: apt-get install -y bpfcc-tools python3-bpfcc, or pass --no-bpf")
    spec = importlib.util.spec_from_file_location("bcc", d / "__init__.py", submodule_search_locations=[str(d)])
    if spec is None or spec.loader is None:
        raise BpfUnavailable(f"cannot import bcc from {d}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bcc"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # libbcc.so missing, ABI mismatch: all mean "no BCC"
        sys.modules.pop("bcc", None)
        raise BpfUnavailable(f"bcc from {d} failed to import: {e}",
                             "reinstall: apt-get install --reinstall -y libbpfcc python3-bpfcc") from e
    _bcc = module
    return module


def real_header_dirs() -> list[Path]:
    rel = platform.release()
    cands = [Path(f"/lib/modules/{rel}/build"), Path(f"/lib/modules/{rel}/source"),
             Path(f"/usr/src/linux-headers-{rel}")]
    return [c for c in cands if (c / "include" / "linux" / "kconfig.h").is_file()]


def choose_headers() -> HeaderChoice:
    """Real kernel headers when present (or BCC_KERNEL_SOURCE set by the user), else the stub tree."""
    user = os.environ.get("BCC_KERNEL_SOURCE")
    stub = stub_headers()
    if user and not user.startswith(str(stub)):
        return HeaderChoice("real", user, f"BCC_KERNEL_SOURCE={user} (set by the user)")
    real = real_header_dirs()
    if real:
        return HeaderChoice("real", str(real[0]), f"kernel headers at {real[0]}")
    if Path("/sys/kernel/kheaders.tar.xz").exists():
        return HeaderChoice("real", "/sys/kernel/kheaders.tar.xz", "in-kernel headers (IKHEADERS)")
    return HeaderChoice("stub", str(stub), f"no kernel headers for {platform.release()}: bundled stub tree {stub}")


# The init PID namespace's inode number (PROC_PID_INIT_INO in include/linux/proc_ns.h): fixed by the kernel.
INIT_PIDNS_INO = 0xEFFFFFFC


@dataclass
class PidNamespace:
    """The PID namespace whose numbers leaktrace's /proc shows (targets, maps, the ledger's keys)."""

    dev: int  # the nsfs device, in the kernel's internal encoding (what bpf_get_ns_current_pid_tgid takes)
    ino: int
    source: str  # the nsfs file it was read from

    @property
    def is_init(self) -> bool:
        return self.ino == INIT_PIDNS_INO

    def defines(self) -> dict[str, int]:
        """Compile-time knobs of bpf/leaktrace.bpf.c: none in the init namespace (host pids, as the kernel)."""
        return {} if self.is_init else {"LT_PIDNS_DEV": self.dev, "LT_PIDNS_INO": self.ino}

    def describe(self) -> str:
        if self.is_init:
            return "init PID namespace: the kernel's pids are /proc's"
        return (f"PID namespace {self.ino} ({self.source}): pids translated in the kernel "
                "(bpf_get_ns_current_pid_tgid)")


def pid_namespace() -> PidNamespace | None:
    """The PID namespace of the mounted /proc (None when it cannot be read).

    Usually ours (a container, ``unshare --pid --mount-proc``): /proc/self then names us by our own pid.
    When it does not, /proc belongs to another namespace (the host's /proc seen from a child namespace):
    that of /proc's PID 1, whose pids are the ones leaktrace reads. (/proc/1/ns may be unreadable even to
    root, e.g. when PID 1 holds capabilities we lack.)"""
    try:
        ours = os.readlink("/proc/self") == str(os.getpid())
    except OSError:
        ours = False
    for path in ("/proc/self/ns/pid", "/proc/1/ns/pid") if ours else ("/proc/1/ns/pid",):
        try:
            st = os.stat(path)
        except OSError:
            continue
        # stat() encodes st_dev for user space; the kernel compares its internal MKDEV(major, minor).
        return PidNamespace((os.major(st.st_dev) << 20) | os.minor(st.st_dev), st.st_ino, path)
    return None


def compile_flags(include_dir: Path, extra: dict[str, int] | None = None) -> list[str]:
    ip_off, sp_off = REGS_OFFSETS.get(platform.machine(), REGS_OFFSETS["x86_64"])
    defs = {"LT_REGS_IP_OFF": ip_off, "LT_REGS_SP_OFF": sp_off, **(extra or {})}
    return [f"-I{include_dir}", "-Wno-macro-redefined"] + [f"-D{k}={v}" for k, v in defs.items()]


def exit_defines() -> dict[str, int]:
    """Knobs for how a process ended: the task_struct.exit_code offset (kernel BTF) and whether the kernel
    has the oom:mark_victim tracepoint (attaching a missing one would fail the whole program)."""
    from leaktrace.probes.bpf.btf import exit_code_defines
    from leaktrace.tracefs import mounted_root

    root = mounted_root()
    oom = root is not None and os.path.isdir(f"{root}/events/oom/mark_victim")
    return {**exit_code_defines(), **({"LT_OOM_TRACEPOINT": 1} if oom else {})}


SYSV_TRACEPOINTS = ("sys_exit_shmget", "sys_exit_shmat", "sys_enter_shmdt")  # syscalls/, optional


def sysv_defines() -> dict[str, int]:
    """``LT_SYSV_TRACEPOINTS`` when the kernel traces shmat/shmdt (CONFIG_SYSVIPC): attaching a missing
    tracepoint would fail the whole program, so without them SysV segments are left to the watcher."""
    from leaktrace.tracefs import mounted_root

    root = mounted_root()
    ok = root is not None and all(os.path.isdir(f"{root}/events/syscalls/{n}") for n in SYSV_TRACEPOINTS)
    return {"LT_SYSV_TRACEPOINTS": 1} if ok else {}


FAULT_TRACEPOINTS = ("page_fault_user", "page_fault_kernel")  # exceptions/


def fault_defines() -> dict[str, int]:
    """``LT_NO_FAULTS`` when the kernel lacks the page-fault tracepoints (attaching a missing one would fail the
    whole program): growth by touching pages is then left to the watcher, unnamed."""
    from leaktrace.tracefs import mounted_root

    root = mounted_root()
    ok = root is not None and all(os.path.isdir(f"{root}/events/exceptions/{n}") for n in FAULT_TRACEPOINTS)
    return {} if ok else {"LT_NO_FAULTS": 1}


def load_program(name: str = "leaktrace.bpf.c", defines: dict[str, int] | None = None) -> tuple[Any, HeaderChoice]:
    """Compile and load ``bpf/<name>`` with BCC. Raises :class:`BpfUnavailable` with a remedy."""
    if os.geteuid() != 0:
        raise BpfUnavailable("BPF tracing needs root (or CAP_BPF + CAP_PERFMON)")
    bcc = import_bcc()
    src_dir = bpf_dir()
    choice = choose_headers()
    if choice.kind == "stub":
        os.environ["BCC_KERNEL_SOURCE"] = choice.path
    src = src_dir / name
    if not src.is_file():
        raise BpfUnavailable(f"BPF program {src} is missing", f"{resources.BPF.remedy()}; or pass --no-bpf")
    try:
        prog = bcc.BPF(src_file=str(src).encode(), cflags=compile_flags(src_dir, {**exit_defines(), **sysv_defines(),
                                                                                 **fault_defines(), **(defines or {})}))
    except Exception as e:  # bcc raises bare Exception for compile/load failures
        raise BpfUnavailable(f"BPF program failed to load ({choice.kind} headers): {str(e).strip()[:300]}") from e
    return prog, choice


COMPILE_NICE = -10


class ProgramBuild:
    """The program compiled and loaded with the PID namespace's knobs: at once by :meth:`result`, or started in
    a background thread by :meth:`start` (BCC's compile runs in C++ without the GIL) and joined by
    :meth:`result`, which raises what the compile raised. ``started_at``: monotonic time the background
    compile began (else :meth:`result`'s call)."""

    def __init__(self, defines: dict[str, int]) -> None:
        self.defines = defines
        self.started_at = 0.0
        self.released_bytes = 0  # the compiler's memory given back after the load (compiler_memory.py)
        self._thread: threading.Thread | None = None
        self._result: tuple[Any, HeaderChoice, int | None, float] | BaseException | None = None

    def start(self) -> None:
        self.started_at = time.monotonic()
        self._thread = threading.Thread(target=self._in_background, name="bpf-compile", daemon=True)
        self._thread.start()

    def _in_background(self) -> None:
        # The compile and load take ~1 s of CPU; on a node whose cores serve, an even share with every busy
        # thread there stretches that to tens of seconds before tracing begins. This thread alone runs raised
        # (root may): the same second of CPU, taken sooner.
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), COMPILE_NICE)
        try:
            self._result = self._compile()
        except BaseException as e:  # raised again by result(), in the caller's thread
            self._result = e

    def _compile(self) -> tuple[Any, HeaderChoice, int | None, float]:
        """(program, header choice, PID namespace inode or None, seconds the compile and load took)."""
        t0 = time.monotonic()
        # Inside a PID namespace the kernel's pids are not /proc's: the program then translates them.
        ns = pid_namespace()
        pidns_ino = None if ns is None or ns.is_init else ns.ino
        prog, choice = load_program(defines={**self.defines, **(ns.defines() if ns else {})})
        self.released_bytes = release_compiler_memory()
        return prog, choice, pidns_ino, time.monotonic() - t0

    def result(self) -> tuple[Any, HeaderChoice, int | None, float]:
        if self._thread is None:
            self.started_at = time.monotonic()
            return self._compile()
        self._thread.join()
        self._thread = None
        got, self._result = self._result, None
        if isinstance(got, BaseException):
            raise got
        assert got is not None
        return got

    def cancel(self) -> None:
        """A program compiled in the background and never taken by :meth:`result` is unloaded."""
        if self._thread is None:
            return  # never started, or result() already took the program
        try:
            prog = self.result()[0]
        except Exception:  # nothing was loaded
            return
        prog.cleanup()
