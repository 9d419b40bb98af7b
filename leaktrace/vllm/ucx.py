"""Effective UCX state of a live process, read without stopping it.

Three questions decide whether a process can show the seed-002 leak (UCX memory hooks queueing an
invalidation entry per munmap in the registration cache, storage never returned):

* **Are UCX memory hooks active?** In "bistro" mode UCX patches the first bytes of libc's ``mmap``,
  ``munmap``, ``mremap``, ``madvise``, ``brk`` with a jump into ``libucm``. We read those bytes from
  ``/proc/PID/mem`` (no ptrace stop: reading another process's memory as root, or as its tracer-capable
  owner, does not pause it) and decode the jump target.
* **Which hook mode does UCM run with?** ``ucm_global_opts`` is an exported data symbol of libucm holding the
  parsed ``UCX_MEM_MMAP_HOOK_MODE``: the effective value, whatever the environment said.
* **Which ``UCX_RCACHE_MAX_UNRELEASED`` / ``UCX_RCACHE_ENABLE``?** These are parsed into each UCP context;
  there is no exported global. vLLM (``nixl_utils.py``) and NIXL set them in-process with ``os.environ``,
  which calls ``putenv`` and so updates libc's ``environ`` array, while ``/proc/PID/environ`` still shows
  the launch environment (and is all NUL after setproctitle). So we read the live environment from
  libc's ``__environ`` in process memory, falling back to ``/proc/PID/environ``, then to UCX's defaults.

Every value carries where it came from (``sources``).
"""

from __future__ import annotations

import functools
import os
import re
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from leaktrace import procfs
from leaktrace.elf import elf_info
from leaktrace.errors import AccessDenied
from leaktrace.procmem import LIBC_RE, ProcMem, lib_path, load_bias, mapping_at, read_live_environ

UCX_LIB_RE = re.compile(r"(^|/)libuc[pmst](-[0-9a-f]{8})?\.so")
UCM_LIB_RE = re.compile(r"(^|/)libucm(-[0-9a-f]{8})?\.so")
UCP_LIB_RE = re.compile(r"(^|/)libucp(-[0-9a-f]{8})?\.so")

HOOKED_FUNCTIONS = ("mmap", "munmap", "mremap", "madvise", "brk")
HOOK_MODES = {0: "none", 1: "reloc", 2: "bistro"}
UCX_DEFAULTS = {"UCX_MEM_MMAP_HOOK_MODE": "bistro", "UCX_RCACHE_MAX_UNRELEASED": "inf",
                "UCX_RCACHE_ENABLE": "try"}
# UCX 1.21 made the invalidation queue an interval tree (#11248): overlapping munmaps then merge, but
# disjoint ones still cost one entry each until the queue is drained (measured with UCX 1.23).

SRC_UCM = "ucm_global_opts in libucm memory (parsed, effective)"
SRC_LIVE_ENV = "live environ (libc __environ in process memory)"
SRC_LAUNCH_ENV = "launch environ (/proc/PID/environ)"
SRC_DEFAULT = "UCX default (not set)"


# ----------------------------------------------------------------------------- memory hooks

def decode_jump(code: bytes, at: int) -> int | None:
    """Target of a patch at a function entry: ``jmp rel32``, ``movabs r11/rax; jmp *reg``, or
    ``jmp *[rip+d]`` (the target pointer is returned as a negative address to read, see caller)."""
    if len(code) >= 5 and code[0] == 0xE9:
        return (at + 5 + struct.unpack_from("<i", code, 1)[0]) & 0xFFFFFFFFFFFFFFFF
    if len(code) >= 13 and code[0] == 0x49 and code[1] == 0xBB and code[10:13] == b"\x41\xff\xe3":
        return struct.unpack_from("<Q", code, 2)[0]  # movabs $addr,%r11; jmp *%r11 (bistro far jump)
    if len(code) >= 12 and code[0] == 0x48 and code[1] == 0xB8 and code[10:12] == b"\xff\xe0":
        return struct.unpack_from("<Q", code, 2)[0]  # movabs $addr,%rax; jmp *%rax
    return None


# ----------------------------------------------------------------------------- the state

