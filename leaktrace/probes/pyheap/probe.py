"""The pyheap probe (on by default, ``hunt --no-pyheap`` turns it off): Python GC state of Python targets,
read from outside, with the objects counted by type.

What it tells: per generation the GC count (``gc.get_count()``), threshold, number of tracked objects and
collection statistics (``gc.get_stats()``), whether GC is enabled, and the frozen object count
(``gc.get_freeze_count()``: is the start-up heap frozen, as vLLM's API server, EngineCore and workers
freeze it?), and on each walk of the GC lists the objects counted by type (each object's ``ob_type`` →
``tp_name``, read in the same pass). Growth of tracked objects, or of the frozen set, points at
Python-level growth, and the growing types say which objects; flat ones with growing RSS point at native
memory (analysis.pyobjects decides).

Why this way (the safety choice): the usual in-process query — gdb ``call PyGILState_Ensure()`` then
``PyRun_SimpleString`` — stops the process and runs code inside it; if a thread was stopped inside
malloc or holding the GIL's mutex the injected call deadlocks or corrupts the target, and Python 3.11 has
no ``sys.remote_exec`` (3.14). So we run no code in the target and never stop it: we read the
interpreter's ``_PyRuntime → interpreters.main → gc`` state through ``/proc/PID/mem``. Structure
offsets come from the interpreter library's own DWARF (``gdb -batch`` on the *file*, not the process;
pyenv and Debian's -dbg builds have it), else from a built-in table for CPython 3.11 on x86-64. Counters
are exact reads of ints; the tracked-object counts walk the GC lists while the target runs, so they are
approximate (bounded walk, ``approximate: true``). Collection *times* are not kept by CPython 3.11 and are
not measurable from outside (vLLM's ``VLLM_GC_DEBUG`` logs them in-process).
"""

from __future__ import annotations

import struct
import threading
import time
from collections import deque
from typing import Any

import numpy as np

from leaktrace import procfs
from leaktrace.errors import LeaktraceError
from leaktrace.probes import HuntContext, HuntOptions, ProbeBase
from leaktrace.probes.pyheap.client import WalkerGone, WalkerProcess
from leaktrace.probes.pyheap.interpreter import PY_LIB_RE, Interpreter, locate, read_python_heap
from leaktrace.slope import theil_sen


def _looks_like_python(pid: int) -> bool:
    try:
        return bool(PY_LIB_RE.search(procfs.exe_path(pid)))
    except LeaktraceError:
        return False


