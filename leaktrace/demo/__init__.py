"""The bundled leaking workload of ``leaktrace demo``: a Python host (host.py) calling a native
"transfer" library (xfer.c, built with gcc at demo time into a cache directory) that maps buffers through
raw syscalls and defers their unmapping into a queue it never drains — seed 002 in miniature."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from leaktrace.cachedir import cache_root
from leaktrace.errors import TargetError

SOURCE = Path(__file__).with_name("xfer.c")
LIBRARY = "libxfer_demo.so"


def cache_dir() -> Path:
    return cache_root() / "demo"


def build_library() -> Path:
    """gcc -O2 -shared into CACHE/<hash of source and flags>/libxfer_demo.so (reused when unchanged).
    Built without frame pointers, as vendor libraries usually are: attribution must not rely on them."""
    flags = ["-O2", "-g", "-fPIC", "-shared", "-fomit-frame-pointer", "-Wall"]
    src = SOURCE.read_bytes()
    h = hashlib.sha256(src + repr(flags).encode()).hexdigest()[:16]
    out = cache_dir() / h / LIBRARY
    if out.exists():
        return out
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise TargetError("the demo needs a C compiler to build its transfer library",
                          "install gcc (`apt-get install gcc`)")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TargetError(f"cannot create the demo cache {out.parent}: {e.strerror}",
                          "set LEAKTRACE_CACHE to a writable directory") from e
    tmp = out.with_name(f".{LIBRARY}.{os.getpid()}.tmp")
    r = subprocess.run([gcc, *flags, str(SOURCE), "-o", str(tmp)], capture_output=True, text=True)
    if r.returncode != 0:
        raise TargetError(f"building the demo library failed: {r.stderr.strip().splitlines()[-1:]}",
                          "check that gcc works (`gcc --version`)")
    os.replace(tmp, out)
    return out
