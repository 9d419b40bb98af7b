"""Python objects or native memory, with the default hunt (no --pyheap): real Python processes (the repo's
.venv Python), each keeping its own ground truth.

* a script growing a list of instances of its own class (~1 MB/s): top culprit ``python-heap``, the class
  listed with a count delta within ±15% of what the script held over the hunt's window, the rate within
  ±25% of the process's growth measured here from /proc, and the libc malloc growth under those objects
  folded in (not a separate culprit);
* a script leaking native memory through a C library called with ctypes (libshape.so: mremap'd buffer +
  mmap'd guard pages, and malloc'd blocks): a native culprit naming libshape.so, no ``python-heap``;
* a script creating objects and freezing them with gc.freeze() again and again (seed 000): the frozen
  growth reported, against the freeze count the script logged.

The three hunts run in parallel (one module fixture).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import LEAKTRACE, REPO, Proc, is_root
from fixtures.build import build

HUNT_S = 40

# Instances of its own class, each holding a 1000-byte payload (~1.1 MB/s at 1000 objects/s). Logs
# "monotonic_time objects_held" every 0.1 s.
GROWER = r"""
import os, sys, time
class LeakyRecord:
    __slots__ = ("payload", "n")
    def __init__(self, n):
        self.payload = bytes(1000)
        self.n = n
keep = []
log = open(sys.argv[1], "w", buffering=1)
print("ready", os.getpid(), flush=True)
t0 = time.monotonic()
while True:
    due = int((time.monotonic() - t0) * 1000)
    while len(keep) < due:
        keep.append(LeakyRecord(len(keep)))
    log.write(f"{time.monotonic()} {len(keep)}\n")
    time.sleep(0.1)
"""

# A native leak from Python: libshape.so maps (mremap'd growing buffer + guard pages) and mallocs, and keeps.
NATIVE = r"""
import ctypes, os, sys, time
lib = ctypes.CDLL(sys.argv[1])
lib.shape_mremap_tick.restype = lib.shape_malloc_tick.restype = ctypes.c_size_t
lib.shape_mremap_tick.argtypes = [ctypes.c_size_t]
lib.shape_malloc_tick.argtypes = [ctypes.c_size_t, ctypes.c_int]
print("ready", os.getpid(), flush=True)
while True:
    lib.shape_mremap_tick(32 * 1024)
    lib.shape_malloc_tick(1000, 30)
    time.sleep(0.05)
"""

# seed 000: objects made, then frozen (gc.freeze()) again and again. Logs "monotonic_time freeze_count".
FREEZER = r"""
import gc, os, sys, time
class CachedEntry:
    def __init__(self, n):
        self.blob = bytes(2000)
        self.n = n
keep = []
log = open(sys.argv[1], "w", buffering=1)
print("ready", os.getpid(), flush=True)
while True:
    keep.extend(CachedEntry(i) for i in range(250))
    gc.freeze()
    log.write(f"{time.monotonic()} {gc.get_freeze_count()}\n")
    time.sleep(0.5)
"""


def _truth_at(log: Path, t: float) -> float:
    """The logged figure at monotonic time ``t`` (linear between the two lines around it)."""
    rows = np.array([[float(a) for a in line.split()] for line in log.read_text().splitlines() if len(line.split()) == 2])
    return float(np.interp(t, rows[:, 0], rows[:, 1]))


class RssSampler(threading.Thread):
    """The target's RSS from /proc/PID/status every 0.5 s: the growth these tests measure themselves."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.rows, self.stop = pid, [], threading.Event()  # type: ignore[var-annotated]

    def run(self) -> None:
        while not self.stop.wait(0.5):
            try:
                kb = next(int(line.split()[1]) for line in open(f"/proc/{self.pid}/status")
                          if line.startswith("VmRSS:"))
            except (OSError, StopIteration):
                return
            self.rows.append((time.monotonic(), kb * 1024))

    def mb_per_min(self, t0: float, t1: float) -> float:
        pts = np.array([r for r in self.rows if t0 <= r[0] <= t1])
        slope = np.polyfit(pts[:, 0], pts[:, 1], 1)[0]
        return float(slope * 60 / 2**20)


