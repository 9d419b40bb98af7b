"""Symbols of an ELF file: the exported ones by name (a live process's variable or function) and the
functions by address (a file offset as ``symbol+0xoff``)."""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from leaktrace.elf.core import (
    SHT_DYNSYM,
    SHT_SYMTAB,
    STT_FUNC,
    _header,
    _loads,
    _name,
    _offset_to_vaddr,
    _sections,
    _symbols,
)


@dataclass(frozen=True)
class ElfInfo:
    symbols: dict[str, tuple[int, int]]  # name -> (st_value, st_size), defined dynamic symbols


@lru_cache(maxsize=64)
def _elf_info_cached(path: str, mtime_ns: int, size: int) -> ElfInfo:
    with open(path, "rb") as f:
        data = f.read()
    return parse_elf_dynsym(data)


def elf_info(path: str) -> ElfInfo:
    st = os.stat(path)
    return _elf_info_cached(path, st.st_mtime_ns, st.st_size)


def parse_elf_dynsym(data: bytes) -> ElfInfo:
    """The defined symbols of an ELF64 little-endian shared object's ``.dynsym``."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not an ELF64 little-endian file")
    h = _header(data)
    symbols: dict[str, tuple[int, int]] = {}
    for name_at, _info, st_shndx, st_value, st_size in _symbols(data, _sections(data, h), (SHT_DYNSYM,), 24):
        if st_shndx == 0 or st_value == 0:
            continue  # undefined (imported) symbol
        symbols.setdefault(_name(data, name_at, "ascii"), (st_value, st_size))
    return ElfInfo(symbols)


def first_load_vaddr(path: str) -> int:
    """p_vaddr of the first PT_LOAD, page-aligned down, reading the headers only (a library's load bias
    is its offset-0 mapping's start minus this). Raises OSError, or ValueError for a file that is not
    ELF64 little-endian."""
    with open(path, "rb") as f:
        data = f.read(64)
        if data[:4] != b"\x7fELF" or len(data) < 64 or data[4] != 2 or data[5] != 1:
            raise ValueError(f"{path}: not an ELF64 little-endian file")
        h = _header(data)
        data += f.read(max(0, h[0] + h[2] * h[3] - 64))  # up to the end of the program headers
    return next((p_vaddr & ~0xFFF for _off, p_vaddr, _sz in _loads(data, h)), 0)


# ----------------------------------------------------------------------------- functions by address

@dataclass
class ElfSymbols:
    """FUNC symbols sorted by address. Names are read from the file on lookup: a table of 342k C++ names
    (libtorch_cpu.so) decoded up front cost the hunt half a second of CPU on its first stack through it."""

    loads: list[tuple[int, int, int]] = field(default_factory=list)  # (p_offset, p_vaddr, p_filesz)
    addrs: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))  # st_value, sorted, unique
    sizes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    name_at: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # file offset of each name
    names_from: mmap.mmap | None = None  # the file, kept mapped: names come from the content the table was read from
    _names: dict[int, str | None] = field(default_factory=dict)

    def file_offset_to_vaddr(self, off: int) -> int:
        return _offset_to_vaddr(self.loads, off)

    def lookup(self, vaddr: int) -> tuple[str, int] | None:
        i = int(np.searchsorted(self.addrs, vaddr, side="right")) - 1
        if i < 0:
            return None
        value, size = int(self.addrs[i]), int(self.sizes[i])
        if size and vaddr >= value + size:
            return None
        name = self.name(i)
        return None if name is None else (name, vaddr - value)

    def name(self, i: int) -> str | None:
        """The name of the i-th symbol; None when the file cannot give it (no terminating NUL)."""
        if i not in self._names:
            try:
                self._names[i] = _name(self.names_from, int(self.name_at[i]), "utf-8") if self.names_from else None
            except (ValueError, IndexError):
                self._names[i] = None
        return self._names[i]

    @property
    def syms(self) -> list[tuple[int, int, str | None]]:
        """Every symbol as (value, size, name), by address: reads every name (for inspection, not the hunt)."""
        return [(int(v), int(z), self.name(i)) for i, (v, z) in enumerate(zip(self.addrs, self.sizes, strict=True))]


# An ELF64 symbol table entry, for reading a whole table at once (libtorch_cpu.so holds 342k of them).
_ELF64_SYM = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"), ("value", "<u8"),
                       ("size", "<u8")])


def read_elf_symbols(path: str) -> ElfSymbols:
    """FUNC symbols of .symtab and .dynsym, and PT_LOAD segments, of a 64-bit little-endian ELF. The file is
    mapped, not read: only its headers, symbol tables and the names looked up are touched (a stack through a
    434 MB libtorch_cpu.so costs no 434 MB copy in the hunt)."""
    out = ElfSymbols()
    try:
        with open(path, "rb") as f:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):  # unreadable, or empty (mmap refuses a 0-byte file)
        return out
    if len(data) >= 64 and data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1:
        _read_func_symbols(data, out)
    if len(out.addrs):
        out.names_from = data
    else:
        data.close()
    return out


def _read_func_symbols(data: mmap.mmap, out: ElfSymbols) -> None:
    """Fills ``out``. One symbol per address: the first with a size, else the first (tables in section order)."""
    try:
        h = _header(data)
        for load in _loads(data, h):
            out.loads.append(load)
        sections = _sections(data, h)
        kept = []
        for sh_type, off, size, link, entsize in sections:
            if sh_type not in (SHT_SYMTAB, SHT_DYNSYM) or entsize != _ELF64_SYM.itemsize:
                continue
            # a copy of the table alone: an array over the mapping itself would keep it from closing
            table = np.frombuffer(data[off:off + size // entsize * entsize], dtype=_ELF64_SYM)
            keep = table[((table["info"] & 0xF) == STT_FUNC) & (table["shndx"] != 0) & (table["value"] != 0)]
            kept.append((keep["value"], keep["size"], keep["name"].astype(np.int64) + sections[link][1]))
        if not kept:
            return
        values, sizes, name_at = (np.concatenate(col) for col in zip(*kept, strict=True))
        # by address, then sized before sizeless, then table order: the first of each address is the one kept
        order = np.lexsort((np.arange(len(values)), sizes == 0, values))
        values = values[order]
        first = np.ones(len(values), bool)
        first[1:] = values[1:] != values[:-1]
        pick = order[first]
        out.addrs, out.sizes, out.name_at = values[first], sizes[pick], name_at[pick]
    except (struct.error, IndexError, ValueError):
        return  # a malformed file: its segments as far as read, no symbols
