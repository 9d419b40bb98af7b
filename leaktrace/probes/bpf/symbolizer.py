"""Addresses of the traced processes turned into ``library!symbol+0xoff``: :class:`Symbolizer` keeps a copy of
/proc/PID/maps per process (so it still works after the process exited) and reads the ELF symbol tables of the
mapped files (with :mod:`leaktrace.elf`)."""

from __future__ import annotations

import bisect
import itertools
import os
from collections.abc import Iterable
from dataclasses import dataclass

from leaktrace.elf import ElfSymbols, read_elf_symbols


@dataclass(frozen=True, slots=True)
class MapEntry:
    start: int
    end: int
    offset: int
    perms: str
    path: str


@dataclass(frozen=True, slots=True)
class Frame:
    addr: int
    library: str  # file name as mapped ("libfoo.so"), "[anon]", or "?"
    symbol: str  # "" when unknown (stripped)
    offset: int  # from the symbol, or from the file start when no symbol

    def __str__(self) -> str:
        if self.symbol:
            return f"{self.library}!{self.symbol}+{self.offset:#x}"
        if self.library in ("?", "[anon]"):
            return f"{self.library}@{self.addr:#x}"
        return f"{self.library}+{self.offset:#x}"


def _library_name(m: MapEntry) -> str:
    """A mapping's library as frames name it: the file name as mapped, or the pseudo-path / "[anon]"."""
    if not m.path or m.path.startswith("["):
        return m.path or "[anon]"
    return os.path.basename(m.path.removesuffix(" (deleted)"))


def merge_maps(kept: Iterable[MapEntry], entries: Iterable[MapEntry]) -> list[MapEntry]:
    """A new maps snapshot over a kept copy, sorted by start: every new entry, and the kept file mappings that
    no new entry overlaps. A worker's snapshot has thousands of entries, so the overlaps are found by bisecting
    the new entries' starts, not by comparing every pair."""
    new = sorted(entries, key=lambda m: m.start)
    if any(a.end > b.start for a, b in itertools.pairwise(new)):
        # Overlapping entries (never in one /proc snapshot): a later entry replaces the earlier ones it overlaps.
        merged: dict[int, MapEntry] = {m.start: m for m in kept if m.path}
        for m in new:
            for s in [s for s, o in merged.items() if o.start < m.end and m.start < o.end]:
                del merged[s]
            merged[m.start] = m
        return sorted(merged.values(), key=lambda m: m.start)
    starts = [m.start for m in new]
    out = {m.start: m for m in kept if m.path and not _overlaps_any(m, new, starts)}
    out.update((m.start, m) for m in new)
    return sorted(out.values(), key=lambda m: m.start)


def _overlaps_any(m: MapEntry, new: list[MapEntry], starts: list[int]) -> bool:
    """Whether ``m`` overlaps an entry of ``new`` (sorted, disjoint: the last one starting before ``m`` ends
    reaches furthest)."""
    i = bisect.bisect_left(starts, m.end) - 1
    return i >= 0 and new[i].end > m.start


class Symbolizer:
    """Addresses → frames, per process, from kept copies of /proc/PID/maps."""

    def __init__(self) -> None:
        self._maps: dict[int, list[MapEntry]] = {}
        self._starts: dict[int, list[int]] = {}
        self._elf: dict[str, ElfSymbols] = {}

    def set_maps(self, pid: int, entries: Iterable[MapEntry]) -> None:
        """Record a maps snapshot. Earlier file mappings that the new snapshot no longer shows are kept
        (a library unloaded or a process gone must still resolve addresses recorded before)."""
        ordered = merge_maps(self._maps.get(pid, []), entries)
        self._maps[pid] = ordered
        self._starts[pid] = [m.start for m in ordered]

    def copy_maps(self, src_pid: int, dst_pid: int) -> None:
        if src_pid in self._maps and dst_pid not in self._maps:
            self._maps[dst_pid] = list(self._maps[src_pid])
            self._starts[dst_pid] = list(self._starts[src_pid])

    def forget(self, pid: int) -> None:
        self._maps.pop(pid, None)
        self._starts.pop(pid, None)

    def has_maps(self, pid: int) -> bool:
        return pid in self._maps

    def entries(self, pid: int) -> list[MapEntry]:
        """The kept maps copy of ``pid``, sorted by start (a new list object after each change)."""
        return self._maps.get(pid, [])

    def mapping(self, pid: int, addr: int) -> MapEntry | None:
        starts = self._starts.get(pid)
        if not starts:
            return None
        i = bisect.bisect_right(starts, addr) - 1
        if i >= 0:
            m = self._maps[pid][i]
            if m.start <= addr < m.end:
                return m
        return None

    def knows(self, pid: int, addr: int) -> bool:
        return self.mapping(pid, addr) is not None

    def frame(self, pid: int, addr: int) -> Frame:
        m = self.mapping(pid, addr)
        if m is None:
            return Frame(addr, "?", "", addr)
        lib = _library_name(m)
        if not m.path or m.path.startswith("["):
            return Frame(addr, lib, "", addr - m.start)
        file_off = addr - m.start + m.offset
        elf = self._elf.get(m.path)
        if elf is None:
            elf = self._elf[m.path] = read_elf_symbols(m.path)
        hit = elf.lookup(elf.file_offset_to_vaddr(file_off))
        if hit:
            return Frame(addr, lib, hit[0], hit[1])
        return Frame(addr, lib, "", file_off)

    def is_code(self, pid: int, addr: int) -> bool:
        m = self.mapping(pid, addr)
        return m is not None and "x" in m.perms

    def library_of(self, pid: int, site: int, ip: int) -> str:
        """The library blamed for a syscall: the caller (return address) when it points at code,
        else where the syscall instruction itself is. The name only (as :meth:`frame` gives it), without
        reading the library's symbols: a large library's (libtorch_cpu.so) take seconds to read, far more
        than a tick may spend."""
        for addr in (site, ip):
            m = self.mapping(pid, addr) if addr else None
            if m is not None and "x" in m.perms:
                return _library_name(m)
        return "?"
