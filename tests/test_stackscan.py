"""Stack scanning without a kernel: which byte sequences end in a call (so the word after them is a return
address), and a scan of a synthetic stack window over a real process's maps (this test process)."""

from __future__ import annotations

import ctypes
import os
import struct

import pytest

from leaktrace import procfs
from leaktrace.probes.bpf.ledger import MapEntry, Symbolizer
from leaktrace.probes.bpf.stackscan import StackScanner, ends_with_call


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


def test_frame_from_epilogue_of_glibc_wrappers():
    from leaktrace.probes.bpf.stackscan import frame_from_epilogue

    # glibc 2.36 mremap after its syscall: cmp/ja, the stack-protector check, add $0x58,%rsp; ret
    mremap = bytes.fromhex("483d00f0ffff7758" "488b542418" "64482b142528000000" "755d" "4883c458" "c3")
    assert frame_from_epilogue(mremap) == 0x58
    # mmap: cmp/ja, ret — the return address is at the stack pointer
    assert frame_from_epilogue(bytes.fromhex("483d00f0ffff7701c3")) == 0
    # pops before the ret count too; no ret in reach: no answer
    assert frame_from_epilogue(bytes.fromhex("4883c4105b415cc3")) == 0x10 + 16
    assert frame_from_epilogue(bytes.fromhex("4883c410")) is None
