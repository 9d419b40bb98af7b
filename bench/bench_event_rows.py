"""What the eBPF probe pays per event to put it in the session: the events' rows as dicts (one per event, checked,
then Arrow column by column: the way every other table is written) against the rows given column by column
(``SnapshotRows.event_columns`` then ``columns_to_arrow``: the way ``bpf_events`` is written). Same events,
same process, rounds alternated; each figure is the median over rounds of CPU µs per event, with the ratio.

    .venv/bin/python bench/bench_event_rows.py [--events 100000] [--batch 700] [--rounds 5]

A drained batch holds what the ring gathered in the poll thread's 0.25 s: ~700 events on the real P/D pair
(2,700 a second), thousands on a target making 20,000 map/unmap calls a second.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from event_rows import row_of  # noqa: E402

from leaktrace.probes.bpf.layout import EV_MMAP, EV_MUNMAP, Event  # noqa: E402
from leaktrace.probes.bpf.snapshots import SnapshotRows  # noqa: E402
from leaktrace.session.tables import check_rows, columns_to_arrow, to_arrow  # noqa: E402

T0 = 1000.0


def _events(n: int) -> list[Event]:
    rng = random.Random(0)
    out = []
    for i in range(n):  # a churn: mmap and munmap of anonymous pages, from a few call sites
        e = Event()
        e.seq, e.type, e.tgid, e.tid = 10**12 + i * 370_000, rng.choice((EV_MMAP, EV_MUNMAP)), 3975, 3980
        e.addr, e.len, e.fd = 0x7F0000000000 + rng.getrandbits(30) * 4096, 4096 * rng.randint(1, 64), (1 << 64) - 1
        e.site, e.prot = 0x7F5791600000 + rng.choice((0x8ED2, 0x12A0, 0x77B4)), 3
        out.append(e)
    return out


def as_dicts(batch: list[Event]) -> object:
    rows = [row_of(e, T0) for e in batch]
    check_rows("bpf_events", rows)
    return to_arrow("bpf_events", rows)


def as_columns(batch: list[Event]) -> object:
    me = SimpleNamespace(ctx=SimpleNamespace(session=SimpleNamespace(meta={"t0_monotonic": T0})))
    return columns_to_arrow("bpf_events", SnapshotRows.event_columns(me, batch))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=700)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args([x for x in sys.argv[1:] if x != "--json"])
    events = _events(a.events)
    batches = [events[i:i + a.batch] for i in range(0, len(events), a.batch)]
    per: dict[str, list[float]] = {"dicts": [], "columns": []}
    for _ in range(a.rounds):
        for name, fn in (("dicts", as_dicts), ("columns", as_columns)):
            c0 = time.process_time()
            for b in batches:
                fn(b)
            per[name].append((time.process_time() - c0) / len(events) * 1e6)
    med = {k: statistics.median(v) for k, v in per.items()}
    print(json.dumps({"events": a.events, "batch": a.batch, "rounds": a.rounds,
                      "us_per_event": {k: round(v, 3) for k, v in med.items()},
                      "spread_us": {k: [round(min(v), 3), round(max(v), 3)] for k, v in per.items()},
                      "columns_over_dicts": round(med["columns"] / med["dicts"], 3)}))


if __name__ == "__main__":
    main()
