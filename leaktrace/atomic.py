"""The one way leaktrace replaces a file: write a hidden temporary beside it, fsync, rename over it.

A reader (another `leaktrace report`, a notebook, a killed hunt's successor) sees the old complete file
or the new complete file, never half of one; a failed write (disk full) leaves the old one in place.
"""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        tmp.unlink(missing_ok=True)  # disk full: the previous complete file stays in place
        raise
    os.replace(tmp, path)
    return path