@dataclass
class UcxConfig:
    pid: int
    ucx_libs: list[str] = field(default_factory=list)  # file names as mapped (hashed ones included)
    ucx_version: str | None = None
    hooks_active: bool | None = None  # None: UCX not mapped or libc unreadable
    hooked_functions: dict[str, str] = field(default_factory=dict)  # libc function -> "lib!symbol"
    hook_mode: str | None = None
    rcache_max_unreleased: str | None = None
    rcache_enable: str | None = None
    sources: dict[str, str] = field(default_factory=dict)  # UCX_* key -> where its value came from
    launch_values: dict[str, str] = field(default_factory=dict)  # what /proc/PID/environ said, if differing
    errors: list[str] = field(default_factory=list)

    @property
    def ucx_loaded(self) -> bool:
        return bool(self.ucx_libs)

    @property
    def leak_prone(self) -> bool:
        """Hooks on, cache on and an unbounded invalidation queue: each munmap may cost ~150 B for good."""
        if not self.hooks_active:
            return False
        if (self.rcache_enable or "try").lower() in ("n", "no", "0", "off", "false"):
            return False
        return (self.rcache_max_unreleased or "inf").lower() in ("inf", "infinity", "auto")

    def remedy(self) -> str:
        shown = (f"effective UCX_MEM_MMAP_HOOK_MODE={self.hook_mode}, "
                 f"UCX_RCACHE_MAX_UNRELEASED={self.rcache_max_unreleased}, UCX_RCACHE_ENABLE={self.rcache_enable}")
        return (f"{shown}: start the process with UCX_RCACHE_MAX_UNRELEASED=1024 (bounds the invalidation "
                "queue; vLLM >= 0.33 sets it unless already set) or UCX_MEM_MMAP_HOOK_MODE=none "
                "(no memory hooks; fine when one large KV region is registered up front)")

    def as_row(self, t: float | None = None) -> dict[str, Any]:
        """Flat row for the session's ``ucx_state`` table."""
        row: dict[str, Any] = {
            "pid": self.pid,
            "ucx_loaded": self.ucx_loaded,
            "ucx_version": self.ucx_version,
            "hooks_active": self.hooks_active,
            "hooked_functions": ",".join(f"{k}->{v}" for k, v in sorted(self.hooked_functions.items())),
            "hook_mode": self.hook_mode,
            "rcache_max_unreleased": self.rcache_max_unreleased,
            "rcache_enable": self.rcache_enable,
            "hook_mode_source": self.sources.get("UCX_MEM_MMAP_HOOK_MODE"),
            "rcache_max_unreleased_source": self.sources.get("UCX_RCACHE_MAX_UNRELEASED"),
            "rcache_enable_source": self.sources.get("UCX_RCACHE_ENABLE"),
            "ucx_libs": ",".join(self.ucx_libs),
            "leak_prone": self.leak_prone,
            "remedy": self.remedy() if self.leak_prone else "",
            "errors": "; ".join(self.errors),
        }
        if t is not None:
            row["t"] = t
        return row

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["leak_prone"] = self.leak_prone
        return d


def _version_near(path: str) -> str | None:
    """UCX version of a mapped libucp: the wheel's dist-info beside it, else the version string inside.
    Cached per file and modification time: the ucx probe asks again for every process every few ticks,
    and without a dist-info (nixl's wheels) the answer means reading the whole library."""
    try:
        mtime_ns = os.stat(path).st_mtime_ns
    except OSError:
        mtime_ns = 0
    return _version_near_cached(path, mtime_ns)


@functools.lru_cache(maxsize=64)
def _version_near_cached(path: str, _mtime_ns: int) -> str | None:
    p = Path(path)
    for parent in list(p.parents)[:4]:
        for di in parent.glob("libucx*-*.dist-info"):
            m = re.match(r"libucx[\w]*-([\d.]+)\.dist-info", di.name)
            if m:
                return m.group(1)
    try:
        data = p.read_bytes()
    except OSError:
        return None
    # libucp keeps its "MAJOR.MINOR.PATCH" string in .rodata (used by ucp_get_version_string).
    m = re.search(rb"[^0-9.](1\.[1-9][0-9]\.[0-9]{1,2})\x00", data)
    return m.group(1).decode() if m else None


