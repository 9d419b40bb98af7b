"""Symbols of an ELF file: the exported ones by name (a live process's variable or function) and the
functions by address (a file offset as ``symbol+0xoff``)."""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterable
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
    path: str = ""
    file_key: tuple[int, int, int, int] | None = None  # (st_dev, st_ino, st_size, st_mtime_ns) when the table was read
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
        """The name of the i-th symbol (see :meth:`names`)."""
        if i not in self._names:
            self.names([i])
        return self._names[i]

    def names(self, indices: Iterable[int]) -> list[str | None]:
        """Names of symbols, read from the file when first asked for; None when the file is no longer the one
        the table was read from, or cannot give the name. The file is mapped for the read only: a hunt keeps the
        symbols of every library on its stacks, and a descriptor held for each could run out."""
        indices = list(indices)
        missing = [i for i in indices if i not in self._names]
        if missing:
            self._names.update(dict.fromkeys(missing))
            try:
                with open(self.path, "rb") as f:
                    if _file_key(os.fstat(f.fileno())) == self.file_key:
                        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                            for i in missing:
                                try:
                                    self._names[i] = _name(data, int(self.name_at[i]), "utf-8")
                                except (ValueError, IndexError):
                                    pass
            except (OSError, ValueError):
                pass
        return [self._names[i] for i in indices]

    @property
    def syms(self) -> list[tuple[int, int, str | None]]:
        """Every symbol as (value, size, name), by address: reads every name (for inspection, not the hunt)."""
        return list(zip(self.addrs.tolist(), self.sizes.tolist(), self.names(range(len(self.addrs))), strict=True))


# An ELF64 symbol table entry, for reading a whole table at once (libtorch_cpu.so holds 342k of them).
_ELF64_SYM = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"), ("value", "<u8"),
                       ("size", "<u8")])


def read_elf_symbols(path: str) -> ElfSymbols:
    """FUNC symbols of .symtab and .dynsym, and PT_LOAD segments, of a 64-bit little-endian ELF. The file is
    mapped, not read: only its headers, symbol tables and the names looked up are touched (a stack through a
    434 MB libtorch_cpu.so costs no 434 MB copy in the hunt)."""
    out = ElfSymbols(path=path)
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            out.file_key = _file_key(os.fstat(f.fileno()))
            if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
                return out
            _read_func_symbols(data, out)
    except (OSError, ValueError):  # unreadable, or empty (mmap refuses a 0-byte file)
        return out
    return out


def _file_key(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


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
