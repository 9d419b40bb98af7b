"""Where a memory hook's callers sit on the stack: the offsets the kernel half reads to blame an mmap made
through UCX's memory hook on the code that called mmap (bpf/leaktrace.h: struct lt_hook and what follows).

In bistro mode UCX's libucm patches libc's mmap & co., and every mmap of the process reaches the kernel from
libucm's raw-syscall trampoline (``ucm_orig_mmap_syscall``): the call site alone would name UCX for a worker's
own growth (malloc's chunks, Python's arenas, torch's tensors). Each path through the hook has fixed frames
for one build of the library, so offsets from the stack pointer at the syscall tell the cases apart:

* ``caller_off`` (per trampoline site): the trampoline's caller. Inside libucm, the hook is dispatching someone
  else's mmap. Outside libucm, UCX is mapping memory for itself (libucs's registration cache asking for its
  chunks): UCX's.
* ``dispatch_off`` (per dispatch path, keyed by that caller, checked by the hook's outermost return address
  at ``last_off``): the return address into the code that called the hooked function.

They are learned once per library build and path from one hooked call's stack window (LT_EV_HOOKWIN), by
walking the frames from the syscall up with the library's unwind tables (``.eh_frame``, decoded by
pyelftools) rather than by scanning: a scan can take a stale return address, left in a frame's padding
slot, for the caller (seen: 10 of 46 rcache chunks blamed on libpython that way).
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from leaktrace.elf import ElfSymbols, read_elf_symbols
from leaktrace.memclass import MEMORY_HOOK_LIBRARY
from leaktrace.probes.bpf.ledger import MapEntry

_RSP = 7  # DWARF register number of %rsp on x86_64
MAX_HOOK_FRAMES = 16  # frames walked inside the hook before giving up


@dataclass(frozen=True)
class HookWalk:
    """One hooked mmap's frames, walked from the syscall's stack pointer (offsets into its window)."""

    caller_off: int  # the trampoline's caller's return address ...
    caller: int  # ... and that address: inside the hook (a dispatched call) or not (UCX mapping for itself)
    dispatch_off: int | None = None  # dispatched: the return address into the code that called the hook ...
    dispatched_to: int = 0  # ... and that address
    last_off: int = 0  # the hook's outermost frame's return address (checked by the kernel) ...
    last_ret: int = 0  # ... and that address


class _UnwindTable:
    """The CFA rules of one file's ``.eh_frame``: FDEs are decoded on first use (a hook path needs four)."""

    def __init__(self, path: str) -> None:
        from elftools.elf.elffile import ELFFile  # pyelftools: imported only when a hook is seen

        with open(path, "rb") as f:
            self._elf = ELFFile(io.BytesIO(f.read()))
        dwarf = self._elf.get_dwarf_info(relocate_dwarf_sections=False)
        self._fdes = []
        if dwarf.has_EH_CFI():
            for entry in dwarf.EH_CFI_entries():
                header = getattr(entry, "header", None)
                if header is not None and "initial_location" in header:
                    lo = header["initial_location"]
                    self._fdes.append((lo, lo + header["address_range"], entry))
        self._rows: dict[int, list[tuple[int, int | None]]] = {}  # FDE index -> (pc, rsp offset or None)

    def cfa_rsp_offset(self, pc: int) -> int | None:
        """N where the canonical frame address at ``pc`` (a file vaddr) is ``%rsp + N``; None when ``pc``
        has no FDE or its CFA is kept some other way (a frame pointer, an expression)."""
        for i, (lo, hi, fde) in enumerate(self._fdes):
            if lo <= pc < hi:
                rows = self._rows.get(i)
                if rows is None:
                    rows = self._rows[i] = [
                        (row["pc"], row["cfa"].offset if row["cfa"].reg == _RSP and row["cfa"].expr is None
                         else None)
                        for row in fde.get_decoded().table]
                found = None
                for row_pc, off in rows:
                    if row_pc > pc:
                        break
                    found = (row_pc, off)
                return found[1] if found else None
        return None


@lru_cache(maxsize=16)
def _unwind_table(path: str, mtime_ns: int, size: int) -> _UnwindTable | None:
    try:
        return _UnwindTable(path)
    except Exception:  # noqa: BLE001 - no pyelftools, no .eh_frame, a file it cannot read: no layout
        return None


@lru_cache(maxsize=16)
def _segments(path: str, mtime_ns: int, size: int) -> ElfSymbols:
    return read_elf_symbols(path)


def _cfa_offset(m: MapEntry, addr: int) -> int | None:
    """The CFA's offset from %rsp at the call just before return address ``addr`` (in mapping ``m``)."""
    path = m.path.removesuffix(" (deleted)")
    try:
        st = os.stat(path)
    except OSError:
        return None
    table = _unwind_table(path, st.st_mtime_ns, st.st_size)
    if table is None:
        return None
    vaddr = _segments(path, st.st_mtime_ns, st.st_size).file_offset_to_vaddr(addr - m.start + m.offset)
    return table.cfa_rsp_offset(vaddr - 1)  # inside the call instruction: the row in force at the call


def walk_hook_frames(mapping_of: Callable[[int], MapEntry | None], window: bytes, site: int) -> HookWalk | None:
    """Walk one hooked mmap's window (raw stack from the syscall's stack pointer) through the hook's frames
    with their unwind rules. ``mapping_of(addr)`` gives the MapEntry of an address in the process. None when
    the frames cannot be walked (no unwind rule, the window too short, the site not the hook's)."""

    def word(off: int) -> int | None:
        return int.from_bytes(window[off:off + 8], "little") if off + 8 <= len(window) else None

    def in_hook(addr: int) -> MapEntry | None:
        m = mapping_of(addr)
        if m is None or "x" not in m.perms or not MEMORY_HOOK_LIBRARY.match(os.path.basename(m.path)):
            return None
        return m

    if word(0) != site or in_hook(site) is None:
        return None  # libc's syscall() keeps no frame: the word at the stack pointer is the site
    off, addr, last_off, frames = 0, site, 0, []
    for _ in range(MAX_HOOK_FRAMES):
        m = in_hook(addr)
        if m is None:
            break
        n = _cfa_offset(m, addr)
        nxt = word(off + n) if n is not None and n >= 8 else None
        if nxt is None:
            return None
        last_off, off, addr = off, off + n, nxt
        frames.append((off, addr))
    else:
        return None
    caller_off, caller = frames[0]
    if len(frames) == 1:
        return HookWalk(caller_off, caller)  # the trampoline was called from outside the hook: UCX's own
    return HookWalk(caller_off, caller, off, addr, last_off, word(last_off) or 0)


def hook_code(maps: list[MapEntry]) -> tuple[int, int, str] | None:
    """A memory-hook library's executable mapping (start, end, path) in a maps listing (UCX's libucm)."""
    for m in maps:
        if "x" in m.perms and MEMORY_HOOK_LIBRARY.match(os.path.basename(m.path)):
            return m.start, m.end, m.path
    return None
