"""The hunt's gdb probe: samples the target tree's processes in turn, one attach each, into the session."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from leaktrace import procfs
from leaktrace.errors import GdbUnavailable, LeaktraceError, NoSuchProcess
from leaktrace.probes import HuntOptions, ProbeBase
from leaktrace.probes.gdb.attach import sample_process
from leaktrace.probes.gdb.budget import GdbRun, PauseBudget
from leaktrace.probes.gdb.checks import preflight
from leaktrace.probes.gdb.rows import run_row, sample_row
from leaktrace.probes.gdb.symbolfiles import symbol_files

DEFAULT_SAMPLES_ON_GROWTH = 20  # --gdb-samples unset: this many per process, once it grows
DEFAULT_SECONDS_PER_PROCESS = 10.0
GROWTH_TRIGGER_BYTES = 8 << 20  # RSS above its first reading by this much → worth a few stacks
# ... or the eBPF ledger's count of what it mapped since attach and still holds, grown by this much since its
# first snapshot, as all it maps did (not the count itself: a vLLM API server holds ~10 MB of flat Python
# arenas). Exact, so a lower bar, and known at once: RSS can take most of a hunt to grow by 8 MB (a loaded vLLM
# worker's UCX leak: 53 s of 90), and gdb's symbol read (~30 s) must end while the load lasts for a stack to be
# sampled.
LEDGER_TRIGGER_BYTES = 4 << 20
# ... or one call site of the ledger (LiveFigures.bpf["top_sites"]) whose held bytes reached a new high at this
# many ticks, never falling back below their first reading, and grew this much in all, as all the process maps
# did (a slow leak's pool chunks come every few ticks): gdb then stops only there (a breakpoint at that return
# address) and reads the symbols of its stack's libraries only (seconds, not the minute of a torch process's all).
SITE_TRIGGER_TICKS = 3
SITE_TRIGGER_BYTES = 1 << 20
MAPPING_KINDS = ("anon", "file", "shm")  # sites whose call returns the address it mapped (joined by address)
# A process due on growth with no growing call site: gdb reads all its libraries' symbols before it stops
# anywhere, at about this rate on a loaded node (gdb runs in the helpers' low-weight group: a vLLM worker's ~1 GB
# of code files took 50-70 s on 2 busy cores, an API server's ~700 MB more than 63 s and 9.5 s of CPU).
# With less of the hunt left than its read would take, the stop would cut the read before any stack, its CPU
# spent beside the serving for nothing: the process is not sampled.
FULL_READ_BYTES_PER_S = 10 << 20


class GdbProbe(ProbeBase):
    """Samples each process of the target tree in turn, in a background thread.

    ``--gdb-samples N`` (N>0): every live process once, N mmap/mremap stacks each (or 10 s, or the
    budget). Unset: only processes whose ledger count (mapped since attach, still held, and all mapped) grew by
    ``LEDGER_TRIGGER_BYTES`` or one of whose call sites grows, or, without the eBPF ledger, whose RSS or
    anonymous memory grew by ``GROWTH_TRIGGER_BYTES`` since first seen (the watcher's figures),
    ``DEFAULT_SAMPLES_ON_GROWTH`` stacks each, once. gdb unusable (missing, no
    Python, ptrace refused, target already traced) stops the hunt with one line (``GdbUnavailable``,
    exit code 6) unless the user turned gdb off (``--gdb-samples 0`` / ``--no-gdb``)."""

    name = "gdb"
    required = True  # asked-for gdb that cannot work is an error the user must see, not a warning

    def __init__(self, options: HuntOptions | None = None) -> None:
        options = options or HuntOptions()
        self.options = options
        n = options.gdb_samples
        self.on_growth_only = n is None
        self.samples_per_process = DEFAULT_SAMPLES_ON_GROWTH if n is None else int(n)
        self.seconds_per_process = float(options.gdb_seconds if options.gdb_seconds is not None
                                         else DEFAULT_SECONDS_PER_PROCESS)
        budget: dict[str, float] = {}
        if options.gdb_pause_fraction is not None:
            budget["pause_fraction"] = options.gdb_pause_fraction
        if options.gdb_max_stops_per_s is not None:
            budget["max_stops_per_s"] = options.gdb_max_stops_per_s
        self.budget = PauseBudget(**budget)
        self.ctx = None
        # Processes due for sampling and how far past its trigger each grew (updated every tick): gdb takes one
        # process at a time, the one growing most first (a loaded vLLM worker's symbols take gdb 30-60 s; its
        # leak must not wait behind an API server that crossed a trigger at the same tick).
        self._pending: dict[int, float] = {}
        self._taken: set[int] = set()
        self._pending_lock = threading.Lock()
        self._first_seen: dict[tuple[int, str], int] = {}
        self._sites: dict[tuple[int, int], SiteGrowth] = {}  # (pid, site) -> how its held bytes went
        self._sites_seen: list[dict[str, Any]] | None = None
        self._growing: dict[int, SiteGrowth] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._runs: list[GdbRun] = []
        self._failures: list[str] = []
        self._lock = threading.Lock()

    def start(self, ctx: Any) -> None:
        self.ctx = ctx
        preflight(ctx.targets.live())
        self._thread = threading.Thread(target=self._loop, name="gdb-sampler", daemon=True)
        self._thread.start()
        self._enqueue_due()

    def tick(self, now: float) -> None:
        self._enqueue_due()

    def _enqueue_due(self) -> None:
        live = self.ctx.targets.live()
        growing = self._follow_sites()
        if not self.on_growth_only:
            for pid in live:
                self._enqueue(pid, 0.0)
            return
        # With the eBPF ledger live, RSS growth alone is no reason to sample: the ledger sees every mapping
        # call exactly, so growth it does not hold happened without one (pages touched in memory mapped
        # earlier) and gdb's stacks at those calls would be of unrelated churn, after a symbol read that
        # costs a minute of CPU in a vLLM process.
        # What a process mapped since attach climbs from 0 to a churner's whole working set as the churner
        # replaces what it held at attach (the later the first snapshot, the more of it), while all it maps,
        # pre-existing mappings included, stays flat: ledger growth counts where both grew, a call site's where
        # all the process maps grew with it.
        rollup = {} if self.ctx.live.bpf else self.ctx.live.rollup
        held = self.ctx.live.bpf.get("outstanding_by_pid") or {}
        mapped = self.ctx.live.bpf.get("mapped_by_pid") or {}
        for pid in live:
            figures = rollup.get(pid) or {}
            grown: dict[str, float] = {}
            for key, value in (("rss", figures.get("rss")), ("anon", figures.get("anon")),
                               ("ledger", held.get(pid)), ("mapped", mapped.get(pid))):
                if value is not None:
                    grown[key] = value - self._first_seen.setdefault((pid, key), value)
            net = grown.get("mapped", float("inf"))  # no such figure (the eBPF layer not live): no gate
            ratios = [grown[k] / GROWTH_TRIGGER_BYTES for k in ("rss", "anon") if k in grown]
            if "ledger" in grown:
                ratios.append(min(grown["ledger"], net) / LEDGER_TRIGGER_BYTES)
            site = growing.get(pid)
            if (site and site.highs >= SITE_TRIGGER_TICKS and site.grown >= SITE_TRIGGER_BYTES
                    and net >= SITE_TRIGGER_BYTES):
                ratios.append(site.grown / SITE_TRIGGER_BYTES)
            score = max((r for r in ratios if r >= 1.0), default=None)
            if score is not None:
                self._enqueue(pid, score)

    def _follow_sites(self) -> dict[int, SiteGrowth]:
        """Per process, its call site that grew most since first seen among those growing (those with the
        trigger's count of new highs first), from the bpf probe's latest figures."""
        entries = self.ctx.live.bpf.get("top_sites") or []
        if entries is self._sites_seen:
            return self._growing
        self._sites_seen = entries
        growing: dict[int, SiteGrowth] = {}
        for e in entries:
            if e.get("kind") not in MAPPING_KINDS:
                continue
            f = self._sites.get((e["pid"], e["site"]))
            if f is None:
                f = self._sites[(e["pid"], e["site"])] = SiteGrowth(e["bytes"], e["bytes"], e["bytes"], 0, e)
            f.see(e)
            best = growing.get(e["pid"])
            if f.highs and (best is None or f.rank() > best.rank()):
                growing[e["pid"]] = f
        self._growing = growing
        return growing

    def growing_site(self, pid: int) -> dict[str, Any] | None:
        """The call site of ``pid`` that grows (a new high of its held bytes at 2 ticks or more), or None."""
        f = self._growing.get(pid)
        return f.entry if f is not None and f.highs >= 2 else None

    def _enqueue(self, pid: int, score: float) -> None:
        if pid == os.getpid():
            return
        with self._pending_lock:
            if pid not in self._taken:
                self._pending[pid] = score

    def next_due(self) -> int | None:
        """The due process that grew most past its trigger (first come first among equals), taken."""
        with self._pending_lock:
            if not self._pending:
                return None
            pid = max(self._pending, key=lambda p: self._pending[p])
            del self._pending[pid]
            self._taken.add(pid)
            return pid

    def _loop(self) -> None:
        # Not before every probe is live: a stack taken while the eBPF program still compiles is of a mapping the
        # ledger seeds as pre-existing (never joined to its culprit), and gdb's symbol read would compete with
        # the compile for the node's CPU.
        while not self.ctx.attached.wait(0.25):
            if self._stop.is_set():
                return
        while not self._stop.is_set():
            pid = self.next_due()
            if pid is None:
                self._stop.wait(0.2)
                continue
            short = self._read_outlasts_hunt(pid)
            if short:
                self._record(pid, GdbRun(pid=pid, reason=f"not sampled: {short}", t_start_mono=time.monotonic(),
                                         t_end_mono=time.monotonic()))
                continue
            self._sample(pid)

    def _read_outlasts_hunt(self, pid: int) -> str:
        """Why a full symbol read of ``pid`` (due on growth, no growing call site) would end after the hunt, or
        "" (a call site's read, asked-for samples, or time enough)."""
        attach = self.ctx.session.meta.get("attach_s")
        if not self.on_growth_only or attach is None or self.growing_site(pid) is not None:
            return ""
        left = attach + self.options.duration - self.ctx.session.now()
        size = 0
        for path, _bias in symbol_files(pid):
            with contextlib.suppress(OSError):
                size += os.path.getsize(path)
        need = size / FULL_READ_BYTES_PER_S
        return f"{left:.0f} s of the hunt left, gdb's read of {size >> 20} MB of symbols takes ~{need:.0f} s" \
            if need > left else ""

    def _sample(self, pid: int) -> None:
        session = self.ctx.session
        t0_mono = session.meta["t0_monotonic"]
        index = len(self._runs)

        def t_of(mono: float) -> float:
            return mono - t0_mono

        def on_records(records: list[dict[str, Any]]) -> None:
            rows = [sample_row(r, t_of(r.get("t_mono", time.monotonic())), index)
                    for r in records if r.get("type") == "sample"]
            session.append("gdb_samples", rows)

        site = self.growing_site(pid)
        at: dict[str, Any] = {}
        if site is not None:
            stop_at = site.get("break_at") or site["site"]
            at = {"site": {"address": stop_at, "label": "mmap"},
                  "libraries": stack_libraries(site["frames"]) | libraries_at(pid, (site["site"], stop_at))}
        where = f" at its growing call site {site['site']:#x} (stop at {at['site']['address']:#x})" if site else ""
        self.ctx.log(f"gdb: sampling pid {pid}{where} (up to {self.samples_per_process} stacks, "
                     f"{self.seconds_per_process:.0f} s)")
        try:
            # gdb's config and JSON lines live in the session directory: removed after each run, left
            # there (with gdb's own end record) if leaktrace is killed mid-sampling.
            workdir = session.path / "gdb"
            workdir.mkdir(exist_ok=True)
            run = sample_process(pid, self.samples_per_process, self.seconds_per_process, self.budget,
                                 stop_event=self._stop, on_records=on_records, workdir=str(workdir), **at)
        except NoSuchProcess:
            return
        except GdbUnavailable as e:
            self._failures.append(str(e))
            self.ctx.warn(f"gdb: {e}")
            run = GdbRun(pid=pid, reason=f"attach failed: {e.message}", t_start_mono=time.monotonic(),
                         t_end_mono=time.monotonic())
        self._record(pid, run)

    def _record(self, pid: int, run: GdbRun) -> None:
        session = self.ctx.session
        t0_mono = session.meta["t0_monotonic"]
        with self._lock:
            index = len(self._runs)
            self._runs.append(run)
        session.append("gdb_runs", run_row(run, index, lambda mono: mono - t0_mono))
        self.ctx.live.gdb = {"runs": len(self._runs), "samples": sum(r.samples for r in self._runs),
                                "paused_s": sum(r.paused_s + r.attach_s for r in self._runs)}
        self.ctx.log(f"gdb: pid {pid} done: {run.samples} stacks, {run.stops} stops, "
                     f"paused {run.paused_s * 1000:.1f} ms + attach {run.attach_s * 1000:.0f} ms ({run.reason})")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def summary(self) -> dict[str, Any]:
        with self._lock:
            runs = list(self._runs)
        return {"runs": len(runs), "samples": sum(r.samples for r in runs),
                "stops": sum(r.stops for r in runs), "paused_s": sum(r.paused_s for r in runs),
                "attach_s": sum(r.attach_s for r in runs), "reasons": [r.reason for r in runs],
                "python": sorted({r.python for r in runs if r.python}), "failures": self._failures}


@dataclass
class SiteGrowth:
    """How one call site's held bytes went in the ledger's top sites: first and last seen, the highest, the
    new highs since it last fell back, and its latest top_sites entry (stack, where to stop)."""

    first: int
    last: int
    highest: int
    highs: int
    entry: dict[str, Any]

    @property
    def grown(self) -> int:
        return self.last - self.first

    def see(self, e: dict[str, Any]) -> None:
        n = e["bytes"]
        if n < self.first:  # fell back: churn, not growth
            self.first, self.highs, self.highest = n, 0, n
        elif n > self.highest:
            self.highs, self.highest = self.highs + 1, n
        self.last, self.entry = n, e

    def rank(self) -> tuple[bool, int]:
        """Sites past the trigger's count of new highs first, then by growth."""
        return self.highs >= SITE_TRIGGER_TICKS, self.grown


def libraries_at(pid: int, addresses: tuple[int, ...]) -> set[str]:
    """The file names (as mapped) holding ``addresses`` in ``pid``: gdb needs the symbols of the library it
    stops in and of the site's own, whatever the ledger's frames of the site hold."""
    try:
        maps = procfs.read_maps(pid)
    except LeaktraceError:
        return set()
    return {os.path.basename(m.path) for m in maps for a in addresses
            if m.start <= a < m.end and m.path.startswith("/")}


def stack_libraries(frames: list[str]) -> set[str]:
    """The files a ledger stack ("lib!sym+0x12", "lib+0x40", "?@0x…") passes through: what gdb must read to
    unwind it (the executable it reads anyway)."""
    return {f.split("!", 1)[0] if "!" in f else f.rsplit("+", 1)[0] for f in frames
            if f and not f.startswith(("?", "["))}
