"""malloc's own mmaps named only when the books are read (leaktrace/probes/bpf/deferred.py), on a real process
under the real probe: a Python process mallocs 1 MiB chunks through ctypes at a fixed mmap threshold (each one
libc's anonymous mmap, with a stack window), frees most of them at once and keeps a few. The chunks freed before
the tick are never scanned; those kept are in the books with their exact extent, named at the tick by the caller
of malloc (libffi, for ctypes), not by libc's mmap."""

from __future__ import annotations

import subprocess
import sys

import pytest
from fixtures.bpf_harness import Traced, is_root, maps_ranges

pytestmark = [pytest.mark.bpf, pytest.mark.skipif(not is_root(), reason="BPF needs root")]

CHUNK = 1 << 20
CHURNED, KEPT = 400, 6

TARGET = rf"""
import ctypes, sys
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
kept = []
print("ready", flush=True)
for line in sys.stdin:
    churned, keep = map(int, line.split())
    for _ in range(churned):
        libc.free(libc.malloc({CHUNK}))
    for _ in range(keep):
        kept.append(libc.malloc({CHUNK}))
    print("ok", " ".join(str(p) for p in kept), flush=True)
"""


def test_chunks_freed_before_the_tick_are_never_scanned_and_kept_ones_are_named(tmp_path) -> None:
    env = {"MALLOC_MMAP_THRESHOLD_": "131072", "PATH": "/usr/bin:/bin"}  # a fixed threshold: 1 MiB is mmapped
    p = subprocess.Popen([sys.executable, "-c", TARGET], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env=env)
    try:
        assert p.stdout.readline().strip() == "ready"  # type: ignore[union-attr]
        tr = Traced(tmp_path / "s", [p.pid], poll_interval=3600)  # only the ticks drain
        try:
            probe = tr.probe
            p.stdin.write(f"{CHURNED} {KEPT}\n")  # type: ignore[union-attr]
            p.stdin.flush()  # type: ignore[union-attr]
            reply = p.stdout.readline().split()  # type: ignore[union-attr]
            assert reply[0] == "ok"
            chunks = [int(x) for x in reply[1:]]
            assert len(chunks) == KEPT
            while probe._drain():
                pass
            d = probe.deferred
            # Every freed chunk left the books unscanned; the kept ones wait for the books to be read.
            assert d.skipped >= CHURNED, (d.skipped, d.scanned)
            assert d.scanned == 0
            tr.tick()
            assert d.scanned >= KEPT and d.scanned < KEPT + 10, (d.scanned, d.skipped)
            libc = [m for m in probe.symbols.entries(p.pid) if "libc.so" in m.path and m.perms.startswith("r-x")]
            assert libc
            held = {iv.start: iv for iv in probe.ledger.intervals(p.pid)}
            for addr in chunks:
                # the chunk's user pointer sits 16 bytes past its mapping's page-aligned start
                start = addr - 16
                iv = held.get(start)
                assert iv is not None, hex(start)
                assert iv.end - iv.start >= CHUNK, iv
                assert maps_ranges(p.pid, iv.start, iv.end) == [(iv.start, iv.end)]
                # named by the window: malloc's caller (ctypes calls it through libffi), not the syscall in libc
                assert not any(m.start <= iv.origin.site < m.end for m in libc), hex(iv.origin.site)
                assert probe.symbols.frame(p.pid, iv.origin.site).library.startswith("libffi"), iv.origin
        finally:
            tr.stop()
    finally:
        p.kill()
        p.wait()
