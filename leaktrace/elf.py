"""The ELF64 reader: symbols and load segments of 64-bit little-endian ELF files, with no pyelftools
(absent on the target machines).

Two views of a file:

* :func:`elf_info` — the defined ``.dynsym`` symbols by name, cached per file, and
  :func:`first_load_vaddr` (headers only): enough to find an exported variable or function in a live
  process (``load_bias`` + value).
* :func:`read_elf_symbols` — the FUNC symbols of ``.symtab`` and ``.dynsym`` sorted by address, and the
  ``PT_LOAD`` segments: enough to turn a file offset into ``symbol+0xoff`` (the BPF ledger's symbolizer).
"""

from __future__ import annotations

import bisect
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache

# ----------------------------------------------------------------------------- the parser core

PT_LOAD = 1
SHT_SYMTAB = 2
SHT_DYNSYM = 11
STT_FUNC = 2

Header = tuple[int, int, int, int, int, int]  # e_phoff, e_shoff, e_phentsize, e_phnum, e_shentsize, e_shnum
Section = tuple[int, int, int, int, int]  # sh_type, sh_offset, sh_size, sh_link, sh_entsize


def _header(data: bytes) -> Header:
    e_phoff, e_shoff = struct.unpack_from("<QQ", data, 0x20)
    e_phentsize, e_phnum, e_shentsize, e_shnum = struct.unpack_from("<HHHH", data, 0x36)
    return e_phoff, e_shoff, e_phentsize, e_phnum, e_shentsize, e_shnum


def _loads(data: bytes, h: Header) -> Iterator[tuple[int, int, int]]:
    """(p_offset, p_vaddr, p_filesz) of each PT_LOAD segment, in file order (read as they are asked for)."""
    e_phoff, _shoff, e_phentsize, e_phnum, _shentsize, _shnum = h
    for i in range(e_phnum):
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from(
            "<IIQQQQ", data, e_phoff + i * e_phentsize)
        if p_type == PT_LOAD:
            yield p_offset, p_vaddr, p_filesz


def _sections(data: bytes, h: Header) -> list[Section]:
    _phoff, e_shoff, _phentsize, _phnum, e_shentsize, e_shnum = h
    out = []
    for i in range(e_shnum):
        (_name, sh_type, _fl, _addr, sh_offset, sh_size, sh_link, _info, _align, sh_entsize) = \
            struct.unpack_from("<IIQQQQIIQQ", data, e_shoff + i * e_shentsize)
        out.append((sh_type, sh_offset, sh_size, sh_link, sh_entsize))
    return out


def _symbols(data: bytes, sections: list[Section], types: tuple[int, ...],
             default_entsize: int = 0) -> Iterator[tuple[int, int, int, int, int]]:
    """(offset of the name in ``data``, st_info, st_shndx, st_value, st_size) of every entry of the symbol
    tables of the given section types. A table with sh_entsize 0 is read with ``default_entsize``, or
    skipped when that is 0 too."""
    for sh_type, off, size, link, entsize in sections:
        step = entsize or default_entsize
        if sh_type not in types or not step:
            continue
        str_off = sections[link][1]
        for j in range(size // step):
            st_name, st_info, _other, st_shndx, st_value, st_size = struct.unpack_from(
                "<IBBHQQ", data, off + j * step)
            yield str_off + st_name, st_info, st_shndx, st_value, st_size


def _name(data: bytes, at: int, encoding: str) -> str:
    return data[at:data.index(b"\0", at)].decode(encoding, "replace")


# ----------------------------------------------------------------------------- exported symbols by name

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
    """The defined symbols of an ELF64 little-endian shared object's ``.dynsym`` (no pyelftools needed)."""
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
        for p_off, p_vaddr, p_filesz in self.loads:
            if p_off <= off < p_off + max(p_filesz, 1):
                return off - p_off + p_vaddr
        return off

    def lookup(self, vaddr: int) -> tuple[str, int] | None:
        i = bisect.bisect_right(self.addrs, vaddr) - 1
        if i < 0:
            return None
        value, size, name = self.syms[i]
        if size and vaddr >= value + size:
            return None
        return name, vaddr - value


def read_elf_symbols(path: str) -> ElfSymbols:
    """FUNC symbols of .symtab and .dynsym, and PT_LOAD segments, of a 64-bit little-endian ELF."""
    out = ElfSymbols()
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return out
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return out
    try:
        h = _header(data)
        for load in _loads(data, h):
            out.loads.append(load)
        syms: dict[int, tuple[int, int, str]] = {}
        for name_at, st_info, st_shndx, st_value, st_size in _symbols(data, _sections(data, h),
                                                                      (SHT_SYMTAB, SHT_DYNSYM)):
            if (st_info & 0xF) != STT_FUNC or st_shndx == 0 or st_value == 0:  # FUNC, defined
                continue
            name = _name(data, name_at, "utf-8")
            if st_value not in syms or (syms[st_value][1] == 0 and st_size):
                syms[st_value] = (st_value, st_size, name)
        out.syms = sorted(syms.values())
        out.addrs = [s[0] for s in out.syms]
    except (struct.error, IndexError, ValueError):
        return out
    return out
