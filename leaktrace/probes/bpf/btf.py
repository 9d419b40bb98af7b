"""Offsets of kernel struct members from the kernel's own BTF (/sys/kernel/btf/vmlinux), for the BPF
program's compile-time knobs when no kernel headers exist (the stub tree knows no ``struct task_struct``).

A minimal reader of the BTF format (include/uapi/linux/btf.h): the header, the string section and the
type records, walked once until the wanted struct is found (~0.1 s over a 5 MB vmlinux BTF). Only
members at the top level of the struct are found (``task_struct.exit_code`` is one).
"""

from __future__ import annotations

import struct
from functools import lru_cache

VMLINUX_BTF = "/sys/kernel/btf/vmlinux"
BTF_MAGIC = 0xEB9F
KIND_STRUCT = 4
# Bytes after the 12-byte common record, per kind: fixed extra, and per vlen entry.
_EXTRA = {1: 4, 3: 12, 14: 4, 17: 4}  # INT, ARRAY, VAR, DECL_TAG
_PER_VLEN = {4: 12, 5: 12, 6: 8, 13: 8, 15: 12, 19: 12}  # STRUCT, UNION, ENUM, FUNC_PROTO, DATASEC, ENUM64


def member_offset(data: bytes, struct_name: str, member: str) -> int | None:
    """Byte offset of ``member`` in ``struct struct_name`` described by the BTF blob ``data``, or None."""
    if len(data) < 24:
        return None
    magic, _ver, _flags, hdr_len, type_off, type_len, str_off, str_len = struct.unpack_from("<HBBIIIII", data, 0)
    if magic != BTF_MAGIC:
        return None
    strs = data[hdr_len + str_off: hdr_len + str_off + str_len]

    def name_index(name: str) -> int | None:
        i = strs.find(b"\0" + name.encode() + b"\0")
        return i + 1 if i >= 0 else None

    sname, mname = name_index(struct_name), name_index(member)
    if sname is None or mname is None:
        return None
    off, end = hdr_len + type_off, hdr_len + type_off + type_len
    while off + 12 <= end:
        name_off, info, _size = struct.unpack_from("<III", data, off)
        off += 12
        kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
        if kind == KIND_STRUCT and name_off == sname:
            kflag = info >> 31
            for i in range(vlen):
                m_name, _m_type, m_off = struct.unpack_from("<III", data, off + 12 * i)
                if m_name == mname:
                    bits = m_off & 0xFFFFFF if kflag else m_off
                    return bits // 8 if bits % 8 == 0 else None
            return None
        off += _EXTRA.get(kind, 0) + _PER_VLEN.get(kind, 0) * vlen
    return None


@lru_cache(maxsize=8)
def kernel_member_offset(struct_name: str, member: str, path: str = VMLINUX_BTF) -> int | None:
    """The running kernel's offset of ``struct_name.member`` (None without BTF, or when not found)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return member_offset(data, struct_name, member)


def exit_code_defines() -> dict[str, int]:
    """``LT_TASK_EXIT_CODE_OFF`` (task_struct.exit_code) when the kernel's BTF has it, else nothing: the
    program then says it could not read how a process ended."""
    off = kernel_member_offset("task_struct", "exit_code")
    return {} if off is None else {"LT_TASK_EXIT_CODE_OFF": off}
