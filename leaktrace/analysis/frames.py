"""Which frames of a recorded stack are frames a call reached.

A stack unwound without unwind information for one of its functions (a frame-pointer walk through code built
without them, gdb's guess past libffi's call trampoline) goes on with whatever words it finds: small
integers, stack and heap addresses. Those are not code addresses and nothing above one of them can be
trusted, so a stack is cut at its first such frame: ``?@0x…`` / ``?!0x…`` (an address in no mapping),
``[stack]…``, ``[heap]…`` (data)."""

from __future__ import annotations

import re

NOT_CODE = re.compile(r"^(\?|\[(stack|heap|vvar)[^\]]*\])")


def is_code_frame(frame: str) -> bool:
    return bool(frame) and not NOT_CODE.match(frame)


def code_frames(frames: list[str]) -> list[str]:
    """``frames`` (innermost first) up to, not including, the first that is not a code address."""
    out: list[str] = []
    for f in frames:
        if not is_code_frame(str(f)):
            break
        out.append(f)
    return out
