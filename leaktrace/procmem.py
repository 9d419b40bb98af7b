"""Live process memory, read without stopping the process.

:class:`ProcMem` reads another process's memory through ``/proc/PID/mem`` (no ptrace stop: reading
another process's memory as root, or as its tracer-capable owner, does not pause it). :func:`load_bias`
places a mapped ELF file, so ``bias + st_value`` (from :mod:`leaktrace.elf`) is where a symbol lives.

:func:`read_live_environ` reads the environment a process sees *now*: libc's ``__environ`` array.
``os.environ`` changes made in-process (vLLM and NIXL set UCX_* that way) call ``putenv`` and update that
array, while ``/proc/PID/environ`` still shows the launch environment (and is all NUL after setproctitle).
"""

from __future__ import annotations

import os
import re
import struct

from leaktrace import procfs
from leaktrace.elf import elf_info, first_load_vaddr
from leaktrace.errors import AccessDenied, ProcessGone

LIBC_RE = re.compile(r"(^|/)libc(\.so\.6|-[0-9.]+\.so)$")


class ProcMem:
    """Reads another process's memory through /proc/PID/mem (pread; the target keeps running); ``writable``
    also writes it (pwrite, as a debugger puts code back)."""

    def __init__(self, pid: int, writable: bool = False) -> None:
        self.pid = pid
        try:
            self.fd = os.open(f"{procfs.PROC}/{pid}/mem", os.O_RDWR if writable else os.O_RDONLY)
        except (FileNotFoundError, ProcessLookupError) as e:
            raise ProcessGone(pid, "mem") from e
        except PermissionError as e:
            raise AccessDenied(pid, f"/proc/{pid}/mem") from e

    def read(self, addr: int, size: int) -> bytes | None:
        try:
            return os.pread(self.fd, size, addr)
        except (OSError, OverflowError):
            return None  # unmapped (or past the address space), or the process went away between two reads

    def write(self, addr: int, data: bytes) -> int:
        """Bytes written at ``addr`` (0 when it cannot be written)."""
        try:
            return os.pwrite(self.fd, data, addr)
        except (OSError, OverflowError):
            return 0

    def read_ptr(self, addr: int) -> int | None:
        b = self.read(addr, 8)
        return struct.unpack("<Q", b)[0] if b and len(b) == 8 else None

    def read_cstr(self, addr: int, limit: int = 8192) -> bytes | None:
        out = b""
        while len(out) < limit:
            chunk = self.read(addr + len(out), 256)
            if not chunk:
                return out or None
            i = chunk.find(b"\0")
            if i >= 0:
                return out + chunk[:i]
            out += chunk
        return out

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> ProcMem:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_bytes(pid: int, addr: int, size: int) -> bytes:
    """``size`` bytes of a live process at ``addr`` in one read: b"" when they cannot be read (unmapped, the
    process gone, not ours to read)."""
    try:
        with ProcMem(pid) as mem:
            return mem.read(addr, size) or b""
    except (ProcessGone, AccessDenied):
        return b""


def load_bias(maps: list[procfs.Mapping], path: str) -> int | None:
    """Where ``path`` is loaded: start of its offset-0 mapping minus its first PT_LOAD vaddr."""
    for m in maps:
        if m.path == path and m.offset == 0:
            try:
                return m.start - first_load_vaddr(path)
            except (OSError, ValueError):
                return None
    return None


def lib_path(maps: list[procfs.Mapping], regex: re.Pattern[str]) -> str | None:
    for m in maps:
        if m.path and regex.search(m.path) and os.path.exists(m.path):
            return m.path
    return None


def mapping_at(maps: list[procfs.Mapping], addr: int) -> procfs.Mapping | None:
    for m in maps:
        if m.start <= addr < m.end:
            return m
    return None


# ----------------------------------------------------------------------------- live environ

def read_live_environ(pid: int, maps: list[procfs.Mapping] | None = None, mem: ProcMem | None = None,
                      max_entries: int = 20000) -> dict[str, str] | None:
    """The environment a process sees *now* (libc's ``__environ`` array), unredacted — callers keep only
    the keys they need. None when libc is not mapped (static binary) or the memory cannot be read."""
    maps = maps if maps is not None else procfs.read_maps(pid)
    libc = lib_path(maps, LIBC_RE)
    if not libc:
        return None
    bias = load_bias(maps, libc)
    sym = elf_info(libc).symbols.get("__environ") or elf_info(libc).symbols.get("environ")
    if bias is None or not sym:
        return None
    own = mem is None
    mem = mem or ProcMem(pid)
    try:
        arr = mem.read_ptr(bias + sym[0])
        if not arr:
            return None
        env: dict[str, str] = {}
        raw = mem.read(arr, 8 * 512) or b""
        i = 0
        while i < max_entries:
            if (i + 1) * 8 > len(raw):
                more = mem.read(arr + len(raw), 8 * 512)
                if not more:
                    break
                raw += more
            (ptr,) = struct.unpack_from("<Q", raw, i * 8)
            if ptr == 0:
                break
            s = mem.read_cstr(ptr)
            if s and b"=" in s:
                k, _, v = s.partition(b"=")
                env.setdefault(k.decode("utf-8", "replace"), v.decode("utf-8", "replace"))
            i += 1
        return env
    finally:
        if own:
            mem.close()
