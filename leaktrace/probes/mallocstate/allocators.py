"""Which allocator serves malloc in a process: glibc's own, or one preloaded or linked in its place
(jemalloc, tcmalloc, mimalloc), recognised by the library mapped in the process and told apart as preloaded
(named in its LD_PRELOAD) or linked. An allocator built into the executable itself is not recognised.

glibc's books (glibc.py) are read from the process's memory; these allocators keep theirs in structures
only their own code walks (jemalloc's ``mallctl("stats.…")``, tcmalloc's ``MallocExtension``, mimalloc's
``mi_stats``), which leaktrace never runs in a target. What can be read from outside is said: the
allocator, its library, how it came in, and its settings from the environment (MALLOC_CONF, TCMALLOC_*,
MIMALLOC_*), which decide whether freed memory goes back to the system (jemalloc's decay).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from leaktrace.memclass import ALLOCATOR_LIBRARIES
from leaktrace.procfs import Mapping

SETTINGS = {"jemalloc": ("MALLOC_CONF", "JE_MALLOC_CONF"), "tcmalloc": ("TCMALLOC_",), "mimalloc": ("MIMALLOC_",)}
READ_ONLY_INSIDE = {
    "jemalloc": "its statistics are read by its own code (mallctl \"stats.*\"; MALLOC_CONF=stats_print:true "
                "prints them at exit)",
    "tcmalloc": "its statistics are read by its own code (MallocExtension::GetStats; "
                "TCMALLOC_RELEASE_RATE sets how fast it returns free pages)",
    "mimalloc": "its statistics are read by its own code (mi_stats_print; MIMALLOC_SHOW_STATS=1 prints them "
                "at exit)",
}


@dataclass(frozen=True)
class OtherAllocator:
    """An allocator other than glibc's serving malloc: its name, library, how it came in, its settings."""

    name: str
    library: str
    how: str  # "preloaded (LD_PRELOAD)" or "linked"
    settings: str  # "KEY=value, …" or ""

    def line(self) -> str:
        settings = f"; settings {self.settings}" if self.settings else "; no settings in its environment"
        return (f"malloc is {self.name}'s ({self.how}: {self.library}): glibc's books do not apply, and "
                f"{READ_ONLY_INSIDE[self.name]}, which leaktrace never runs in a target{settings}")

    def as_dict(self) -> dict[str, str]:
        """Its fields and its line: what the session keeps (the analysis reads them, never this module)."""
        return {**asdict(self), "line": self.line()}


def other_allocator(maps: Iterable[Mapping], env: dict[str, str]) -> OtherAllocator | None:
    """The allocator mapped in a process in glibc malloc's place (the first of ALLOCATOR_LIBRARIES found), or
    None."""
    paths = {m.path for m in maps if m.path and m.path.startswith("/")}
    preload = [e for e in env.get("LD_PRELOAD", "").replace(":", " ").split() if e]
    for name, pattern in ALLOCATOR_LIBRARIES:
        for path in sorted(paths):
            base = os.path.basename(path.removesuffix(" (deleted)"))
            if not pattern.match(base):
                continue
            # LD_PRELOAD names the file as given (libtcmalloc_minimal.so.4), maps the file it resolves to
            preloaded = any(base.startswith(os.path.basename(e)) or os.path.realpath(e) == path for e in preload)
            how = "preloaded (LD_PRELOAD)" if preloaded else "linked"
            keys = SETTINGS[name]
            settings = ", ".join(f"{k}={v}" for k, v in sorted(env.items())
                                 if any(k == s or (s.endswith("_") and k.startswith(s)) for s in keys))
            return OtherAllocator(name, path, how, settings)
    return None