def read_ucx_config(pid: int, ancestor_env: dict[str, str] | None = None,
                    ancestor_pid: int | None = None, maps: list[procfs.Mapping] | None = None) -> UcxConfig:
    """Effective UCX state of ``pid``. ``ancestor_env`` (with ``ancestor_pid``) is the launch environment of
    an untitled ancestor, used when this process's own environment cannot be read at all. ``maps``: its
    mappings when the caller has just read them (thousands in a vLLM process: their parse is the cost)."""
    cfg = UcxConfig(pid=pid)
    maps = procfs.read_maps(pid) if maps is None else maps
    libs = []
    for m in maps:
        name = os.path.basename(m.path) if m.path else ""
        if name and UCX_LIB_RE.search(name) and name not in libs:
            libs.append(name)
    cfg.ucx_libs = libs
    ucp = lib_path(maps, UCP_LIB_RE)
    if ucp:
        cfg.ucx_version = _version_near(ucp)

    try:
        mem = ProcMem(pid)
    except AccessDenied as e:
        cfg.errors.append(str(e))
        mem = None
    try:
        live_env = None
        if mem is not None:
            live_env = read_live_environ(pid, maps, mem)
            if live_env is None:
                cfg.errors.append("libc environ not readable (static binary?)")
            if ucp:
                _read_hooks(cfg, maps, mem)
        try:
            launch_env = procfs.read_environ(pid, redact=False)
        except AccessDenied:
            launch_env = {}

        for key, attr in (("UCX_MEM_MMAP_HOOK_MODE", "hook_mode"),
                          ("UCX_RCACHE_MAX_UNRELEASED", "rcache_max_unreleased"),
                          ("UCX_RCACHE_ENABLE", "rcache_enable")):
            if getattr(cfg, attr) is not None:
                continue  # already read from UCX's own parsed state
            if live_env is not None and key in live_env:
                val, src = live_env[key], SRC_LIVE_ENV
            elif live_env is None and key in launch_env:
                val, src = launch_env[key], SRC_LAUNCH_ENV
            elif live_env is None and not launch_env and ancestor_env and key in ancestor_env:
                val, src = ancestor_env[key], f"launch environ of untitled ancestor {ancestor_pid}"
            else:
                val, src = UCX_DEFAULTS[key], SRC_DEFAULT
            setattr(cfg, attr, val)
            cfg.sources[key] = src
            if key in launch_env and launch_env[key] != val:
                cfg.launch_values[key] = launch_env[key]
        if cfg.hook_mode and "UCX_MEM_MMAP_HOOK_MODE" in launch_env \
                and launch_env["UCX_MEM_MMAP_HOOK_MODE"] != cfg.hook_mode:
            cfg.launch_values["UCX_MEM_MMAP_HOOK_MODE"] = launch_env["UCX_MEM_MMAP_HOOK_MODE"]
    finally:
        if mem is not None:
            mem.close()
    return cfg


def _read_hooks(cfg: UcxConfig, maps: list[procfs.Mapping], mem: ProcMem) -> None:
    libc = lib_path(maps, LIBC_RE)
    ucm = lib_path(maps, UCM_LIB_RE)
    if ucm:
        bias = load_bias(maps, ucm)
        try:
            sym = elf_info(ucm).symbols.get("ucm_global_opts")
        except (OSError, ValueError):
            sym = None
        if bias is not None and sym:
            # ucm_global_config_t starts {log_level, enable_events, mmap_hook_mode, ...}: three ints.
            raw = mem.read(bias + sym[0], 12)
            if raw and len(raw) == 12:
                _log, _events, mode = struct.unpack("<iii", raw)
                cfg.hook_mode = HOOK_MODES.get(mode, f"unknown({mode})")
                cfg.sources["UCX_MEM_MMAP_HOOK_MODE"] = SRC_UCM
    if not libc:
        return
    bias = load_bias(maps, libc)
    if bias is None:
        return
    syms = elf_info(libc).symbols
    ucm_syms: dict[int, str] = {}
    if ucm:
        ucm_bias = load_bias(maps, ucm)
        if ucm_bias is not None:
            ucm_syms = {ucm_bias + v: n for n, (v, _s) in elf_info(ucm).symbols.items()}
    patched: dict[str, str] = {}
    readable = False
    for fn in HOOKED_FUNCTIONS:
        sym = syms.get(fn) or syms.get("__" + fn)
        if not sym:
            continue
        at = bias + sym[0]
        code = mem.read(at, 16)
        if not code:
            continue
        readable = True
        target = decode_jump(code, at)
        if target is None:
            continue
        tm = mapping_at(maps, target)
        if tm is None or tm.path == libc:
            continue  # a jump inside libc is libc's own code, not a patch
        lib = os.path.basename(tm.path) if tm.path else "anon"
        patched[fn] = f"{lib}!{ucm_syms.get(target, hex(target))}"
    cfg.hooked_functions = patched
    if readable:
        cfg.hooks_active = any(UCM_LIB_RE.search(v.split("!")[0]) for v in patched.values())
