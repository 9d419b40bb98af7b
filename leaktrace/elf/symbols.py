"""Symbols of an ELF file: the exported ones by name (a live process's variable or function) and the
functions by address (a file offset as ``symbol+0xoff``)."""

from __future__ import annotations

import bisect
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
    loads: list[tuple[int, int, int]] = field(default_factory=list)  # (p_offset, p_vaddr, p_filesz)
    addrs: list[int] = field(default_factory=list)
    syms: list[tuple[int, int, str]] = field(default_factory=list)  # (value, size, name), sorted

    def file_offset_to_vaddr(self, off: int) -> int:
        return _offset_to_vaddr(self.loads, off)

    def lookup(self, vaddr: int) -> tuple[str, int] | None:
        i = bisect.bisect_right(self.addrs, vaddr) - 1
        if i < 0:
            return None
        value, size, name = self.syms[i]
        if size and vaddr >= value + size:
            return None
        return name, vaddr - value


# An ELF64 symbol table entry, for reading a whole table at once (libtorch_cpu.so holds 342k of them).
_ELF64_SYM = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"), ("value", "<u8"),
                       ("size", "<u8")])


def read_elf_symbols(path: str) -> ElfSymbols:
    """FUNC symbols of .symtab and .dynsym, and PT_LOAD segments, of a 64-bit little-endian ELF. The file is
    mapped, not read: only its headers, symbol tables and the names kept are touched (a stack through a
    434 MB libtorch_cpu.so costs no 434 MB copy in the hunt)."""
    out = ElfSymbols()
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
                return out
            _read_func_symbols(data, out)
    except (OSError, ValueError):  # unreadable, or empty (mmap refuses a 0-byte file)
        return out
    return out


def _read_func_symbols(data: mmap.mmap, out: ElfSymbols) -> None:
    try:
        h = _header(data)
        for load in _loads(data, h):
            out.loads.append(load)
        syms: dict[int, tuple[int, int, str]] = {}
        sections = _sections(data, h)
        for sh_type, off, size, link, entsize in sections:
            if sh_type not in (SHT_SYMTAB, SHT_DYNSYM) or entsize != _ELF64_SYM.itemsize:
                continue
            # a copy of the table alone: an array over the mapping itself would keep it from closing
            table = np.frombuffer(data[off:off + size // entsize * entsize], dtype=_ELF64_SYM)
            keep = table[((table["info"] & 0xF) == STT_FUNC) & (table["shndx"] != 0) & (table["value"] != 0)]
            str_off = sections[link][1]
            for name_at, st_value, st_size in zip(keep["name"].tolist(), keep["value"].tolist(),
                                                  keep["size"].tolist(), strict=True):
                if st_value not in syms or (syms[st_value][1] == 0 and st_size):
                    syms[st_value] = (st_value, st_size, _name(data, str_off + name_at, "utf-8"))
        out.syms = sorted(syms.values())
        out.addrs = [s[0] for s in out.syms]
    except (struct.error, IndexError, ValueError):
        return  # a malformed file: its segments as far as read, no symbols
