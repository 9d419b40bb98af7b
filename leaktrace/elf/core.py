"""The parser core shared by the ELF views: headers, load segments, sections and symbol tables, read with
``struct`` from a file's bytes."""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator

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


def _name(data: bytes | mmap.mmap, at: int, encoding: str) -> str:
    end = data.find(b"\0", at)
    if end < 0:
        raise ValueError("symbol name without its terminating NUL")
    return data[at:end].decode(encoding, "replace")


def _offset_to_vaddr(loads: list[tuple[int, int, int]], off: int) -> int:
    """The vaddr of file offset ``off`` through the PT_LOAD segments (``off`` itself outside them)."""
    for p_off, p_vaddr, p_filesz in loads:
        if p_off <= off < p_off + max(p_filesz, 1):
            return off - p_off + p_vaddr
    return off
