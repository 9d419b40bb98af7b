"""The walk of CPython's GC lists from outside (``/proc/PID/mem``), for the pyheap probe: the objects of a
list counted by type while the target runs and changes the list; the types named from their tp_name.

The walks run in the walker process (leaktrace.probes.pyheap.worker), which sets :data:`YIELD_GIL` and
cancels a walk under way through :func:`cancel`."""

from __future__ import annotations

import os
import signal
import struct
import time
from collections import defaultdict
from typing import Any

from leaktrace.procmem import ProcMem

MAX_WALK = 3_000_000
# A walk gives the other threads of the hunt (ticks, the eBPF ring's consumer) the GIL every YIELD_EVERY
# objects: its page reads release the GIL and take it back at once, which on a busy 2-core machine can starve
# the tick thread for a whole walk of a vLLM process (tens of seconds: the ring overflows). It also stops at
# its deadline (the list then counts as not walked through, -1), so no walk outlasts WALK_BUDGET_S.
YIELD_EVERY = 2048
WALK_BUDGET_S = 5.0
# In the walker process nothing shares the GIL with the walk: no yield there (set by worker_main).
YIELD_GIL = True
WORKER_NICE = 10  # the walker process yields the CPU to the hunt (ticks, ring drain) and the targets
# Object layout of the default (non free-threaded) build on 64-bit, 3.8–3.13: a PyGC_Head (_gc_next,
# _gc_prev) right before each tracked object; the object starts with ob_refcnt, ob_type; a type object's
# tp_name follows its PyVarObject header.
GC_HEAD = 16
OB_TYPE = 8
TP_NAME = 24
_NODE = struct.Struct(f"<QQ{GC_HEAD - 16 + OB_TYPE}xQ")  # _gc_next, _gc_prev, (ob_refcnt), ob_type
PAGE = 4096
MAX_RESYNCS = 10_000
PAGES_KEPT = 256  # 1 MiB of the target's memory cached during one walk
TYPES_KEPT = 200  # per walk: the most numerous types are written (``pyheap_types``), the rest summed up
# The walk under way gives up at its next deadline check once CANCEL_SIGNAL came (the hunt's stop: its
# answer would be dropped, and the stop's own walks queue behind it). Cleared by each new request.
CANCEL_SIGNAL = signal.SIGUSR1
_cancelled = False


def cancel(_signum: int, _frame: Any) -> None:
    """CANCEL_SIGNAL's handler in the walker process: the walk under way gives up."""
    global _cancelled
    _cancelled = True


def clear_cancel() -> None:
    """A new request: a cancel meant the walk before it."""
    global _cancelled
    _cancelled = False