@pytest.fixture(scope="module")
def hunts(tmp_path_factory):
    if not is_root():
        pytest.skip("the default hunt needs root (eBPF)")
    d = tmp_path_factory.mktemp("pyvsnative")
    # the shapes_bin fixture's vendor library (same build: stripped, no frame pointers), loaded by ctypes
    lib = build("libshape.so", ["shapes_lib.c"], cflags=["-fomit-frame-pointer"], ldflags=["-lpthread"],
                shared=True, strip=True)
    targets = {
        "python": Proc([sys.executable, "-c", GROWER, str(d / "python.log")]),
        "native": Proc([sys.executable, "-c", NATIVE, str(lib)]),
        "frozen": Proc([sys.executable, "-c", FREEZER, str(d / "frozen.log")]),
    }
    samplers = {k: RssSampler(p.pid) for k, p in targets.items()}
    try:
        for s in samplers.values():
            s.start()
        procs = {k: subprocess.Popen([*LEAKTRACE, "hunt", "--pid", str(p.pid), "--duration", str(HUNT_S),
                                      "--out", str(d / k), "--format", "json,md", "-q"],
                                     cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for k, p in targets.items()}
        out = {}
        for k, h in procs.items():
            stdout, stderr = h.communicate(timeout=HUNT_S + 180)
            assert h.returncode == 0, (k, stdout, stderr)
            rep = json.loads((d / k / "report.json").read_text())
            meta = json.loads((d / k / "meta.json").read_text())
            out[k] = {"report": rep, "t0": meta["t0_monotonic"], "pid": targets[k].pid, "log": d / f"{k}.log",
                      "rss": samplers[k]}
        return out
    finally:
        for s in samplers.values():
            s.stop.set()
        for p in targets.values():
            p.kill()


def _python_culprits(rep: dict) -> list[dict]:
    return [c for c in rep["culprits"] if c["kind"] == "python-heap"]


def test_python_objects_are_python_heap_with_their_type(hunts):
    h = hunts["python"]
    rep = h["report"]
    assert rep["verdict"] == "leak", rep.get("verdict_reason")
    assert "pyheap" in rep["probes"], rep["probes"]  # on by default
    top = rep["culprits"][0]
    assert top["kind"] == "python-heap" and top["pid"] == h["pid"], (rep["culprits"], rep["processes"])
    py = top["python"]
    t0, t1 = py["window_s"]
    truth = _truth_at(h["log"], h["t0"] + t1) - _truth_at(h["log"], h["t0"] + t0)
    (mine,) = [t for t in py["types"] if t["type"] == "LeakyRecord"]
    assert py["types"][0]["type"] == "LeakyRecord", py["types"]
    assert mine["count_delta"] == pytest.approx(truth, rel=0.15), (mine, truth)
    assert any("LeakyRecord +" in e for e in top["evidence"]), top["evidence"]
    # The rate is the process's growth, as /proc shows it here.
    proc_rate = h["rss"].mb_per_min(h["t0"] + t0, h["t0"] + t1)
    assert top["mb_per_min"] == pytest.approx(proc_rate, rel=0.25), (top["mb_per_min"], proc_rate)
    # libc's malloc under those objects is the same memory: folded in, not a separate leak.
    assert not [c for c in rep["culprits"] if c["pid"] == h["pid"] and c["kind"] == "malloc-heap"], rep["culprits"]
    assert not py["frozen"]["growing"]


def test_native_leak_in_python_stays_native(hunts):
    h = hunts["native"]
    rep = h["report"]
    assert rep["verdict"] == "leak", rep.get("verdict_reason")
    assert "pyheap" in rep["probes"], rep["probes"]
    assert _python_culprits(rep) == [], rep["culprits"]
    assert rep["culprits"][0]["kind"] in ("native-mmap", "malloc-heap"), rep["culprits"][0]
    named = [c for c in rep["culprits"] if c["library"] == "libshape.so"]
    assert named and named[0]["kind"] == "native-mmap", rep["culprits"]
    # The Python heap was read and says the objects do not explain the growth.
    (proc,) = [p for p in rep["processes"] if p["pid"] == h["pid"]]
    assert "python" in proc, proc
    assert any("Python objects do not explain it" in e for c in rep["culprits"] for e in c["evidence"]), rep["culprits"]


def test_gc_freeze_growth_is_reported(hunts):
    h = hunts["frozen"]
    rep = h["report"]
    assert rep["verdict"] == "leak", rep.get("verdict_reason")
    top = rep["culprits"][0]
    assert top["kind"] == "python-heap" and top["pid"] == h["pid"], (rep["culprits"], rep["processes"])
    py = top["python"]
    t0, t1 = py["window_s"]
    truth = _truth_at(h["log"], h["t0"] + t1) - _truth_at(h["log"], h["t0"] + t0)
    fz = py["frozen"]
    assert fz["growing"] is True, py
    assert fz["count_delta"] == pytest.approx(truth, rel=0.15), (py, truth)
    (mine,) = [t for t in py["types"] if t["type"] == "CachedEntry"]
    assert mine["frozen_delta"] > 0.8 * mine["count_delta"] > 0, py
    assert any(e.startswith("gc.freeze: the growth is frozen") for e in top["evidence"]), top["evidence"]



# --------------------------------------------------------------------------- the decision, on numbers

def _tg(objects_per_min: float, walks: int = 5, confidence: float = 1.0) -> dict:
    return {"objects_per_min": objects_per_min, "walks": walks, "confidence": confidence, "window_s": [0.0, 40.0],
            "objects_first": 1000, "objects_last": 1000 + int(objects_per_min * 40 / 60),
            "types": [{"type": "Thing", "count_first": 0, "count_last": int(objects_per_min * 40 / 60),
                       "count_delta": int(objects_per_min * 40 / 60), "per_min": objects_per_min, "frozen_delta": 0}]}


def test_explains_needs_objects_that_can_hold_the_growth():
    from leaktrace.analysis.pyobjects import MAX_BYTES_PER_OBJECT, explains

    assert explains(_tg(60_000), 60.0)  # ~1 KiB a new object: Python objects
    # A native leak of 60 MB/min in a process that also makes 100 objects a minute: ~600 KiB an object.
    assert 60.0 * 2**20 / 100 > MAX_BYTES_PER_OBJECT and not explains(_tg(100), 60.0)
    assert not explains(_tg(60_000, confidence=0.5), 60.0)  # objects up and down: no steady growth
    assert not explains(None, 60.0)


def test_fold_keeps_candidates_that_name_another_library():
    from leaktrace.analysis.candidates import Candidate
    from leaktrace.analysis.pyobjects import fold_native

    py = Candidate(kind="python-heap", pid=7, mb_per_min=60.0, source="pyheap", python=True,
                   extra={"explained": True})
    libc = Candidate(kind="malloc-heap", pid=7, mb_per_min=58.0, source="ledger", library="libc.so.6",
                     stack=["libc.so.6!brk+0x7", "libc.so.6!sbrk+0x95"], python=True)
    vendor = Candidate(kind="native-mmap", pid=7, mb_per_min=5.0, source="ledger", library="libc.so.6",
                       stack=["libc.so.6!mmap64+0x13", "libshape.so!shape_mremap_tick+0x102"], python=True)
    other_pid = Candidate(kind="malloc-heap", pid=8, mb_per_min=9.0, source="ledger", library="libc.so.6", python=True)
    kept = fold_native([py], [libc, vendor, other_pid], {7: _tg(60_000)})
    assert kept == [vendor, other_pid]
    assert py.extra["folded"] == [{"kind": "malloc-heap", "library": "libc.so.6", "source": "ledger",
                                   "mb_per_min": 58.0}]
    assert any("not a separate leak" in e for e in py.evidence)


def test_heap_grown_by_the_interpreter_while_objects_stay_flat_is_native(tmp_path):
    """A ctypes library mallocs and keeps while Python churns a bounded dict: the dict's resizes cross malloc's
    top, so the heap's growth is the interpreter's allocator's call, yet the walks count no more objects. Not
    "Python objects, native layer innocent": native memory, and the evidence says so."""
    from leaktrace.analysis.candidates import Candidate
    from leaktrace.analysis.culprits import explain
    from leaktrace.analysis.pyobjects import fold_native
    from leaktrace.analysis.rules import load_rules

    heap = Candidate(kind="malloc-heap", pid=7, mb_per_min=18.0, source="ledger", library="libpython3.11.so.1.0",
                     stack=["libc.so.6!brk+0x7", "libc.so.6!malloc+0x19a", "libpython3.11.so.1.0!_PyObject_Malloc+0x78"],
                     python=True)
    flat = {**_tg(0.0), "types": []}
    (kept,) = fold_native([], [heap], {7: flat})
    out = explain(kept, load_rules(), _EmptyReader())
    assert (out["rule"], out["kind"]) == ("python-process-native-heap", "malloc-heap"), out
    assert "Native layer innocent" not in out["remedy"] and "native" in out["finding"]
    assert any("Python objects do not explain it" in e for e in out["evidence"])
    # without walks that say so, the interpreter's allocator is taken at its word
    bare = Candidate(kind="malloc-heap", pid=8, mb_per_min=18.0, source="ledger", library="libpython3.11.so.1.0",
                     stack=list(heap.stack), python=True)
    assert explain(bare, load_rules(), _EmptyReader())["rule"] == "python-interpreter-mmap"


class _EmptyReader:
    """A session with no tables: what explain() may read beside the candidate."""

    meta: dict = {}

    def table(self, name: str):
        import pandas as pd

        return pd.DataFrame()

    def tables(self) -> list[str]:
        return []

