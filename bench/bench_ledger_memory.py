"""leaktrace's own memory per outstanding region (long hunts): N leaked mappings from a handful of
call sites, measured with tracemalloc, as bytes per region and as a ratio to a baseline measured in the
same run (a plain list of (start, end) int tuples, the least a Python program would keep per region).

Three cases per N:
  ``ledger``        OutstandingLedger holding N mmaps (the regions the kernel could not settle or hold)
  ``probe_kernel``  BpfProbe with N regions held by the kernel map (a fake map, no BPF needed): what the
                    probe keeps between ticks (``kept``) and the peak of one snapshot tick (``tick_peak``)
  ``probe_ledger``  BpfProbe whose ledger holds the N regions: same two figures

    .venv/bin/python bench/bench_ledger_memory.py --n 10000 100000 200000

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from leaktrace.probes import HuntContext, HuntOptions, TargetSet  # noqa: E402
from leaktrace.probes.bpf.addrspace import Origin  # noqa: E402
from leaktrace.probes.bpf.layout import Region, RegionKey  # noqa: E402
from leaktrace.probes.bpf.ledger import OutstandingLedger  # noqa: E402
from leaktrace.probes.bpf.probe import BpfProbe  # noqa: E402
from leaktrace.probes.bpf.snapshots import SnapshotRows  # noqa: E402

PID = 4_000_000  # no such process: symbolization gives up at once and caches "?"
SITES = [0x7F00_0000_1000 + 0x40 * k for k in range(5)]
BASE = 0x7E00_0000_0000
CHUNK = 148 * 1024 + 4096  # the real case: 148 KiB chunks (page-rounded, not adjacent)


def regions(n: int) -> list[tuple[int, int, int, int]]:
    """(start, length, site, seq) of n leaked mappings."""
    return [(BASE + i * (CHUNK + 4096), CHUNK, SITES[i % len(SITES)], 10**15 + i * 1000) for i in range(n)]


def measure(build: Any) -> tuple[int, int, Any]:
    """(bytes still allocated after build(), peak bytes during it, what build returned)."""
    gc.collect()
    tracemalloc.start()
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    kept = build()
    gc.collect()
    cur, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return cur - before, peak - before, kept


def baseline(regs: list[tuple[int, int, int, int]]) -> int:
    starts = [r[0] for r in regs]  # fresh int objects, as a real program would hold
    gc.collect()
    kept, _peak, obj = measure(lambda: [(s + 0, s + CHUNK) for s in starts])
    del obj
    return kept


class _Table:
    def __init__(self, items: list[tuple[RegionKey, Region]]) -> None:
        self.items = items

    def items_lookup_batch(self) -> Any:
        yield from self.items

    def __getitem__(self, _k: Any) -> list[int]:  # counters: one value per CPU
        return [0]


class _Prog:
    def __init__(self, items: list[tuple[RegionKey, Region]]) -> None:
        self.regions = _Table(items)

    def __getitem__(self, name: bytes) -> _Table:
        return self.regions

    def ring_buffer_consume(self) -> None:
        pass


def probe_case(regs: list[tuple[int, int, int, int]], in_kernel: bool, d: str) -> dict[str, float]:
    from leaktrace.session import SessionWriter

    session = SessionWriter(Path(d), meta={"target": {"pids": [PID]}})
    ctx = HuntContext(session, TargetSet(roots=[], pids={}), HuntOptions(), lambda _m: None)
    items = [(RegionKey(PID, 0, s), Region(n, seq, site, site - 5, 1, PID, 3, 0x22, 0xFFFFFFFF))
             for s, n, site, seq in regs] if in_kernel else []
    probe = BpfProbe()
    probe.ctx = ctx
    probe.kernel.prog = _Prog(items)
    probe.writer = SnapshotRows(ctx, probe.kernel, probe.ledger, probe.libraries, probe.symbols, probe.scanner,
                                "bench")
    if not in_kernel:
        for s, n, site, seq in regs:
            probe.ledger.mmap(PID, s, n, Origin("anon", t_born=seq, site=site, ip=site - 5, stack_id=1, tid=PID))
    probe._snapshot()  # first tick: caches, interned origins
    session._buffers.clear()
    _kept, peak, _ = measure(probe._snapshot)
    session._buffers.clear()
    n = max(len(regs), 1)
    # What the probe keeps between ticks besides its ledger: the memory it holds beyond an empty probe.
    total_kept = _kept_by(probe) - _kept_by(BpfProbe())
    return {"kept_per_region": round(total_kept / n, 1), "tick_peak_per_region": round(peak / n, 1)}


def _kept_by(probe: BpfProbe) -> int:
    """Bytes of the probe's per-region bookkeeping (deep size of its attributes, ledger excluded)."""
    seen: set[int] = set()

    def size(o: Any) -> int:
        if id(o) in seen:
            return 0
        seen.add(id(o))
        n = sys.getsizeof(o)
        if isinstance(o, dict):
            n += sum(size(k) + size(v) for k, v in o.items())
        elif isinstance(o, (list, tuple, set, frozenset)):
            n += sum(size(x) for x in o)
        elif hasattr(type(o), "__slots__") and not isinstance(o, type):
            n += sum(size(getattr(o, k)) for k in type(o).__slots__ if hasattr(o, k))
        return n

    # The probe's own private state and that of the objects it owns (the kernel side's region view, the
    # library-name cache, the snapshot writer's): what a tick leaves behind.
    owners = [probe, probe.kernel, probe.libraries, *([probe.writer] if probe.writer is not None else [])]
    skip = ("_lib", "_thread", "_stop")
    return sum(size(getattr(o, k)) for o in owners for k in vars(o) if k.startswith("_") and k not in skip)


def run(n: int) -> dict[str, Any]:
    regs = regions(n)
    base = baseline(regs)
    out: dict[str, Any] = {"n": n, "baseline_bytes_per_region": round(base / n, 1)}

    def build_ledger() -> OutstandingLedger:
        led = OutstandingLedger()
        for s, ln, site, seq in regs:
            led.mmap(PID, s, ln, Origin("anon", t_born=seq, site=site, ip=site - 5, stack_id=1, tid=PID))
        return led

    kept, peak, led = measure(build_ledger)
    assert led.totals(PID).regions == n
    del led
    out["ledger"] = {"bytes_per_region": round(kept / n, 1), "ratio_to_baseline": round(kept / base, 2)}
    for name, in_kernel in (("probe_kernel", True), ("probe_ledger", False)):
        with tempfile.TemporaryDirectory() as d:
            r = probe_case(regs, in_kernel, d)
        r["kept_ratio_to_baseline"] = round(r["kept_per_region"] * n / base, 2)
        r["tick_peak_ratio_to_baseline"] = round(r["tick_peak_per_region"] * n / base, 2)
        out[name] = r
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[10_000, 100_000, 200_000])
    args = ap.parse_args()
    print(json.dumps({"results": [run(n) for n in args.n]}, indent=1))


if __name__ == "__main__":
    main()
