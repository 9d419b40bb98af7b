"""Libraries loaded by a traced process: each executable file mapping the eBPF probe sees calls for a
fresh read of /proc/PID/maps (names are resolved against it). A process importing torch
loads hundreds of libraries in one burst. Measured in the same run, medians of --reps, on a real process
with that many mappings (this interpreter after mapping --libs files):
  ``per_library``  one maps read per executable mapping in a batch (the naive way)
  ``per_batch``    the same batch as the probe applies it: marked per event, one maps read per process at
                   its end
Reported: both in ms and per_batch/per_library.

    .venv/bin/python bench/bench_bpf_libmaps.py --libs 300
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from leaktrace.probes.bpf.layout import EV_MMAP, Event  # noqa: E402
from leaktrace.probes.bpf.probe import BpfProbe  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--libs", type=int, default=300)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    pid = os.getpid()
    with tempfile.TemporaryDirectory() as d:
        keep = []
        for i in range(args.libs):  # executable file mappings, as a library load makes them
            p = Path(d) / f"libfake{i}.so"
            p.write_bytes(b"\0" * 4096)
            with open(p, "rb") as f:
                keep.append(mmap.mmap(f.fileno(), 4096, prot=mmap.PROT_READ | mmap.PROT_EXEC, flags=mmap.MAP_PRIVATE))
        n_maps = sum(1 for _ in open(f"/proc/{pid}/maps"))
        batch = [Event(type=EV_MMAP, tgid=pid, tid=pid, addr=0x7F00_0000_0000 + i * 4096, len=4096, fd=3, prot=5)
                 for i in range(args.libs)]
        probe = BpfProbe()
        old, new = [], []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            for _e in batch:
                probe.seeds.refresh_maps(pid, force=True)
            old.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for e in batch:
                probe._apply(e, {}, set())
            probe._refresh_due_maps()
            new.append(time.perf_counter() - t0)
        for m in keep:
            m.close()
    o, n = statistics.median(old), statistics.median(new)
    print(json.dumps({"executable_mappings_in_batch": args.libs, "maps_lines": n_maps,
                      "per_library_ms": round(o * 1000, 2), "per_batch_ms": round(n * 1000, 2),
                      "per_batch_over_per_library": round(n / o, 4)}, indent=2))


if __name__ == "__main__":
    main()