class PyHeapProbe(ProbeBase):
    """On for Python targets unless ``--no-pyheap``. Every tick: the GC counters (a few reads). The walk of
    every GC list with the objects counted by type (``pyheap_types``) runs in the walker process
    (:class:`WalkerProcess`: not in the hunt's interpreter, whose GIL it would hold against the ticks and the
    eBPF ring's consumer), asked by a thread of the probe that only waits for the answer; per process at most
    ``WALK_DUTY`` of the time (a walk costs ~0.8 µs per object: ~0.1 s for 120k objects, ~0.6 s for
    vLLM's ~660k frozen ones, walked again only when the set changed or every FROZEN_REWALK_S) and not
    more often than every ``MIN_WALK_GAP_S``; right after attach, and at stop. ``IN_PROCESS``: the walks
    in the probe's thread instead (for bench_pyheap's comparison)."""

    name = "pyheap"
    MIN_WALK_GAP_S = 5.0
    WALK_DUTY = 0.02
    # All processes together: the walker's CPU seconds at most this share of one core (a node serving vLLM
    # has 8 Python processes: per-process duty alone would let the walks take 0.16 of a core). One walk at a
    # time, the process walked longest ago first, the first one FIRST_WALK_S after attach: the walks are
    # spread over the hunt, none delays its start. The same share as one process's WALK_DUTY: a lone target
    # is walked as often as before, and on a P/D node the walker stays a fifth of the hunt's 0.10 core.
    TOTAL_WALK_DUTY = 0.02
    FIRST_WALK_S = 1.0
    LOCATE_RETRY_S = 5.0  # a process whose interpreter was not found (not up yet, an exec) is looked at again
    IN_PROCESS = False
    WALK_BUDGET_S = 120.0  # a walk in the walker process: it delays nothing of the hunt, and a niced walk of
    # ~700k objects takes 12-20 s on 2 cores kept busy by 2 CPU hogs and a loaded machine
    # (bench_pyheap_ticklag)
    # The walks at stop, all processes together: the longest of the probes' stops, which the hunt's end waits
    # for. Those walked during the hunt, longest ago first: their frozen set is kept, so the walk is of the
    # young lists, cheap, and the second point a growth needs. Then first walks, only while the walks' CPU
    # stays within TOTAL_WALK_DUTY of the hunt so far: a first walk is one point, no growth, and on a vLLM
    # node ~0.7 s of CPU per process for its 610-670k frozen objects. The rest get their counters.
    STOP_WAIT_S = 5.0
    # ... and of those walked during the hunt, only one whose anonymous memory grew at this rate or more (the
    # leak threshold's order; its walks may explain the growth), or while the share allows: objects counted
    # again in a process whose memory stays flat explain no growth, and at 24 torch workers those second walks
    # took ~0.3 s of CPU each outside the share. Growing processes are walked first.
    STOP_REWALK_MB_PER_MIN = 1.0
    MEMORY_POINTS = 300  # per process, the latest ticks' anonymous bytes (the watcher's rollup)
    MAX_WALKER_FAILS = 3  # walker processes that did not answer, in a row: the walks stop (counters go on)

    def __init__(self, options: HuntOptions) -> None:
        self.options = options
        self.ctx: HuntContext | None = None
        self.python_pids: dict[int, bool] = {}
        self.last: dict[int, dict[str, Any]] = {}
        self._walked: dict[int, tuple[float, float]] = {}  # pid -> (end of the last walk, its cost in s)
        # pid -> its interpreter, located once: re-reading /proc/PID/maps every tick costs ~12 ms for a
        # process with 3,000 mappings (vLLM's have thousands)
        self._where: dict[int, Interpreter] = {}
        self.walks = 0
        self.walk_s = 0.0
        self.walk_cpu_s = 0.0  # the walks' CPU (their wall time where the walker did not say)
        self._live_at: float | None = None  # monotonic: when every probe was live (the walks' share counts from)
        self.frozen_kept = 0  # walks that reused the frozen set's last walk
        self.walker: WalkerProcess | None = None
        self._walker_fails = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._located_at: dict[int, float] = {}  # pid -> when its interpreter was last looked for
        self._next_walk_at = 0.0  # monotonic: the next walk of any process (TOTAL_WALK_DUTY)
        self._memory: dict[int, deque[tuple[float, int]]] = {}  # pid -> (t, anonymous bytes), per tick

    def start(self, ctx: HuntContext) -> None:
        """Nothing is read here: finding each interpreter (its maps, the ELF symbols, DWARF through gdb:
        seconds for 8 vLLM processes) and the walks run in the probe's thread, once the hunt is live
        (``ctx.attached``: the eBPF program compiles after this start, and on a loaded node every second of
        CPU taken beside it is a second more before the ledger traces)."""
        self.ctx = ctx
        if not self.IN_PROCESS:
            # Started from the hunt's own thread (it lives until stop): PR_SET_PDEATHSIG fires when the
            # thread that started the worker ends. Only when a target looks like Python (else the first walk
            # starts it); its interpreter starts while the hunt goes on.
            self.walker = WalkerProcess()
            try:
                if any(_looks_like_python(pid) for pid in ctx.targets.live()):
                    self.walker.spawn()
            except OSError as e:
                ctx.warn(f"pyheap: no walker process ({e}): GC counters only, no object types")
                self._walker_fails = self.MAX_WALKER_FAILS
        self._thread = threading.Thread(target=self._walker, name="pyheap-walk", daemon=True)
        self._thread.start()

    def _walker(self) -> None:
        assert self.ctx is not None
        while not self.ctx.attached.wait(0.25):
            if self._stop.is_set():
                return
        self._live_at = time.monotonic()
        self._next_walk_at = self._live_at + self.FIRST_WALK_S
        logged = False
        while True:
            try:
                self._locate_new()
                if not logged and self.python_pids and self.ctx is not None:
                    logged = True
                    n = sum(1 for v in self.python_pids.values() if v)
                    if n:
                        self.ctx.log(f"pyheap: {n} Python process(es), GC state and object types read from "
                                     "memory (no code run in the targets, never stopped)")
                if self._stop.wait(0.25):
                    return
                self._sample("due")
            except Exception as e:  # the walker ending must not end the hunt
                if self.ctx is not None:
                    self.ctx.warn(f"pyheap walk: {e.__class__.__name__}: {e}")
                return

    def _locate_new(self) -> None:
        """Find the interpreter of each live process not located yet (not Python: never looked at again)."""
        assert self.ctx is not None
        rows = []
        for pid in self.ctx.targets.live():
            if self._stop.is_set():
                break
            if pid in self._where or self.python_pids.get(pid) is False:
                continue
            if time.monotonic() - self._located_at.get(pid, float("-inf")) < self.LOCATE_RETRY_S:
                continue
            self._located_at[pid] = time.monotonic()
            try:
                found = locate(pid)
            except (LeaktraceError, OSError, ValueError, KeyError):
                continue
            if isinstance(found, Interpreter):
                self._where[pid] = found
                self.python_pids[pid] = True
                continue
            self.python_pids[pid] = bool(found.get("python"))
            if found.get("python"):  # Python without usable offsets: the row says why
                found["t"] = self.ctx.session.now()
                with self._lock:
                    if "error" in found and pid not in self.last:
                        self.ctx.warn(f"pyheap: pid {pid}: {found['error']}")
                    self.last[pid] = found
                rows.append(found)
        self.ctx.session.append("pyheap", rows)

    def _walk_due(self, pid: int, now: float) -> bool:
        end, cost = self._walked.get(pid, (float("-inf"), 0.0))
        return now - end >= max(self.MIN_WALK_GAP_S, cost / self.WALK_DUTY)

    def _next_due(self, now: float) -> int | None:
        """The one process to walk now: none before the walks' shared gap has passed, else the one due that
        was walked longest ago."""
        assert self.ctx is not None
        if time.monotonic() < self._next_walk_at:
            return None
        due = [pid for pid in self.ctx.targets.live() if pid in self._where and self._walk_due(pid, now)]
        return min(due, key=lambda pid: self._walked.get(pid, (float("-inf"), 0.0))[0], default=None)

    def _sample(self, mode: str, stop_by: float = 0.0) -> None:
        """``counters`` (every tick), ``due`` (the walks due, from the walker thread) or ``all`` (at stop, until
        ``stop_by``: a walk of each process walked during the hunt, first walks of others within the walks'
        share (STOP_WAIT_S), the counters of the rest)."""
        assert self.ctx is not None
        session = self.ctx.session
        rows, type_rows = [], []
        pids = self.ctx.targets.live()
        if mode == "due":
            one = self._next_due(session.now())
            pids = [] if one is None else [one]
        elif mode == "all":  # growing, then walked longest ago first: the stop's time may not reach every one
            grows = {pid: self._grows(pid) for pid in pids}
            pids.sort(key=lambda pid: (not grows[pid], self._walked.get(pid, (float("inf"), 0.0))[0]))
        for pid in pids:
            if self.python_pids.get(pid) is False:
                continue
            if mode == "counters" and pid not in self._where:
                continue  # located by the probe's thread
            t0 = session.now()
            walk = mode == "due" or (mode == "all" and ((pid in self._walked and grows[pid]) or self._share_left()))
            if walk and not self.IN_PROCESS and self._walker_fails >= self.MAX_WALKER_FAILS:
                if mode == "due":
                    continue
                walk = False  # at stop: the counters
            try:
                where = self._where.get(pid)
                if where is None:
                    found = locate(pid)
                    if isinstance(found, Interpreter):
                        where = self._where[pid] = found
                if where is None:
                    st = found
                elif walk and not self.IN_PROCESS:
                    st = self._walk_out(pid, where, mode, stop_by)
                    if st is None:
                        if mode != "all":
                            continue
                        walk, st = False, read_python_heap(pid, walk=False, where=where)  # at stop: the counters
                else:
                    st = read_python_heap(pid, walk=walk, where=where)
            except (LeaktraceError, OSError, ValueError, KeyError, struct.error):
                self._where.pop(pid, None)
                if self.walker is not None:
                    self.walker.forget(pid)
                continue
            if st.pop("frozen_walked", True) is False:
                with self._lock:
                    self.frozen_kept += 1
            if "error" in st:
                self._where.pop(pid, None)  # located again next time (an exec, an interpreter not up yet)
            t1 = session.now()
            self.python_pids[pid] = bool(st.get("python"))
            if not st.get("python"):
                continue
            st["t"] = (t0 + t1) / 2 if walk else t1
            cpu = st.pop("cpu_s", None)
            if walk and "walk_ms" in st:
                # the walk's own cost (the first read also finds the structure offsets: once per file)
                cost = st["walk_ms"] / 1000
                spent = cost if cpu is None else cpu
                with self._lock:
                    self._walked[pid] = (t1, cost)
                    self.walks += 1
                    self.walk_s += cost
                    self.walk_cpu_s += spent
                    self._next_walk_at = time.monotonic() + spent / self.TOTAL_WALK_DUTY
            types = st.pop("types", None)
            if types:
                type_rows += [{"t": st["t"], "pid": pid, "type": name, "count": n, "frozen": f}
                              for name, (n, f) in types.items()]
            with self._lock:
                if "frozen" not in st and "frozen" in self.last.get(pid, {}):
                    st["frozen"] = self.last[pid]["frozen"]  # as of the last walk
                if "error" in st and pid not in self.last:
                    self.ctx.warn(f"pyheap: pid {pid}: {st['error']}")
                self.last[pid] = st
            rows.append(st)
        session.append("pyheap", rows)
        session.append("pyheap_types", type_rows)

    def _share_left(self) -> bool:
        """The walks' CPU so far is within TOTAL_WALK_DUTY of the hunt's time since it was live."""
        return self._live_at is not None and \
            self.walk_cpu_s < self.TOTAL_WALK_DUTY * (time.monotonic() - self._live_at)

    def _walk_out(self, pid: int, where: Interpreter, mode: str, stop_by: float) -> dict[str, Any] | None:
        """The walk of ``pid`` in the walker process; None when it gave no answer (said once; after
        MAX_WALKER_FAILS in a row the walks stop)."""
        assert self.walker is not None and self.ctx is not None
        with self.walker.lock:
            try:
                if mode == "all":  # at stop: bounded, all processes together
                    left = stop_by - time.monotonic()
                    if left <= 0:
                        return None
                    # a frozen set whose ends did not move is not walked again at stop, however old its walk:
                    # 660k objects in each vLLM process would take the stop's whole time
                    st = self.walker.walk(pid, where, budget=min(5.0, left), wait=left, frozen_max_age=1e9)
                else:
                    st = self.walker.walk(pid, where, budget=self.WALK_BUDGET_S, stop=self._stop)
            except WalkerGone as e:
                if mode == "due" and self._stop.is_set():
                    return None  # the stop came during the walk: its answer is dropped, the worker kept
                if mode == "all":
                    # the stop's time ran out: a fresh worker would walk every frozen set again from nothing (the
                    # stop closes this one)
                    self._walker_fails = self.MAX_WALKER_FAILS
                    return None
                self._walker_fails += 1
                self.walker.close()  # a fresh one next time
                if self._walker_fails == 1 or self._walker_fails == self.MAX_WALKER_FAILS:
                    more = " (no more walks: GC counters only)" if self._walker_fails >= self.MAX_WALKER_FAILS else ""
                    self.ctx.warn(f"pyheap: walk of pid {pid}: {e}{more}")
                return None
        self._walker_fails = 0
        return st

    def _grows(self, pid: int) -> bool:
        """``pid``'s anonymous memory grew at STOP_REWALK_MB_PER_MIN or more over the latest ticks (True when
        fewer than 3 were read: a short hunt walks as before)."""
        points = self._memory.get(pid)
        if points is None or len(points) < 3:
            return True
        t, anon = np.array(points, dtype=float).T
        return theil_sen(t, anon)[0] * 60.0 >= self.STOP_REWALK_MB_PER_MIN * 2**20

    def _note_memory(self) -> None:
        assert self.ctx is not None
        rollup = self.ctx.live.rollup
        for pid in [pid for pid in self._memory if pid not in rollup]:
            del self._memory[pid]  # exited (the watcher publishes every live target)
        for pid, row in rollup.items():
            points = self._memory.setdefault(pid, deque(maxlen=self.MEMORY_POINTS))
            if not points or row["t"] > points[-1][0]:
                points.append((float(row["t"]), int(row.get("anon") or 0)))

    def tick(self, now: float) -> None:
        self._note_memory()
        self._sample("counters")

    def stop(self) -> None:
        stop_by = time.monotonic() + self.STOP_WAIT_S  # the thread's end and the last walks, all together
        self._stop.set()
        if self.walker is not None:
            self.walker.cancel()  # a walk under way would hold the worker (and the walks below) for its budget
        if self._thread is not None:
            self._thread.join(timeout=self.STOP_WAIT_S)  # a walk sees the stop within 0.2 s; a locate may run gdb
        if self.walker is not None:
            self.walker.cancel()  # one the thread asked for between the first cancel and seeing the stop
        if self.walker is not None and self.walker.spawned_in is self._thread:
            self.walker.close()  # started again by the walker thread, which ended: a fresh one for the last walks
        try:
            if self.ctx is not None:
                self._sample("all", stop_by)
        finally:
            if self.walker is not None:
                self.walker.close()

    def summary(self) -> dict[str, Any]:
        keep = ("version", "gc_enabled", "frozen", "tracked", "gen0_count", "gen1_count", "gen2_count",
                "gen2_collections", "error")
        out: dict[str, Any] = {str(pid): {k: s.get(k) for k in keep if k in s} for pid, s in self.last.items()}
        if self.walks:
            out["walks"] = {"count": self.walks, "seconds": round(self.walk_s, 3), "frozen_kept": self.frozen_kept}
        return out
