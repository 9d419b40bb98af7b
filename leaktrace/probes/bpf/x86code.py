"""What the bytes of x86-64 code around an address say, for the stack scanner (stackscan.py): whether the
bytes before a return address end with a call, where a direct call or a jump leads, and how big a syscall
wrapper's frame is from the epilogue after its syscall instruction."""

from __future__ import annotations

LOOKBACK = 7  # the longest call form looked at: ff 94 24 disp32 (call [rsp+disp32])


def _modrm_tail(code: bytes, i: int) -> int | None:
    """Length of the ModRM operand starting at code[i] (ModRM, SIB, displacement), or None."""
    if i >= len(code):
        return None
    modrm = code[i]
    mod, rm = modrm >> 6, modrm & 7
    if mod == 3:
        return 1
    sib = rm == 4
    n = 1 + sib
    if mod == 0:
        if rm == 5:
            return 5  # rip-relative disp32
        if sib:
            if i + 1 >= len(code):
                return None
            if code[i + 1] & 7 == 5:
                n += 4  # SIB with no base: disp32
        return n
    return n + (1 if mod == 1 else 4)


def ends_with_call(code: bytes) -> bool:
    """Do the bytes just before a return address end with a call instruction? ``code`` holds up to
    :data:`LOOKBACK` bytes ending at the return address."""
    n = len(code)
    if n >= 5 and code[n - 5] == 0xE8:
        return True
    for start in range(max(0, n - LOOKBACK), n - 1):
        if code[start] != 0xFF or (code[start + 1] >> 3) & 7 != 2:
            continue
        tail = _modrm_tail(code, start + 1)
        if tail is not None and start + 1 + tail == n:
            return True
    return False


EPILOGUE_BYTES = 48  # code read after a syscall instruction when looking for its wrapper's epilogue


def frame_from_epilogue(code: bytes) -> int | None:
    """Bytes between the stack pointer at a syscall and the wrapper's return address, read from the code
    that follows the syscall instruction: its first ``ret`` (c3) and the pops and ``add $N, %rsp`` just
    before it (glibc's wrappers: ``mmap`` returns with nothing on the stack; the variadic ``mremap`` keeps a
    0x58-byte frame). None when the pattern is not there (the caller checks the answer anyway)."""
    k = code.find(b"\xc3")
    if k < 0:
        return None
    size, i = 0, k
    while True:  # pops, innermost last: 58-5f, or 41 58-5f (r8-r15); an add's immediate may look like one
        if (i >= 4 and code[i - 4:i - 1] == b"\x48\x83\xc4") or (i >= 7 and code[i - 7:i - 4] == b"\x48\x81\xc4"):
            break
        if i >= 2 and code[i - 2] == 0x41 and 0x58 <= code[i - 1] <= 0x5F:
            size, i = size + 8, i - 2
        elif i >= 1 and 0x58 <= code[i - 1] <= 0x5F:
            size, i = size + 8, i - 1
        else:
            break
    if i >= 4 and code[i - 4:i - 1] == b"\x48\x83\xc4":  # add $imm8, %rsp
        size += code[i - 1]
    elif i >= 7 and code[i - 7:i - 4] == b"\x48\x81\xc4":  # add $imm32, %rsp
        size += int.from_bytes(code[i - 4:i], "little")
    return size


def jump_target(addr: int, code: bytes, read_word) -> int | None:
    """Where the jump at ``addr`` leads: ``jmp rel32`` (e9), ``jmp rel8`` (eb), or a PLT stub's ``jmp *disp(%rip)``
    (``ff 25``, optionally after ``endbr64`` and a ``bnd`` prefix) through the GOT word ``read_word`` returns;
    None when ``code`` starts with none of them."""
    i = 4 if code[:4] == b"\xf3\x0f\x1e\xfa" else 0
    if code[i:i + 1] == b"\xf2":
        i += 1
    if len(code) >= i + 5 and code[i] == 0xE9:
        return (addr + i + 5 + int.from_bytes(code[i + 1:i + 5], "little", signed=True)) & 0xFFFFFFFFFFFFFFFF
    if len(code) >= i + 2 and code[i] == 0xEB:
        return (addr + i + 2 + int.from_bytes(code[i + 1:i + 2], "little", signed=True)) & 0xFFFFFFFFFFFFFFFF
    if len(code) >= i + 6 and code[i:i + 2] == b"\xff\x25":
        word = read_word(addr + i + 6 + int.from_bytes(code[i + 2:i + 6], "little", signed=True))
        return int.from_bytes(word, "little") if len(word) == 8 else None
    return None
