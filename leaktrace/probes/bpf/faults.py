"""Who touches memory: the kernel's write-fault counts (bpf/leaktrace.bpf.c, exceptions:page_fault_user and
page_fault_kernel), named.

Memory can grow with no syscall at all: a region reserved before attach (a 1 GiB MAP_NORESERVE arena) handed
out piece by piece and written. The ledger sees nothing of it; /proc sees the region's resident pages grow; the
page faults say whose code writes there: its own faults, and the kernel's writing its pages for it (read(), recv()
into a buffer never touched). The kernel counts write faults per (process, faulting ip, site, 2 MiB
bucket) in ``fault_counts`` and sends one stack window the first time a (process, ip, site) faults. Here:

- each window names the code that touched the page: the ip itself when it is outside the C runtime, else the
  first return address outside it in the window (memset and memcpy touch pages for whoever called them);
- every tick the counts are taken out of the kernel's map (so it stays small) and written as ``fault_sites``
  rows, one per (process, ip, site) and region the ledger holds as mapped before attach (named with its bounds
  and its VmFlags, ``nr``: MAP_NORESERVE, from /proc/PID/smaps, read once per region), and one per (process, ip,
  site) for the faults elsewhere (the span of their buckets: rows stay few under a fault storm);
- the kernel's fault counters go to ``fault_stats``.

Session tables written (``t`` = seconds since hunt start):

``fault_sites``  per tick and (pid, ip, site, region mapped before attach or elsewhere): t, pid, ip, site (memset's
                 caller when ip is in libc, else 0), caller (the toucher's address), library (the toucher's),
                 symbol, start and end (the region's, or the span of the 2 MiB buckets faulted), faults (write faults
                 counted; scale by ``sample``), sample, preexisting (the region was mapped before attach),
                 region_start, region_end, vmflags (smaps' VmFlags of that region: "rd wr mr mw me nr ac")
``fault_stats``  per tick: t, writes, sampled, dropped (faults the kernel's map had no room for), windows
"""

from __future__ import annotations

import bisect
import ctypes as ct
import errno
import os
from typing import Any

from leaktrace import procfs
from leaktrace.errors import AccessDenied, ProcessGone
from leaktrace.probes import HuntContext
from leaktrace.probes.bpf.kernel import KernelSide
from leaktrace.probes.bpf.layout import FAULT_BUCKET_SHIFT, FAULT_STATS, FaultKey, WindowEvent
from leaktrace.probes.bpf.ledger import OutstandingLedger
from leaktrace.probes.bpf.stackscan import StackScanner
from leaktrace.probes.bpf.symbolizer import Symbolizer
from leaktrace.procfs.parsers import parse_smaps_vmflags

BUCKET = 1 << FAULT_BUCKET_SHIFT
DEFAULT_SAMPLE = 4  # LT_FAULT_SAMPLE's default in bpf/leaktrace.bpf.c
SYMBOLS_MAX_BYTES = 64 << 20  # a toucher in a larger library is named by its file offset (see _symbol)


def _i64(x: int) -> int:
    return x - (1 << 64) if x >= (1 << 63) else x