def _walk(mem: ProcMem, head: int, stops: set[int] | frozenset[int] = frozenset(),
          types: dict[int, int] | None = None, deadline: float | None = None) -> int:
    """Length of a PyGC_Head list (``_gc_next`` chain back to its head); -1 when the walk broke: an
    unreadable node, another list's head, or too many resyncs. ``types`` counts the objects by type
    address.

    Memory is read a page at a time (the last PAGES_KEPT pages kept, for this walk only): objects sit
    next to each other in pymalloc's pools and a list mostly follows allocation order, so one read serves
    tens of objects. The target keeps changing the list under the walk (objects freed, collections): a node
    whose ``_gc_prev`` is not the node before it was reached through a stale link, so the walk drops its
    cached pages and goes on from the live successor of the last good node (or the one before, when that
    one left the list too) — objects freed meanwhile are skipped, which is what a count should do."""
    n = 0
    counts: defaultdict[int, int] = defaultdict(int)
    cache: dict[int, bytes] = {}
    unpack_from, pread, fd, size = _NODE.unpack_from, os.pread, mem.fd, _NODE.size  # the hot loop
    offset_mask = PAGE - 1
    good, good_tp = [head], [0]  # the last nodes walked through (and their types), for resyncs
    resyncs = steps = 0
    node = mem.read_ptr(head)
    while node is not None:
        node &= ~0x3  # low bits of _gc_next are flags during a collection
        if node == head:
            break
        if node == 0 or node in stops or n >= MAX_WALK:
            return -1
        steps += 1  # not n: a list churned under the walk sends n back (resyncs) and past no multiple
        if not steps % YIELD_EVERY:
            if YIELD_GIL:
                time.sleep(0.0002)  # let the hunt's other threads run (see YIELD_EVERY)
            if _cancelled or (deadline is not None and time.monotonic() > deadline):
                return -1
        off = node & offset_mask
        base = node - off
        page = cache.get(base)
        try:
            if page is None:
                page = pread(fd, PAGE, base)
                if len(page) == PAGE:
                    cache[base] = page
                    if len(cache) > PAGES_KEPT:
                        del cache[next(iter(cache))]
            if off + size > len(page):  # the object's header crosses the page (or a short read)
                page, off = pread(fd, size, node), 0
        except OSError:
            page = b""
        if len(page) >= off + size:
            nxt, prev, tp = unpack_from(page, off)
            if prev & ~0x3 == good[-1]:  # reached through a live link: count it and go on
                counts[tp] += 1
                good.append(node)
                good_tp.append(tp)
                if len(good) > 64:  # a few recent nodes suffice to resync; the older ones stay counted
                    del good[1:33], good_tp[1:33]
                node = nxt
                n += 1
                continue
        resyncs += 1
        if resyncs > MAX_RESYNCS:
            return -1
        cache.clear()
        node = None
        while len(good) > 1:  # back to the last node still in the list (live: its _gc_prev holds)
            live = mem.read(good[-1], size)
            if live and len(live) == size and unpack_from(live)[1] & ~0x3 == good[-2]:
                node = unpack_from(live)[0]
                break
            good.pop()
            n -= 1
            counts[good_tp.pop()] -= 1
        if node is None:  # back at the head: the walk starts again
            good, good_tp, counts, n = [head], [0], defaultdict(int), 0
            node = mem.read_ptr(head)
    if node is None:
        return -1
    if types is not None:
        for tp, k in counts.items():
            types[tp] = types.get(tp, 0) + k
    return n


def walk_retry(mem: ProcMem, head: int, stops: set[int], types: dict[int, int], tries: int = 3,
               deadline: float | None = None) -> int:
    n = -1
    for _ in range(tries):
        n = _walk(mem, head, stops, types, deadline)
        if n >= 0 or _cancelled or (deadline is not None and time.monotonic() > deadline):
            break
    return n


def type_names(mem: ProcMem, types: dict[int, int], frozen: dict[int, int]) -> dict[str, tuple[int, int]]:
    """{type name: (objects, of which frozen)} for the TYPES_KEPT most numerous types (tp_name read from
    each type object; objects of types with the same name are summed); the rest under ``(other)``."""
    allc = dict(types)
    for tp, n in frozen.items():
        allc[tp] = allc.get(tp, 0) + n
    ranked = sorted(allc, key=lambda tp: -allc[tp])
    out: dict[str, tuple[int, int]] = {}
    rest = [0, 0]
    for i, tp in enumerate(ranked):
        name = _tp_name(mem, tp) if i < TYPES_KEPT else None
        n, f = allc[tp], frozen.get(tp, 0)
        if name is None:
            rest[0] += n
            rest[1] += f
            continue
        a, b = out.get(name, (0, 0))
        out[name] = (a + n, b + f)
    if rest[0]:
        out["(other)"] = (rest[0], rest[1])
    return out


def _tp_name(mem: ProcMem, tp: int) -> str | None:
    ptr = mem.read_ptr(tp + TP_NAME)
    raw = mem.read_cstr(ptr, 200) if ptr else None
    if not raw:
        return None
    name = raw.decode("utf-8", "replace")
    return name if name.isprintable() else None
