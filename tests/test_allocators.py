"""Allocators in glibc malloc's place: a real process with jemalloc or tcmalloc preloaded, leaking through
malloc from libcorpusleak.so, is named by the library that called malloc (not by the allocator, whose own
code maps the memory), as a malloc-heap culprit; the report says which allocator serves malloc, how it came
in and its settings, and that its books are not read from outside. Which allocator a process maps is told
by a pure function, checked on maps and environments as /proc shows them."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, run_cli

from leaktrace.probes.mallocstate.allocators import other_allocator
from leaktrace.procfs import Mapping

LIBDIR = Path("/usr/lib/x86_64-linux-gnu")
JEMALLOC = LIBDIR / "libjemalloc.so.2"
TCMALLOC = LIBDIR / "libtcmalloc_minimal.so.4"
LEAK_MB_PER_MIN = 60.0
MB = 1024 * 1024


def _map(path: str, perms: str = "r-xp") -> Mapping:
    return Mapping(start=0x7F0000000000, end=0x7F0000100000, perms=perms, offset=0, dev="08:01", inode=1,
                   path=path)


def test_other_allocator_reads_maps_and_environment():
    libc = _map("/usr/lib/x86_64-linux-gnu/libc.so.6")
    assert other_allocator([libc], {}) is None
    je = other_allocator([libc, _map(str(JEMALLOC))],
                         {"LD_PRELOAD": str(JEMALLOC), "MALLOC_CONF": "dirty_decay_ms:1000"})
    assert je is not None and (je.name, je.how) == ("jemalloc", "preloaded (LD_PRELOAD)")
    assert je.settings == "MALLOC_CONF=dirty_decay_ms:1000"
    # LD_PRELOAD names the file as given; the maps show the file it resolves to
    tc = other_allocator([_map("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.10")],
                         {"LD_PRELOAD": "libtcmalloc_minimal.so.4", "TCMALLOC_RELEASE_RATE": "10"})
    assert tc is not None and (tc.name, tc.how, tc.settings) == ("tcmalloc", "preloaded (LD_PRELOAD)",
                                                                 "TCMALLOC_RELEASE_RATE=10")
    linked = other_allocator([_map("/opt/app/lib/libmimalloc.so.2")], {"LD_PRELOAD": ""})
    assert linked is not None and (linked.name, linked.how) == ("mimalloc", "linked")
    assert "glibc's books do not apply" in linked.line()


@pytest.fixture(scope="module")
def corpus_gen() -> Path:
    sys.path.insert(0, str(REPO))
    from bench.verdict_corpus.record import build_generators

    return build_generators()[1]


def _leaked(truth: Path, t0: float, t1: float) -> float:
    rows = np.array([[float(x) for x in line.split()[:2]] for line in truth.read_text().splitlines()
                     if line.strip() and not line.startswith("#")])
    keep = (rows[:, 0] >= t0) & (rows[:, 0] <= t1)
    return float(rows[keep, 1].max() - rows[keep, 1].min())


@pytest.mark.bpf
@pytest.mark.skipif(not (JEMALLOC.exists() and TCMALLOC.exists()), reason="libjemalloc2 / libtcmalloc-minimal4 "
                    "not installed (.ci/setup.d/35-allocators.sh)")
def test_leaks_under_jemalloc_and_tcmalloc_name_the_caller_of_malloc(spawn, corpus_gen, tmp_path):
    procs = {}
    for name, lib, env in (("jemalloc", JEMALLOC, {"MALLOC_CONF": "dirty_decay_ms:1000"}),
                           ("tcmalloc", TCMALLOC, {})):
        truth = tmp_path / f"{name}.txt"
        p = spawn([corpus_gen, "noise=none", "leak_kind=malloc", f"leak_mb_min={LEAK_MB_PER_MIN}", "duration=120",
                   "seed=3", f"truth={truth}"], env={"LD_PRELOAD": str(lib), **env}, ready=None)
        procs[name] = (p.pid, truth, env)
    out = tmp_path / "s"
    r = run_cli("hunt", *[a for pid, _, _ in procs.values() for a in ("--pid", pid)], "--duration", 30,
                "--no-gdb", "--format", "json", "--out", out)
    assert r.returncode == 0, r.stderr
    rep = json.loads((out / "report.json").read_text())
    meta = json.loads((out / "meta.json").read_text())
    t0 = meta["t0_monotonic"] + (meta.get("attach_s") or 0.0)  # attach; duration_s counts from it
    t1 = t0 + meta["duration_s"]
    by_pid = {p["pid"]: p for p in rep["processes"]}
    for name, (pid, truth, env) in procs.items():
        assert by_pid[pid]["allocator"] == name
        mine = [c for c in rep["culprits"] if c["pid"] == pid]
        assert mine, (name, rep["verdict_reason"])
        top = mine[0]
        # the allocator maps the memory; the code that called malloc is named
        assert (top["library"], top["kind"]) == ("libcorpusleak.so", "malloc-heap"), (name, top)
        assert not any(os.path.basename(str(c["library"])).startswith(("libjemalloc", "libtcmalloc")) for c in mine)
        line = next(e for e in top["evidence"] if e.startswith("malloc is"))
        assert f"{name}'s (preloaded (LD_PRELOAD)" in line and "glibc's books do not apply" in line
        assert all(f"{k}={v}" in line for k, v in env.items())
        leaked = _leaked(truth, t0, t1)
        assert leaked / MB == pytest.approx(LEAK_MB_PER_MIN * (t1 - t0) / 60, rel=0.2)  # the fixture keeps its pace
        # what it holds in RAM of what it leaked since attach
        assert top["outstanding_resident_bytes"] == pytest.approx(leaked, rel=0.2), name
