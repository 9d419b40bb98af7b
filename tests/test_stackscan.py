"""Stack scanning without a kernel: which byte sequences end in a call (so the word after them is a return
address), and a scan of a synthetic stack window over a real process's maps (this test process)."""

from __future__ import annotations

import ctypes
import os
import struct

import pytest

from leaktrace import procfs
from leaktrace.probes.bpf.stackscan import StackScanner
from leaktrace.probes.bpf.symbolizer import MapEntry, Symbolizer
from leaktrace.probes.bpf.x86code import ends_with_call


@pytest.mark.parametrize("code", [
    "e8 10 20 30 40",            # call rel32
    "ff d0",                     # call rax
    "41 ff d3",                  # call r11
    "ff 15 00 10 00 00",         # call [rip+disp32]
    "ff 50 08",                  # call [rax+8]
    "ff 54 24 08",               # call [rsp+8]
    "ff 94 24 00 01 00 00",      # call [rsp+0x100]
    "ff 90 00 01 00 00",         # call [rax+0x100]
    "ff 14 c5 00 10 00 00",      # call [rax*8+disp32]
    "90 90 ff 10",               # call [rax]
])
def test_calls_are_recognised(code: str) -> None:
    assert ends_with_call(bytes.fromhex(code))


@pytest.mark.parametrize("code", [
    "",
    "90 90 90 90 90 90 90",      # nops
    "ff e0",                     # jmp rax (ff /4)
    "ff 25 00 10 00 00",         # jmp [rip+disp32]
    "e8 10 20 30 40 90",         # a call, then one more byte: not where the return lands
    "48 89 c7",                  # mov rdi, rax
])
def test_non_calls_are_not(code: str) -> None:
    assert not ends_with_call(bytes.fromhex(code))


def test_scan_finds_return_addresses_in_libc_and_beyond() -> None:
    """A window holding: junk, a return address into libc after a real call, a data pointer, and an address
    just after a call in this interpreter's own code; the first outside libc is the caller."""
    pid = os.getpid()
    sym = Symbolizer()
    sym.set_maps(pid, [MapEntry(m.start, m.end, m.offset, m.perms, m.path) for m in procfs.read_maps(pid)])
    scan = StackScanner(sym)

    def after_call(lib_pred) -> int | None:
        for m in procfs.read_maps(pid):
            if "x" in m.perms and m.path and lib_pred(os.path.basename(m.path)):
                with open(m.path, "rb") as f:
                    f.seek(m.offset)
                    code = f.read(m.end - m.start)
                i = code.find(b"\xe8", 64)
                while i >= 0:
                    ret = m.start + i + 5
                    if scan.is_return_address(pid, ret):
                        return ret
                    i = code.find(b"\xe8", i + 1)
        return None

    in_libc = after_call(lambda lib: lib.startswith("libc.so"))
    elsewhere = after_call(lambda lib: not lib.startswith(("libc.so", "ld-linux")))
    assert in_libc and elsewhere
    data = ctypes.addressof(ctypes.c_int(1))
    window = struct.pack("<5Q", 7, in_libc, data, 0, elsewhere)
    found = scan.return_addresses(pid, window)
    assert found == [in_libc, elsewhere]
    assert scan.caller(pid, found) == elsewhere


def _direct_calls(pid: int, scan: StackScanner, lib_prefix: str, limit: int = 4000):
    """(return address, where the call goes once resolved) of direct calls in a file this process maps."""
    for m in procfs.read_maps(pid):
        if "x" in m.perms and os.path.basename(m.path).startswith(lib_prefix):
            with open(m.path, "rb") as f:
                f.seek(m.offset)
                code = f.read(m.end - m.start)
            i = code.find(b"\xe8", 64)
            while i >= 0 and limit:
                ret = m.start + i + 5
                if scan.is_return_address(pid, ret):
                    limit -= 1
                    yield ret, scan.call_target(pid, ret)
                i = code.find(b"\xe8", i + 1)


def test_chain_keeps_only_frames_a_call_reached() -> None:
    """A frame of a scanned chain is kept when the call before its return address is indirect, or goes (through a
    PLT stub and the GOT the dynamic linker filled) into the file of the kept frame below; a return address of the
    interpreter left between two libc frames (a stale word) is dropped."""
    pid = os.getpid()
    sym = Symbolizer()
    sym.set_maps(pid, [MapEntry(m.start, m.end, m.offset, m.perms, m.path) for m in procfs.read_maps(pid)])
    scan = StackScanner(sym)

    def file_of(addr: int | None) -> str:
        m = sym.mapping(pid, addr) if addr is not None else None
        return os.path.basename(m.path) if m else ""

    libc_internal = next(r for r, t in _direct_calls(pid, scan, "libc.so") if file_of(t) == file_of(r))
    py_calls = list(_direct_calls(pid, scan, "libpython"))
    py_internal = next(r for r, t in py_calls if file_of(t) == file_of(r))
    # a call into libc through libpython's PLT: resolved through the GOT into libc itself
    assert any(file_of(t).startswith("libc.so") for _r, t in py_calls), "no PLT call resolved into libc"
    below = libc_internal  # a libc frame below (any libc code address)
    assert scan.reaches(pid, libc_internal, below) is True
    assert scan.reaches(pid, py_internal, below) is False
    assert scan.reaches(pid, py_internal, py_internal) is True
    chain = [libc_internal, py_internal, libc_internal]
    assert scan.verified_chain(pid, chain, below) == [libc_internal, libc_internal]
    assert scan.verified_chain(pid, chain) == [libc_internal, libc_internal]  # the first needs no frame below


def test_frame_from_epilogue_of_glibc_wrappers():
    from leaktrace.probes.bpf.x86code import frame_from_epilogue

    # glibc 2.36 mremap after its syscall: cmp/ja, the stack-protector check, add $0x58,%rsp; ret
    mremap = bytes.fromhex("483d00f0ffff7758" "488b542418" "64482b142528000000" "755d" "4883c458" "c3")
    assert frame_from_epilogue(mremap) == 0x58
    # mmap: cmp/ja, ret — the return address is at the stack pointer
    assert frame_from_epilogue(bytes.fromhex("483d00f0ffff7701c3")) == 0
    # pops before the ret count too; no ret in reach: no answer
    assert frame_from_epilogue(bytes.fromhex("4883c4105b415cc3")) == 0x10 + 16
    assert frame_from_epilogue(bytes.fromhex("4883c410")) is None
