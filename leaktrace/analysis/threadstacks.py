"""Thread stacks kept by threads nobody joins: recognised among the eBPF ledger's culprits, rated by what
they keep resident.

glibc maps each thread's stack block (RLIMIT_STACK, 8 MiB by default, plus a PROT_NONE guard page at its
low end) with one anonymous mmap from pthread_create. A joinable thread that exits keeps the block mapped
until pthread_join; nobody joins it, nobody detaches it: the block stays for ever. Its resident part is
small: glibc releases (MADV_DONTNEED) the stack below the exiting frame, and only the thread descriptor,
its static TLS and the frames near the top stay. So the ledger's rate — address space, 8 MiB a thread —
overstates what costs RAM by one to two orders of magnitude; a culprit's ``mb_per_min`` is the resident
rate: the ledger's rate times the resident share of the stacks, read from the watcher's last full smaps
(per mapping, the same instant the ledger's regions were written). ``mapped_mb_per_min`` keeps the ledger's.

A region is a thread stack when its call path passes through pthread_create / allocate_stack (the
ledger's or gdb's frames), or by its shape in the last smaps: a ``---p`` guard at its start and the rest
one ``rw-p`` mapping.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from leaktrace.analysis.candidates import Candidate, frame_library
from leaktrace.analysis.growth import MB
from leaktrace.analysis.ledger import stack_frames
from leaktrace.memclass import LIBC_LIBRARY
from leaktrace.session import TableSource

THREAD_CREATE = re.compile(r"allocate_stack|pthread_create|create_thread|thrd_create")
# Thread runtimes that call pthread_create for their callers (std::thread, OpenMP, Boost, TBB): the library
# that starts the threads is the first frame above them.
THREAD_RUNTIME = re.compile(r"^(libstdc\+\+|libc\+\+|libgomp|libomp|libboost_thread|libtbb)[.-]")
MAX_GUARD = 1 << 20  # a guard larger than this is not glibc's (pthread_attr_setguardsize aside)
STACK_SHARE = 0.5  # share of a culprit's held bytes that must be thread stacks to call it so
KIB = 1024


def _held_regions(reader: TableSource, pid: int, library: str | None) -> pd.DataFrame:
    """The ledger's anonymous regions of (pid, library) made since attach and held at the end (or at exit)."""
    lr = reader.table("ledger_regions")
    if lr.empty or library is None:
        return lr.iloc[0:0] if not lr.empty else lr
    mine = lr[(lr["pid"] == pid) & (lr["library"] == library) & (lr["kind"] == "anon")
              & ~lr["preexisting"].astype(bool)]
    if "at_exit" in mine and mine["at_exit"].notna().any() and mine["at_exit"].astype(bool).any():
        mine = mine[mine["at_exit"].astype(bool)]
    return mine


def _last_smaps(reader: TableSource, pid: int) -> pd.DataFrame:
    regions = reader.table("regions")
    if regions.empty:
        return regions
    mine = regions[regions["pid"] == pid]
    last = mine[mine["snapshot"] == "last"]
    if last.empty:
        last = mine[mine["t"] == mine["t"].max()] if not mine.empty else mine
    return last.sort_values("start")


def stack_shape(maps: pd.DataFrame, start: int, end: int) -> tuple[bool, int] | None:
    """(whether [start, end) is laid out as a thread stack: a ``---p`` guard of at most MAX_GUARD at its
    start, the rest ``rw-p``; the resident bytes of its mappings), or None when the snapshot does not cover
    it (born after the last full smaps, or gone)."""
    if maps.empty:
        return None
    starts = maps["start"].to_numpy(dtype=np.uint64)
    lo = int(np.searchsorted(starts, np.uint64(start), side="left"))
    hi = int(np.searchsorted(starts, np.uint64(end), side="left"))
    inside = maps.iloc[lo:hi]
    if inside.empty or int(inside["start"].iloc[0]) != start or int(inside["end"].iloc[-1]) != end:
        return None
    perms = [str(p) for p in inside["perms"]]
    rss = int(inside["rss"].sum())
    first_guard = perms[0].startswith("---") and int(inside["end"].iloc[0]) - start <= MAX_GUARD
    rest_rw = all(p.startswith("rw") for p in perms[1:]) and len(perms) >= 2
    # a guard-less stack (guardsize 0) is one rw mapping like any buffer: recognised by its call path only
    return first_guard and rest_rw, rss


def _thread_counts(reader: TableSource, pid: int) -> tuple[int, int] | None:
    """(threads at the first, at the last sample) of ``pid`` from the host probe's rows, when it ran."""
    if "host_procs" not in reader.tables():
        return None
    hp = reader.table("host_procs")
    if hp.empty or "threads" not in hp:
        return None
    mine = hp[(hp["pid"] == pid) & hp["threads"].notna()].sort_values("t")
    if mine.empty:
        return None
    return int(mine["threads"].iloc[0]), int(mine["threads"].iloc[-1])


