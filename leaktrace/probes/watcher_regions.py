"""The watcher's regions: one address space's mappings as classified regions read from /proc/PID/smaps, their
totals per memory class, and the events between two snapshots (born, grown, shrunk, gone, moved)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from leaktrace import procfs
from leaktrace.errors import ProcessGone
from leaktrace.memclass import classify_all
from leaktrace.procfs import Mapping

# A region whose RSS rises by at least this much without changing size is reported as grown.
RSS_GROWTH_EVENT_BYTES = 1 << 20


@dataclass(slots=True)
class Region:
    start: int
    end: int
    perms: str
    path: str
    cls: str
    rss: int
    anon: int

    @property
    def size(self) -> int:
        return self.end - self.start


def regions_from_smaps(mappings: list[Mapping]) -> list[Region]:
    classes = classify_all(mappings)
    return [Region(m.start, m.end, m.perms, m.path, c, m.rss, m.anonymous) for m, c in zip(mappings, classes, strict=True)]


def read_regions(pid: int) -> list[Region]:
    """Full smaps of ``pid`` as classified regions (the compact parser: this runs on every full tick)."""
    text = procfs.read_proc_text(pid, "smaps")
    if not text:
        raise ProcessGone(pid, "smaps")
    regions = [Region(s, e, perms, path, "", rss, anon) for s, e, perms, path, rss, anon in procfs.parse_smaps_compact(text)]
    for r, c in zip(regions, classify_all(regions), strict=True):
        r.cls = c
    return regions


def class_totals(regions: list[Region]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for r in regions:
        d = out.setdefault(r.cls, {"size": 0, "rss": 0, "anon": 0, "count": 0})
        d["size"] += r.size
        d["rss"] += r.rss
        d["anon"] += r.anon
        d["count"] += 1
    return out


def _similar(a: Region, b: Region) -> bool:
    return a.perms == b.perms and a.path == b.path and a.cls == b.cls


def diff_regions(prev: list[Region], cur: list[Region]) -> list[dict[str, Any]]:
    """Events between two snapshots of one address space.

    - same start and kind: ``grown``/``shrunk`` when the size changed, or RSS rose by ≥ RSS_GROWTH_EVENT_BYTES;
    - an old and a new region that overlap (the kernel merged or split VMAs, e.g. an anonymous region
      extended downwards by the next mmap) are the same region: ``grown``/``shrunk`` with old_start;
    - an old region gone and a similar one (same perms, path, class) born elsewhere with no overlap:
      ``moved`` — mremap(MAYMOVE) or munmap+mmap cycles (seed 002's signature);
    - everything else: ``born`` / ``gone``."""
    events: list[dict[str, Any]] = []
    prev_by_start = {r.start: r for r in prev}
    cur_by_start = {r.start: r for r in cur}
    # Same start and same kind: the same region. Same start but another kind (the kernel reused the
    # address for a different mapping) is a gone + a born.
    same = {s for s, r in cur_by_start.items() if s in prev_by_start and _similar(prev_by_start[s], r)}
    gone = [r for r in prev if r.start not in same]
    born = [r for r in cur if r.start not in same]

    def ev(kind: str, new: Region | None, old: Region | None) -> dict[str, Any]:
        ref = new or old
        assert ref is not None
        return {"event": kind, "start": new.start if new else old.start,  # type: ignore[union-attr]
                "end": new.end if new else old.end,  # type: ignore[union-attr]
                "size": new.size if new else 0, "rss": new.rss if new else 0,
                "old_start": old.start if old else None, "old_size": old.size if old else None,
                "old_rss": old.rss if old else None, "perms": ref.perms, "path": ref.path, "cls": ref.cls}

    for r in cur:
        if r.start not in same:
            continue
        o = prev_by_start[r.start]
        if r.size > o.size or (r.size == o.size and r.rss - o.rss >= RSS_GROWTH_EVENT_BYTES):
            events.append(ev("grown", r, o))
        elif r.size < o.size:
            events.append(ev("shrunk", r, o))

    # Overlap pairing: both lists are sorted by start, a sweep keeps it linear.
    gone.sort(key=lambda r: r.start)
    born.sort(key=lambda r: r.start)
    paired_gone: set[int] = set()
    paired_born: set[int] = set()
    i = 0
    for b in born:
        while i < len(gone) and gone[i].end <= b.start:
            i += 1
        j = i
        while j < len(gone) and gone[j].start < b.end:
            g = gone[j]
            if g.start not in paired_gone and _similar(g, b):
                paired_gone.add(g.start)
                paired_born.add(b.start)
                if b.size != g.size or b.rss - g.rss >= RSS_GROWTH_EVENT_BYTES:
                    events.append(ev("grown" if b.size >= g.size else "shrunk", b, g))
                break
            j += 1
    gone = [g for g in gone if g.start not in paired_gone]
    born = [b for b in born if b.start not in paired_born]

    # Moves: for each gone region, the unpaired born region of the same kind closest in size
    # (the new one is at least half and at most 4× the old: growth by mremap, or a re-map).
    for g in sorted(gone, key=lambda r: -r.size):
        if g.cls not in ("anon", "arena", "heap", "shm", "other"):
            continue
        best: Region | None = None
        for b in born:
            if b.start in paired_born or not _similar(g, b):
                continue
            if not (g.size // 2 <= b.size <= g.size * 4):
                continue
            if best is None or abs(b.size - g.size) < abs(best.size - g.size):
                best = b
        if best is not None:
            paired_born.add(best.start)
            paired_gone.add(g.start)
            events.append(ev("moved", best, g))
    for g in gone:
        if g.start not in paired_gone:
            events.append(ev("gone", None, g))
    for b in born:
        if b.start not in paired_born:
            events.append(ev("born", b, None))
    return events
