"""The unwind rules of an ELF file's ``.eh_frame``: the CFA rule at each code address, enough to walk a raw
stack window frame by frame through code without frame pointers."""

from __future__ import annotations

import bisect
import os
import struct
from dataclasses import dataclass
from functools import lru_cache

from leaktrace.elf.core import _header, _loads, _offset_to_vaddr

# ----------------------------------------------------------------------------- unwind rules (.eh_frame)

DW_EH_PE_PCREL = 0x10
# Pointer encodings (low nibble) of fixed size; 0x01 and 0x09 are ULEB128 and SLEB128.
_EH_FORMATS = {0x00: "<Q", 0x02: "<H", 0x03: "<I", 0x04: "<Q", 0x0A: "<h", 0x0B: "<i", 0x0C: "<q"}
# Call frame instructions that set a register's rule, and those that change no rule: opcode -> operands
# ("u" ULEB128, "s" SLEB128, "b" a ULEB128-sized block). Only the CFA is kept; of the other registers, only
# whether the row has a rule for any (a row with neither a CFA register nor rules ends no FDE's table).
_CFA_REG_RULES = {0x05: "uu", 0x07: "u", 0x08: "u", 0x09: "uu", 0x10: "ub", 0x11: "us", 0x14: "uu",
                  0x15: "us", 0x16: "ub", 0x2F: "uu"}
_CFA_NOPS = {0x00: "", 0x2D: "", 0x2E: "u"}  # nop, GNU_window_save, GNU_args_size

CfaRow = tuple[int, int | None, int | None]  # (pc, CFA register or None for an expression, CFA offset)
_State = tuple[int | None, int | None, frozenset[int]]  # CFA register, offset, registers with a rule


def _leb(data: bytes, pos: int, signed: bool = False) -> tuple[int, int]:
    """The LEB128 number at ``pos``, and where it ends."""
    value = shift = 0
    while True:
        b, pos, shift = data[pos], pos + 1, shift + 7
        value |= (b & 0x7F) << (shift - 7)
        if b < 0x80:
            return (value - (1 << shift) if signed and b & 0x40 else value), pos


def _operands(data: bytes, pos: int, kinds: str) -> tuple[list[int], int]:
    out = []
    for k in kinds:
        value, pos = _leb(data, pos, k == "s")
        pos += value if k == "b" else 0
        out.append(value)
    return out, pos


def _eh_pointer(data: bytes, pos: int, enc: int, base: int) -> tuple[int, int]:
    """A pointer of encoding ``enc`` at ``pos``, and where it ends; ``base`` is the vaddr of ``data[0]`` (for
    pc-relative pointers). Raises ValueError for encodings other than absolute and pc-relative."""
    low, high = enc & 0x0F, enc & 0x70
    if high not in (0, DW_EH_PE_PCREL) or (low not in _EH_FORMATS and low not in (0x01, 0x09)):
        raise ValueError(f"pointer encoding {enc:#x}")
    if low in _EH_FORMATS:
        value, end = struct.unpack_from(_EH_FORMATS[low], data, pos)[0], pos + struct.calcsize(_EH_FORMATS[low])
    else:
        value, end = _leb(data, pos, low == 0x09)
    return value + (base + pos if high else 0), end


@dataclass
class _Cie:
    code_align: int
    data_align: int
    fde_enc: int
    augmented: bool  # "z": each FDE has augmentation data to skip
    program: tuple[int, int]  # initial instructions: [start, end) in the section
    initial: _State | None = None  # the state every FDE starts from (decoded on first use)


