"""malloc's own mmaps named only if still held when the books are read, on a real process under the real probe: a
Python process mallocs 1 MiB chunks through ctypes at a fixed mmap threshold (each one libc's anonymous mmap, whose
stack window names malloc's caller), frees most of them at once and keeps a few.

By default the kernel keeps each chunk with its window (bpf/leaktrace.bpf.c, `windows`;
leaktrace/probes/bpf/keptwindows.py): the freed chunks never reach user space and no window of theirs is read. With
a window map of one entry the chunks take the slow way and wait in the ledger under a provisional origin
(leaktrace/probes/bpf/deferred.py): the freed ones are never scanned. Either way the kept chunks are in the books
with their exact extent, named by the caller of malloc (libffi, for ctypes), not by libc's mmap."""

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


def _held(probe, pid: int) -> dict[int, tuple[int, object]]:
    """Every outstanding region of ``pid`` over both halves: start -> (end, origin)."""
    return {start: (end, o) for p, start, end, o, _t, _k in probe.kernel.outstanding() if p == pid}


@pytest.mark.parametrize("window_map", ["kernel", "full"])
def test_chunks_freed_before_the_tick_are_never_scanned_and_kept_ones_are_named(tmp_path, window_map: str) -> None:
    env = {"MALLOC_MMAP_THRESHOLD_": "131072", "PATH": "/usr/bin:/bin"}  # a fixed threshold: 1 MiB is mmapped
    p = subprocess.Popen([sys.executable, "-c", TARGET], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env=env)
    try:
        assert p.stdout.readline().strip() == "ready"  # type: ignore[union-attr]
        defines = {"LT_MAX_WINDOWS": 1} if window_map == "full" else None
        tr = Traced(tmp_path / "s", [p.pid], poll_interval=3600, defines=defines)  # only the ticks drain
        try:
            probe = tr.probe
            if window_map == "full":  # a chunk held first takes the map's one entry
                p.stdin.write("0 1\n")  # type: ignore[union-attr]
                p.stdin.flush()  # type: ignore[union-attr]
                assert p.stdout.readline().split()[0] == "ok"  # type: ignore[union-attr]
            before: dict[str, int] = {}
            probe.kernel.read_counters(before)
            p.stdin.write(f"{CHURNED} {KEPT}\n")  # type: ignore[union-attr]
            p.stdin.flush()  # type: ignore[union-attr]
            reply = p.stdout.readline().split()  # type: ignore[union-attr]
            assert reply[0] == "ok"
            chunks = [int(x) for x in reply[1:]]
            assert len(chunks) == KEPT + (window_map == "full")
            after: dict[str, int] = {}
            probe.kernel.read_counters(after)
            while probe._drain():
                pass
            d, w = probe.deferred, probe.kernel.windows
            sent = after["slow_events"] - before["slow_events"]
            if window_map == "kernel":
                # the kernel kept every chunk and settled every free: nothing of the churn was sent
                assert after["fast_maps"] - before["fast_maps"] >= CHURNED + KEPT, (before, after)
                assert after["settled"] - before["settled"] >= CHURNED, (before, after)
                assert sent < 20, (before, after)
                assert d.skipped == 0 and d.scanned == 0
            else:
                # no room for windows: the chunks took the slow way, and the freed ones left the books unscanned
                assert sent >= 2 * (CHURNED - 1), (before, after)
                assert d.skipped >= CHURNED - 1, (d.skipped, d.scanned)
                assert d.scanned == 0
            tr.tick()
            named = d.scanned + w.scanned
            assert named >= len(chunks) and named < len(chunks) + 10, (d.scanned, w.scanned, d.skipped)
            # every window the kernel still keeps belongs to a chunk it holds (a settled free took its window)
            windowed = {(k.tgid, v.born) for k, v in probe.kernel.prog[b"regions"].items() if v.window}
            kept = {(k.tgid, k.born) for k in probe.kernel.prog[b"windows"].keys()}
            assert kept == windowed, (len(kept), len(windowed))
            libc = [m for m in probe.symbols.entries(p.pid) if "libc.so" in m.path and m.perms.startswith("r-x")]
            assert libc
            held = _held(probe, p.pid)
            for addr in chunks:
                # the chunk's user pointer sits 16 bytes past its mapping's page-aligned start
                start = addr - 16
                assert start in held, hex(start)
                end, origin = held[start]
                assert end - start >= CHUNK, (hex(start), hex(end))
                assert maps_ranges(p.pid, start, end) == [(start, end)]
                # named by the window: malloc's caller (ctypes calls it through libffi), not the syscall in libc
                assert not any(m.start <= origin.site < m.end for m in libc), hex(origin.site)
                assert probe.symbols.frame(p.pid, origin.site).library.startswith("libffi"), origin
        finally:
            tr.stop()
    finally:
        p.kill()
        p.wait()
