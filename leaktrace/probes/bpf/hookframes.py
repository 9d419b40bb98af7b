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
walking the frames from the syscall up with the library's unwind tables (``.eh_frame``, read by
:func:`leaktrace.elf.unwind_table`) rather than by scanning: a scan can take a stale return address, left in
a frame's padding slot, for the caller (libucs's registration-cache chunks would be blamed on libpython).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from leaktrace.elf import unwind_table
from leaktrace.memclass import MEMORY_HOOK_LIBRARY
from leaktrace.probes.bpf.symbolizer import MapEntry

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


def _cfa_offset(m: MapEntry, addr: int) -> int | None:
    """The CFA's offset from %rsp at the call just before return address ``addr`` (in mapping ``m``); None
    when the file has no unwind rule there or keeps the CFA some other way (a frame pointer, an expression)."""
    table = unwind_table(m.path.removesuffix(" (deleted)"))
    if table is None:
        return None
    # - 1: inside the call instruction, where the row in force at the call applies
    rule = table.cfa_rule(table.file_offset_to_vaddr(addr - m.start + m.offset) - 1)
    return rule[1] if rule is not None and rule[0] == _RSP else None


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