class FaultSites:
    """The fault counts of ``kernel``'s program, named with ``symbols`` and ``scanner``; regions mapped before
    attach are those ``ledger`` holds as pre-existing. ``sample``: the program's LT_FAULT_SAMPLE."""

    def __init__(self, kernel: KernelSide, ledger: OutstandingLedger, symbols: Symbolizer, scanner: StackScanner,
                 sample: int = DEFAULT_SAMPLE) -> None:
        self.kernel = kernel
        self.ledger = ledger
        self.symbols = symbols
        self.scanner = scanner
        self.sample = sample
        self._callers: dict[tuple[int, int, int], int] = {}  # (pid, ip, site) -> the toucher's address
        self._vmflags: dict[tuple[int, int], str] = {}  # (pid, region start) -> VmFlags
        self._symbols: dict[tuple[int, int], str] = {}  # (pid, toucher address) -> its frame as text
        self._buf: tuple[Any, Any, int] | None = None  # keys and counts taken from the kernel, reused per tick
        self._entries: dict[int, list[tuple[int, int, str]]] = {}  # pid -> (start, end, VmFlags) of its last smaps
        self._read_this_tick: set[int] = set()  # pids whose smaps was read this tick

    def learn(self, e: WindowEvent) -> None:
        """A window of the first fault of (pid, ip, site): the code that touched the page."""
        key = (e.tgid, e.ip, e.site)
        if len(self._callers) > 200_000:
            self._callers.clear()
        self._callers[key] = self._toucher(e.tgid, e.ip, e.site, e.window if isinstance(e, WindowEvent) else b"")

    def _toucher(self, pid: int, ip: int, site: int, window: bytes) -> int:
        if self.scanner.in_runtime(pid, ip) is not True:
            return ip  # the library's own code wrote the page
        if window:
            caller = self.scanner.caller(pid, self.scanner.return_addresses(pid, window, to_caller=True))
            if caller is not None:
                return caller
        return site or ip

    def forget(self, pid: int) -> None:
        self._callers = {k: v for k, v in self._callers.items() if k[0] != pid}
        self._vmflags = {k: v for k, v in self._vmflags.items() if k[0] != pid}
        self._entries.pop(pid, None)
        self._symbols = {k: v for k, v in self._symbols.items() if k[0] != pid}

    # ------------------------------------------------------------------ per tick
    def tick(self, ctx: HuntContext) -> None:
        """This tick's ``fault_sites`` and ``fault_stats`` rows; nothing when the program has no fault probe."""
        prog = self.kernel.prog
        if prog is None or not _has_map(prog, b"fault_counts"):
            return
        t = ctx.session.now()
        ctx.session.append("fault_sites", self.rows(t))
        ctx.session.append("fault_stats", {"t": t, **self.stats()})

    def take_counts(self) -> list[tuple[FaultKey, int]]:
        """The counts since the last take, removed from the kernel's map (BPF_MAP_LOOKUP_AND_DELETE_BATCH,
        called here: bcc's wrapper passes one variable as both the batch token and the count, and the
        kernel's token overwrites the count)."""
        table = self.kernel.prog[b"fault_counts"]
        if self._buf is None:
            n = table.max_entries
            self._buf = ((table.Key * n)(), (table.Leaf * n)(), n)
        keys, vals, n = self._buf
        lib = self.kernel.lib
        out: list[tuple[FaultKey, int]] = []
        token_in, token_out, cnt = ct.c_uint32(0), ct.c_uint32(0), ct.c_uint32(0)
        for first in (True, *([False] * 64)):
            cnt.value = n
            res = lib.bpf_lookup_and_delete_batch(table.map_fd, None if first else ct.byref(token_in),
                                                  ct.byref(token_out), ct.byref(keys), ct.byref(vals),
                                                  ct.byref(cnt))
            err = ct.get_errno()
            out += [(FaultKey(k.tgid, 0, k.ip, k.site, k.bucket), int(v)) for k, v in
                    zip(keys[:cnt.value], vals[:cnt.value], strict=True)]
            if res != 0:
                if err not in (errno.ENOENT, 0):
                    raise OSError(err, f"reading fault_counts: {os.strerror(err)}")
                break
            token_in.value = token_out.value
        return out

    def stats(self) -> dict[str, int]:
        table = self.kernel.prog[b"fault_stats"]
        out = {name.removeprefix("fault_"): int(sum(table[ct.c_int(i)])) for i, name in enumerate(FAULT_STATS)}
        if self.sample <= 1:
            out["sampled"] = out["writes"]  # every write fault is counted: the kernel keeps one counter
        return out

    def rows(self, t: float) -> list[dict[str, Any]]:
        """``fault_sites`` rows of the counts taken now (see the module doc): per region mapped before attach,
        and otherwise per toucher, with the span of the buckets its faults fell in."""
        self._read_this_tick = set()
        groups: dict[tuple[int, int, int, int], list[int]] = {}  # (pid, ip, site, region start) -> faults, lo, hi
        regions: dict[tuple[int, int], tuple[int, int] | None] = {}  # (pid, bucket): keys share buckets
        for k, n in self.take_counts():
            a = k.bucket << FAULT_BUCKET_SHIFT
            if (k.tgid, a) not in regions:
                regions[(k.tgid, a)] = self._preexisting_region(k.tgid, a)
            region = regions[(k.tgid, a)]
            lo, hi = region if region is not None else (a, a + BUCKET)
            key = (k.tgid, k.ip, k.site, lo if region is not None else 0)
            g = groups.get(key)
            if g is None:
                groups[key] = [n, lo, hi]
            else:
                g[0], g[1], g[2] = g[0] + n, min(g[1], lo), max(g[2], hi)
        out = []
        for (pid, ip, site, region_start), (n, lo, hi) in groups.items():
            caller = self._callers.get((pid, ip, site)) or self._toucher(pid, ip, site, b"")
            if not self.symbols.knows(pid, caller):
                continue  # gone before it was named (an exit): nothing to tell who it was
            pre = region_start != 0
            library = self.symbols.library_of(pid, caller, caller)
            out.append({"t": t, "pid": pid, "ip": _i64(ip), "site": _i64(site), "caller": _i64(caller),
                        "library": library, "symbol": self._symbol(pid, caller) if pre else "",
                        "start": lo, "end": hi, "faults": n,
                        "sample": self.sample, "preexisting": pre,
                        "region_start": lo if pre else 0, "region_end": hi if pre else 0,
                        "vmflags": self._flags(pid, lo) if pre else ""})
        return out

    def _symbol(self, pid: int, addr: int) -> str:
        """``library!symbol+0xoff`` of a toucher, once per (pid, address), only for the touchers of regions
        mapped before attach. A library over SYMBOLS_MAX_BYTES is named ``library+0xoff`` (its file offset):
        reading its symbols (libtorch_cpu.so, 434 MB) takes seconds of a tick, and holds the interpreter
        while the ring buffer fills."""
        hit = self._symbols.get((pid, addr))
        if hit is None:
            m = self.symbols.mapping(pid, addr)
            if m is not None and m.path.startswith("/") and _size(m.path) > SYMBOLS_MAX_BYTES:
                hit = f"{os.path.basename(m.path)}+0x{addr - m.start + m.offset:x}"
            else:
                hit = str(self.symbols.frame(pid, addr))
            self._symbols[(pid, addr)] = hit
        return hit

    def _preexisting_region(self, pid: int, a: int) -> tuple[int, int] | None:
        """The region mapped before attach (the ledger's seeded interval; not the brk heap or a stack, whose
        growth is a syscall's or a thread's) that holds most of the bucket at ``a``: the faults of a bucket are
        not placed within it, so a region covering less of it (a small one, or the edge of one) is not given
        them."""
        sp = self.ledger.spaces.get(pid)
        iv = sp.covering_most(a, a + BUCKET) if sp is not None else None
        if iv is not None and iv.origin.preexisting and not iv.origin.path.startswith("["):
            return iv.start, iv.end
        return None

    def _flags(self, pid: int, start: int) -> str:
        """The VmFlags of the region at ``start``, from ``pid``'s last smaps read: a region mapped before attach
        is in every read since, so one read per process serves its regions until one is missing from it (then
        at most one read a tick). A torch process's smaps is thousands of entries: one read per region stalled
        the tick, and one per new region still cost ~1 s of a 90 s hunt on a loaded P/D pair."""
        hit = self._vmflags.get((pid, start))
        if hit is None:
            entries = self._entries.get(pid)
            hit = _containing(entries, start) if entries is not None else None
            if hit is None and pid not in self._read_this_tick:
                self._read_this_tick.add(pid)
                try:
                    entries = parse_smaps_vmflags(procfs.read_proc_text(pid, "smaps"))
                except (ProcessGone, AccessDenied, OSError):
                    entries = []
                self._entries[pid] = entries = sorted(entries)
                hit = _containing(entries, start)
            hit = self._vmflags[(pid, start)] = hit or ""
        return hit


def _containing(entries: list[tuple[int, int, str]], a: int) -> str | None:
    """The flags of the entry (sorted by start) that holds ``a``; None when none does."""
    i = bisect.bisect_right(entries, (a, float("inf"))) - 1
    if i >= 0 and entries[i][0] <= a < entries[i][1]:
        return entries[i][2]
    return None


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _vmflags_at(smaps: str, start: int) -> str:
    """The VmFlags of the smaps entry that contains ``start`` ("" when none does)."""
    return next((flags for lo, hi, flags in parse_smaps_vmflags(smaps) if lo <= start < hi), "")


def _has_map(prog: Any, name: bytes) -> bool:
    try:
        prog[name]
    except Exception:  # bcc raises KeyError or a bare Exception for a map the program lacks
        return False
    return True
