"""The Python heap state read from outside a live CPython (no code run in it, never stopped)."""

from __future__ import annotations

import json
import sys

from conftest import run_cli

from leaktrace.probes.pyheap.interpreter import read_python_heap
from leaktrace.session import SessionReader

PROGRAM = """
import gc, sys, time
keep = [[i] for i in range(30000)]
gc.freeze()
young = [[i] for i in range(5000)]
gc.disable()  # nothing moves between the count below and the outside read
tracked = len(gc.get_objects())  # every generation (the frozen objects are not in any)
print('ready', gc.get_freeze_count(), tracked, flush=True)
time.sleep(60)
"""


def test_reads_freeze_count_and_gc_state(spawn) -> None:
    p = spawn([sys.executable, "-c", PROGRAM], ready=None)
    first = p.popen.stdout.readline().split()
    assert first[0] == "ready"
    frozen, tracked = int(first[1]), int(first[2])
    st = read_python_heap(p.pid)
    assert st["python"] is True and st["version"] == f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert st["frozen"] == frozen >= 30000  # exactly gc.get_freeze_count()
    assert st["gc_enabled"] is False and st["gen0_threshold"] == 700
    # Every generation walked to its end (a broken walk is -1) and their sum is len(gc.get_objects())
    # as the target counted it, give or take the few objects made while printing it.
    assert all(st[f"gen{g}_tracked"] >= 0 for g in range(3)), st
    assert sum(st[f"gen{g}_tracked"] for g in range(3)) == st["tracked"]
    assert tracked >= 5000 and abs(st["tracked"] - tracked) <= 10, (st["tracked"], tracked)
    assert st["approximate"] is True
    assert p.popen.poll() is None  # never stopped, still running


def test_not_python(spawn) -> None:
    p = spawn(["sleep", "30"], ready=None)
    assert read_python_heap(p.pid) == {"pid": p.pid, "python": False}


def test_hunt_pyheap_table(spawn, tmp_path) -> None:
    p = spawn([sys.executable, "-c", "import gc,time; gc.freeze(); print('ready', flush=True); time.sleep(60)"])
    out = tmp_path / "h"
    r = run_cli("hunt", "--pid", p.pid, "--duration", "3", "--no-bpf", "--no-gdb", "--pyheap", "--out", out,
                "--format", "json", timeout=120)
    assert r.returncode == 0, r.stderr
    ph = SessionReader(out).table("pyheap")
    assert (ph["pid"] == p.pid).any()
    # The frozen count comes from the walks (the walker thread's first one right after attach, one at stop);
    # counter rows read before the first walk ended carry none, every later row the last walk's figure.
    walked = ph[ph["frozen"].notna()]
    assert len(walked) >= 2 and (walked["frozen"] > 1000).all(), ph[["t", "frozen", "tracked"]]
    assert (SessionReader(out).table("pyheap_types")["pid"] == p.pid).any()
    json.loads((out / "report.json").read_text())
