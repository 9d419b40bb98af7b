"""Where leaktrace's non-Python files are: ``bpf/`` (the BPF C program, its header, the stub kernel headers)
and ``gdb_scripts/`` (what gdb loads).

Both stay at the repository's top level (the user's layout). A wheel carries them as
``leaktrace/_data/<name>`` (pyproject.toml renames them there), so a lookup tries, in order: the
environment override, the installed copy, the source checkout (an editable install, or running from the
repository). The answers are absolute file-system paths, not importlib.resources objects: BCC and gdb
take file names, and leaktrace is never imported from a zip.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leaktrace.errors import LeaktraceError

PACKAGE_DIR = Path(__file__).resolve().parent


class ResourceMissing(LeaktraceError):
    """leaktrace's own data files are not where this installation should have them."""

    default_remedy = "reinstall leaktrace (pip install --force-reinstall leaktrace, or pip install -e . in its repository)"


@dataclass(frozen=True)
class DataDir:
    name: str  # the directory's name at the repository's top level
    env: str  # the variable that points leaktrace at another copy
    marker: str  # a file every good copy holds: tells ours from a stray directory of the same name

    def candidates(self) -> list[Path]:
        override = os.environ.get(self.env)
        if override:
            # The user's choice is the only one: falling back would hide a typo behind another copy.
            return [Path(override).expanduser().resolve()]
        return [PACKAGE_DIR / "_data" / self.name, PACKAGE_DIR.parent / self.name]

    def find(self) -> Path | None:
        """The first candidate that holds ``marker``; None when none does."""
        return next((c for c in self.candidates() if (c / self.marker).is_file()), None)

    def located(self) -> Path:
        """Where the files are, or where this installation should have them (for paths built at import
        time, which must not fail: the doctor check and the probe's start report the absence)."""
        return self.find() or self.candidates()[0]

    def path(self) -> Path:
        """Where the files are; :class:`ResourceMissing` naming every place looked at when absent."""
        found = self.find()
        if found is None:
            raise ResourceMissing(f"leaktrace's {self.name}/ was not found ({self.marker} in none of "
                                  f"{', '.join(map(str, self.candidates()))})", self.remedy())
        return found

    def remedy(self) -> str:
        return f"{ResourceMissing.default_remedy}; or set {self.env} to a directory holding {self.marker}"

    def doctor_check(self, label: str, file: Path) -> dict[str, Any]:
        """A ``leaktrace doctor`` check that ``file`` (one of this directory's) is there."""
        ok = file.is_file()
        return {"name": label, "ok": ok, "detail": str(file) if ok else f"{file} is missing",
                "fix": "" if ok else self.remedy()}


BPF = DataDir("bpf", "LEAKTRACE_BPF_DIR", "leaktrace.bpf.c")
GDB_SCRIPTS = DataDir("gdb_scripts", "LEAKTRACE_GDB_SCRIPTS", "sampler.py")


def bpf_dir() -> Path:
    """``bpf/``: leaktrace.bpf.c, leaktrace.h and the stub kernel headers (kheaders/)."""
    return BPF.path()


def gdb_scripts_dir() -> Path:
    """``gdb_scripts/``: the in-gdb sampler and its settings."""
    return GDB_SCRIPTS.path()