class UnwindTable:
    """The CFA rules of one file's ``.eh_frame`` by file vaddr, and its ``PT_LOAD`` segments. Entries are
    indexed when read; an FDE's instructions are decoded on first use (a hook path needs a handful).
    Raises ValueError (or struct.error, IndexError) for a file it cannot read."""

    def __init__(self, data: bytes) -> None:
        if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            raise ValueError("not an ELF64 little-endian file")
        h = _header(data)
        self.loads = list(_loads(data, h))
        _phoff, e_shoff, _phentsize, _phnum, e_shentsize, e_shnum = h
        names = struct.unpack_from("<Q", data, e_shoff + struct.unpack_from("<H", data, 0x3E)[0] * e_shentsize + 0x18)[0]
        self._sec, self._addr = b"", 0
        for i in range(e_shnum):
            name, _type, _flags, addr, off, size = struct.unpack_from("<IIQQQQ", data, e_shoff + i * e_shentsize)
            if data[names + name:names + name + 10] == b".eh_frame\0":
                self._sec, self._addr = data[off:off + size], addr
        self._cies: dict[int, _Cie] = {}
        self._fdes: list[tuple[int, int, int, int, _Cie]] = []  # (lo, hi, program start, end, CIE)
        self._rows: dict[int, list[CfaRow]] = {}  # FDE index -> its table
        pos = 0
        while pos + 4 <= len(self._sec):
            body, id_at, end = self._entry(pos)
            cie_id = int.from_bytes(self._sec[id_at:body], "little")
            if end > id_at and cie_id != 0:
                cie = self._cie(id_at - cie_id)
                lo, p = _eh_pointer(self._sec, body, cie.fde_enc, self._addr)
                size, p = _eh_pointer(self._sec, p, cie.fde_enc & 0x0F, self._addr)
                p = sum(_leb(self._sec, p)) if cie.augmented else p  # past the augmentation data (length, bytes)
                self._fdes.append((lo, lo + size, p, end, cie))
            pos = end
        self._fdes.sort(key=lambda f: (f[0], f[1]))
        self._los = [f[0] for f in self._fdes]

    def file_offset_to_vaddr(self, off: int) -> int:
        return _offset_to_vaddr(self.loads, off)

    def cfa_rule(self, pc: int) -> tuple[int | None, int | None] | None:
        """(register, offset) of the canonical frame address at ``pc`` (a file vaddr): CFA = register +
        offset; register None when an expression computes it. None when no FDE covers ``pc``, or its
        instructions cannot be read."""
        i = bisect.bisect_right(self._los, pc) - 1
        if i < 0 or pc >= self._fdes[i][1]:
            return None
        rows = self._rows.get(i)
        if rows is None:
            lo, _hi, start, end, cie = self._fdes[i]
            try:
                rows = self._decode(start, end, cie, lo, self._initial(cie))[0]
            except (ValueError, IndexError, struct.error):
                rows = []
            self._rows[i] = rows
        found = None
        for row in rows:
            if row[0] > pc:
                break
            found = row
        return (found[1], found[2]) if found else None

    def _entry(self, pos: int) -> tuple[int, int, int]:
        """(where the body after the CIE id / pointer starts, where that id starts, the end) of an entry."""
        length = struct.unpack_from("<I", self._sec, pos)[0]
        if length == 0xFFFFFFFF:  # 64-bit DWARF: a 64-bit length and id
            length = struct.unpack_from("<Q", self._sec, pos + 4)[0]
            return pos + 20, pos + 12, pos + 12 + length
        return pos + 8, pos + 4, pos + 4 + length

    def _cie(self, pos: int) -> _Cie:
        if pos in self._cies:
            return self._cies[pos]
        sec, (p, _id_at, end) = self._sec, self._entry(pos)
        version, aug_end = sec[p], sec.index(b"\0", p + 1)
        aug = sec[p + 1:aug_end].decode("ascii", "replace")
        (code_align, data_align), p = _operands(sec, aug_end + 1 + (8 if "eh" in aug else 0), "us")
        p = p + 1 if version == 1 else _leb(sec, p)[1]  # the return address register
        fde_enc = 0
        if aug.startswith("z"):
            n, q = _leb(sec, p)
            p = q + n
            for c in aug[1:]:
                if c == "R":
                    fde_enc, q = sec[q], q + 1
                elif c in "LP":  # the LSDA's encoding; the personality routine's (and its pointer)
                    q = q + 1 if c == "L" else _eh_pointer(sec, q + 1, sec[q] & 0x7F, self._addr)[1]
                elif c not in "SB":
                    break
        cie = self._cies[pos] = _Cie(code_align, data_align, fde_enc, aug.startswith("z"), (p, end))
        return cie

    def _initial(self, cie: _Cie) -> _State:
        if cie.initial is None:
            _rows, (reg, off, regs) = self._decode(*cie.program, cie, 0, (None, 0, frozenset()))
            cie.initial = (reg, off, regs) if reg is not None or regs else (None, 0, frozenset())
        return cie.initial

    def _decode(self, start: int, end: int, cie: _Cie, pc: int, state: _State) -> tuple[list[CfaRow], _State]:
        """The table of a CFA program: a row each time the location advances, and the last state as a row when
        it has a CFA register or any register rule."""
        sec, (reg, off, regs), initial, p = self._sec, state, state[2], start
        rows: list[CfaRow] = []
        saved: list[_State] = []
        while p < end:
            op, p = sec[p], p + 1
            if op >> 6 == 1 or op in (0x01, 0x02, 0x03, 0x04):  # advance_loc, set_loc, advance_loc1/2/4
                rows.append((pc, reg, off))
                if op == 0x01:
                    pc, p = _eh_pointer(sec, p, cie.fde_enc, self._addr)
                    continue
                size = {0x02: 1, 0x03: 2, 0x04: 4}.get(op, 0)
                delta = int.from_bytes(sec[p:p + size], "little") if size else op & 0x3F
                pc, p = pc + delta * cie.code_align, p + size
            elif op >> 6 == 2:  # offset
                regs, p = regs | {op & 0x3F}, _leb(sec, p)[1]
            elif op >> 6 == 3 or op == 0x06:  # restore, restore_extended: the CIE's rule, or none
                r, p = (op & 0x3F, p) if op >> 6 == 3 else _leb(sec, p)
                regs = regs | {r} if r in initial else regs - {r}
            elif op in (0x0C, 0x12):  # def_cfa, def_cfa_sf
                (reg, off), p = _operands(sec, p, "uu" if op == 0x0C else "us")
                off = off if op == 0x0C else off * cie.data_align
            elif op == 0x0D:  # def_cfa_register
                reg, p = _leb(sec, p)
            elif op in (0x0E, 0x13):  # def_cfa_offset, def_cfa_offset_sf
                off, p = _leb(sec, p, op == 0x13)
                off = off if op == 0x0E else off * cie.data_align
            elif op == 0x0F:  # def_cfa_expression
                reg, off, p = None, None, _operands(sec, p, "b")[1]
            elif op == 0x0A:  # remember_state
                saved.append((reg, off, regs))
            elif op == 0x0B:  # restore_state
                reg, off, regs = saved.pop()
            elif op in _CFA_REG_RULES or op in _CFA_NOPS:
                args, p = _operands(sec, p, _CFA_REG_RULES.get(op) or _CFA_NOPS[op])
                regs = regs | {args[0]} if op in _CFA_REG_RULES else regs
            else:
                raise ValueError(f"call frame instruction {op:#x}")
        if reg is not None or regs:
            rows.append((pc, reg, off))
        return rows, (reg, off, regs)


@lru_cache(maxsize=16)
def _unwind_table_cached(path: str, mtime_ns: int, size: int) -> UnwindTable | None:
    try:
        with open(path, "rb") as f:
            return UnwindTable(f.read())
    except (OSError, ValueError, struct.error, IndexError):
        return None


def unwind_table(path: str) -> UnwindTable | None:
    """The unwind rules of the file at ``path``, cached per file version; None when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return _unwind_table_cached(path, st.st_mtime_ns, st.st_size)