def stacks_of(reader: TableSource, c: Candidate, frames: dict[str, list[str]]) -> dict[str, Any] | None:
    """What the thread stacks among ``c``'s held regions are: count, bytes mapped, bytes resident (of those
    the last smaps covers), and how they were recognised; None when they are not most of what it holds."""
    held = _held_regions(reader, c.pid, c.library)
    if held.empty:
        return None
    by_path = bool(THREAD_CREATE.search(" ".join(c.stack)))
    maps = _last_smaps(reader, c.pid)
    n = mapped = seen_size = seen_rss = 0
    sizes: dict[int, int] = {}
    how: set[str] = set()
    for r in held.itertuples():
        shape = stack_shape(maps, int(r.start), int(r.end))
        path = by_path or bool(THREAD_CREATE.search(" ".join(frames.get(str(r.stack_key), []))))
        if not (path or (shape is not None and shape[0])):
            continue
        how.add("call path" if path else "shape")
        n += 1
        mapped += int(r.size)
        sizes[int(r.size)] = sizes.get(int(r.size), 0) + 1
        if shape is not None:
            seen_size += int(r.size)
            seen_rss += shape[1]
    total = int(held["size"].sum())
    if not n or mapped < STACK_SHARE * total or not seen_size:
        return None
    return {"stacks": n, "mapped_bytes": mapped, "held_bytes": total, "share": seen_rss / seen_size,
            "seen_stacks_rss": seen_rss, "seen_size": seen_size, "typical_size": max(sizes, key=lambda k: sizes[k]),
            "how": sorted(how)}


def recognise(reader: TableSource, ledger: list[Candidate], warnings: list[str],
              min_mb_per_min: float) -> list[Candidate]:
    """``ledger`` with its thread-stack culprits re-labelled ``thread-stacks`` and re-rated by resident
    growth (the ledger's mapped rate in ``mapped_mb_per_min``). One whose resident growth is below
    ``min_mb_per_min`` costs no RAM at the leak rate: left out, with a warning that names its mapped growth."""
    if not ledger or "ledger_regions" not in reader.tables():
        return ledger
    frames = stack_frames(reader)
    out: list[Candidate] = []
    for c in ledger:
        st = None
        if c.kind == "native-mmap":
            try:
                st = stacks_of(reader, c, frames)
            except Exception as e:  # the plain ledger culprit stands without it
                warnings.append(f"thread-stack analysis failed: {e.__class__.__name__}: {e}")
        if st is None:
            out.append(c)
            continue
        _relabel(c, st, _thread_counts(reader, c.pid))
        if c.mb_per_min < min_mb_per_min:
            warnings.append(f"pid {c.pid}: {st['stacks']} thread stacks kept by {c.library} grow the address space "
                            f"{c.extra['mapped_mb_per_min']:.1f} MB/min but only {c.mb_per_min:.2f} MB/min resident: "
                            "below the leak rate")
            continue
        out.append(c)
    return out


def starter(c: Candidate) -> str | None:
    """The library that starts the threads when ``c``'s is a thread runtime (libstdc++'s std::thread…): the
    first frame above the runtime's in its stack that is neither the C library nor a runtime; else None."""
    if not c.library or not THREAD_RUNTIME.match(c.library):
        return None
    seen = False
    for f in c.stack:
        lib = frame_library(f)
        if lib == c.library:
            seen = True
        elif seen and lib and not lib.startswith("?") and not LIBC_LIBRARY.match(lib) and not THREAD_RUNTIME.match(lib):
            return lib
    return None


def _relabel(c: Candidate, st: dict[str, Any], threads: tuple[int, int] | None) -> None:
    share = float(st["share"])
    mapped = c.mb_per_min
    n = int(st["stacks"])
    per_stack_rss = share * st["typical_size"]
    alive = None
    if threads is not None:
        alive = max(0, min(n, threads[1] - threads[0]))  # threads started since attach and still running
    exited = n - alive if alive is not None else None
    c.kind = "thread-stacks"
    above = starter(c)
    if above is not None:
        c.evidence.insert(0, f"{above} starts the threads through {c.library} (the thread runtime that calls "
                             "pthread_create for it)")
        c.extra["thread_runtime"] = c.library
        c.library = above
    c.mb_per_min = mapped * share
    for k in ("raw_mb_per_min", "lower_mb_per_min"):
        if c.extra.get(k) is not None:
            c.extra[k] = float(c.extra[k]) * share
    c.extra["mapped_mb_per_min"] = round(mapped, 4)
    c.extra["stacks_kept"] = n
    c.extra["rule_fields"] = {
        "stacks": str(n), "exited_stacks": str(exited) if exited is not None else f"up to {n}",
        "stack_resident_kib": f"{per_stack_rss / KIB:.0f}", "stack_mapped_mib": f"{st['typical_size'] / MB:.2f}",
        "mapped_mb_per_min": f"{mapped:.1f}",
    }
    alive_txt = (f"; threads alive: {threads[0]} at the first sample, {threads[1]} at the last, so {exited} of these "
                 "stacks belong to threads that exited" if threads is not None else "")
    c.evidence.insert(0, f"thread stacks: {n} stack block(s) mapped by pthread_create since attach and still held "
                         f"({st['mapped_bytes']:,} B, recognised by {' and '.join(st['how'])}); resident "
                         f"{st['seen_stacks_rss']:,} B of {st['seen_size']:,} B mapped in the last full smaps "
                         f"({share:.1%}), about {per_stack_rss / KIB:.0f} KiB a stack{alive_txt}")
    c.evidence.insert(1, f"resident growth {c.mb_per_min:.2f} MB/min = the ledger's mapped growth {mapped:.1f} MB/min "
                         f"× the stacks' resident share {share:.1%} (mb_per_min is what costs RAM; "
                         "mapped_mb_per_min the address space)")
