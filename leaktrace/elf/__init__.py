"""The ELF64 reader: symbols, load segments and unwind rules of 64-bit little-endian ELF files. It is the
project's only ELF parser: the formats are read with ``struct``, which indexes a library's ``.eh_frame``
about fifty times faster than pyelftools and keeps one copy of the header parsing.

Three views of a file:

* :func:`elf_info` — the defined ``.dynsym`` symbols by name, cached per file, and
  :func:`first_load_vaddr` (headers only): enough to find an exported variable or function in a live
  process (``load_bias`` + value).
* :func:`read_elf_symbols` — the FUNC symbols of ``.symtab`` and ``.dynsym`` sorted by address, and the
  ``PT_LOAD`` segments: enough to turn a file offset into ``symbol+0xoff`` (the BPF ledger's symbolizer).
* :func:`unwind_table` — the CFA rules of ``.eh_frame`` by address, and the ``PT_LOAD`` segments: enough to
  walk a raw stack window frame by frame through code without frame pointers (a memory hook's frames).
"""

from leaktrace.elf.symbols import (
    ElfInfo,
    ElfSymbols,
    elf_info,
    first_load_vaddr,
    parse_elf_dynsym,
    read_elf_symbols,
)
from leaktrace.elf.unwind import UnwindTable, unwind_table

__all__ = ["ElfInfo", "ElfSymbols", "UnwindTable", "elf_info", "first_load_vaddr", "parse_elf_dynsym",
           "read_elf_symbols", "unwind_table"]
