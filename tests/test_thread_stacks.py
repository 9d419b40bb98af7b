"""Thread stacks of threads nobody joins: named to the library that starts the threads, rated by what they
keep resident (checked against the fixture's own bookkeeping and /proc), with the address space they map
beside it — on a real process with the default probes (tests/fixtures/thread_stacks.c)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import is_root, run_cli
from shapes_helpers import TruthLog

from leaktrace.analysis.threadstacks import stack_shape
from leaktrace.procfs import parse_maps
from leaktrace.session import SessionReader

MB = 1024 * 1024
KIB = 1024
TLS_KIB = 256  # what each exited thread keeps resident, besides glibc's descriptor and top frames
THREADS_PER_S = 4.0  # 60 MB/min resident, 1920 MB/min mapped


@pytest.fixture(scope="module")
def spawner() -> Path:
    from fixtures.build import build

    cflags = [f"-DTLS_KIB={TLS_KIB}"]
    lib = build("libthreadspawn.so", ["thread_stacks.c"], cflags=[*cflags, "-DSPAWN_LIB"], ldflags=["-lpthread"],
                shared=True)
    return build("thread_stacks", ["thread_stacks.c"], cflags=cflags,
                 ldflags=[str(lib), f"-Wl,-rpath,{lib.parent}", "-lpthread"])


def _truth(path: Path) -> tuple[float, int, int]:
    """(t, stacks kept, TLS bytes kept) from the fixture's bookkeeping."""
    for _ in range(50):
        try:
            t, kept, tls, _spawned = path.read_text().split()
            return float(t), int(kept), int(tls)
        except (FileNotFoundError, ValueError):
            time.sleep(0.02)
    raise RuntimeError(f"no truth in {path}")


def _rss(pid: int) -> tuple[float, int]:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("Rss:"))
    return time.monotonic(), rss * KIB


@pytest.mark.bpf
@pytest.mark.skipif(not is_root(), reason="BPF needs root")
def test_unjoined_thread_stacks_are_rated_by_resident_growth(spawn, spawner, tmp_path):
    truth = tmp_path / "truth"
    target = spawn([spawner, THREADS_PER_S, "--truth", truth])
    t0, kept0, tls0 = _truth(truth)
    r0 = _rss(target.pid)
    with TruthLog(truth, field=1) as stacks:
        r = run_cli("hunt", "--pid", target.pid, "--duration", 16, "--format", "json", "--out", tmp_path / "s")
    r1 = _rss(target.pid)
    t1, kept1, tls1 = _truth(truth)
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "s" / "report.json").read_text())
    assert rep["verdict"] == "leak", rep["verdict_reason"]
    top = rep["culprits"][0]
    assert (top["kind"], top["library"], top["rule"]) == ("thread-stacks", "libthreadspawn.so", "thread-stacks"), top
    assert len([c for c in rep["culprits"] if c["pid"] == target.pid]) == 1, rep["culprits"]  # no /proc duplicate
    booked = (tls1 - tls0) / (t1 - t0) * 60 / MB  # the bookkeeping's resident rate
    proc = (r1[1] - r0[1]) / (r1[0] - r0[0]) * 60 / MB  # /proc's
    assert booked > 0.8 * THREADS_PER_S * TLS_KIB * 60 / 1024  # the fixture kept its rate
    assert top["mb_per_min"] == pytest.approx(booked, rel=0.15)
    assert top["mb_per_min"] == pytest.approx(proc, rel=0.15)
    stacks_per_min = (kept1 - kept0) / (t1 - t0) * 60
    assert top["mapped_mb_per_min"] == pytest.approx(stacks_per_min * (8 * MB + 4 * KIB) / MB, rel=0.15)
    # the stacks mapped since attach and still held: those from the probes' attach to the last snapshot, give
    # or take its edges (attach takes seconds on a loaded machine: stacks mapped before are pre-existing)
    reader = SessionReader(tmp_path / "s")
    t0 = reader.meta["t0_monotonic"]
    t_last = float(reader.table("bpf_counters")["t"].max())
    window = stacks.held_at(t0 + t_last) - stacks.held_at(t0 + reader.meta["attach_s"])
    assert 0.9 * window - 1 <= top["stacks_kept"] <= kept1 - kept0, (top["stacks_kept"], window, kept1 - kept0)
    # two figures, named: the address space held (8 MiB and a guard page a stack) and what of it is resident,
    # read from pagemap — the TLS each exited thread wrote, plus its descriptor and top frames (a few pages)
    assert top["outstanding_bytes"] == pytest.approx(top["stacks_kept"] * (8 * MB + 4 * KIB), rel=0.02)
    tls_held = top["stacks_kept"] * TLS_KIB * KIB
    assert tls_held <= top["outstanding_resident_bytes"] <= 1.15 * tls_held, (top["outstanding_resident_bytes"],
                                                                              tls_held)
    assert any("read from /proc/" in e and "pagemap" in e for e in top["evidence"]), top["evidence"]
    assert top["mapped_mb_per_min"] > 20 * top["mb_per_min"]
    assert "exited without pthread_join/pthread_detach" in top["finding"], top["finding"]
    assert f", {top['stacks_kept']} of threads that exited" in top["finding"], top["finding"]  # none alive
    assert "pthread_join" in top["remedy"] and "pool" in top["remedy"]
    assert any("threadspawn_start" in f for f in top["stack"]), top["stack"]


_MAPS = """\
7f7ffcd8f000-7f7ffcd90000 ---p 00000000 00:00 0
7f7ffcd90000-7f7ffd590000 rw-p 00000000 00:00 0
7f7ffd590000-7f7ffd591000 ---p 00000000 00:00 0
7f7ffd591000-7f7ffd691000 rw-p 00000000 00:00 0
7f7ffd691000-7f7ffd692000 rw-p 00000000 00:00 0
7f8000000000-7f8000021000 rw-p 00000000 00:00 0
7f8000021000-7f8004000000 ---p 00000000 00:00 0
"""


def test_stack_shape_is_a_guard_then_one_rw_mapping():
    """Recorded maps (a glibc 8 MiB stack, a 1 MiB one from pthread_attr_setstacksize, a malloc arena): a
    stack block is a ``---p`` guard at its start and ``rw-p`` above it; an arena (rw head, ``---p`` tail)
    is not, and a region the snapshot does not cover exactly is not judged."""
    maps = pd.DataFrame([{"start": m.start, "end": m.end, "perms": m.perms, "rss": 4096 if m.perms[0] == "r" else 0}
                         for m in parse_maps(_MAPS)])
    assert stack_shape(maps, 0x7F7FFCD8F000, 0x7F7FFD590000) == (True, 4096)
    assert stack_shape(maps, 0x7F7FFD590000, 0x7F7FFD691000) == (True, 4096)
    assert stack_shape(maps, 0x7F8000000000, 0x7F8004000000) == (False, 4096)
    assert stack_shape(maps, 0x7F7FFCD8F000, 0x7F7FFD000000) is None
