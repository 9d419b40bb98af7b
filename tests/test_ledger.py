"""Unit tests of the interval ledger (no kernel): every address-space operation the BPF probe applies."""

from __future__ import annotations

import pytest

from leaktrace.elf import read_elf_symbols
from leaktrace.probes.bpf.addrspace import AddressSpace, Origin
from leaktrace.probes.bpf.ledger import OutstandingLedger, page_up
from leaktrace.probes.bpf.symbolizer import MapEntry, Symbolizer

P = 4096
A = Origin("anon", t_born=1, site=0x1000)
B = Origin("anon", t_born=2, site=0x2000)
H = Origin("heap", t_born=3, site=0x3000)


def spans(led: OutstandingLedger, pid: int = 1) -> list[tuple[int, int, int]]:
    """Intervals in pages, adjacent pieces of one origin merged."""
    out: list[tuple[int, int, int]] = []
    for iv in led.intervals(pid):
        a, b, site = iv.start // P, iv.end // P, iv.origin.site
        if out and out[-1][1] == a and out[-1][2] == site:
            out[-1] = (out[-1][0], b, site)
        else:
            out.append((a, b, site))
    return out


@pytest.fixture
def led() -> OutstandingLedger:
    lg = OutstandingLedger()
    lg.mmap(1, 100 * P, 10 * P, A)
    return lg


def test_head_tail_middle_unmap(led: OutstandingLedger) -> None:
    led.munmap(1, 100 * P, 2 * P)
    assert spans(led) == [(102, 110, 0x1000)]
    led.munmap(1, 108 * P, 2 * P)
    assert spans(led) == [(102, 108, 0x1000)]
    led.munmap(1, 104 * P, P)
    assert spans(led) == [(102, 104, 0x1000), (105, 108, 0x1000)]
    assert led.totals(1).outstanding_bytes == 5 * P


def test_unmap_spanning_regions_and_holes(led: OutstandingLedger) -> None:
    led.mmap(1, 120 * P, 4 * P, B)
    led.munmap(1, 105 * P, 17 * P)  # tail of A, the hole, head of B
    assert spans(led) == [(100, 105, 0x1000), (122, 124, 0x2000)]


def test_unaligned_length_rounds_up(led: OutstandingLedger) -> None:
    led.munmap(1, 100 * P, 1)
    assert spans(led)[0][:2] == (101, 110)
    assert page_up(1) == P and page_up(P) == P


def test_map_fixed_overlay_replaces_attribution(led: OutstandingLedger) -> None:
    led.mmap(1, 103 * P, 2 * P, B)
    assert spans(led) == [(100, 103, 0x1000), (103, 105, 0x2000), (105, 110, 0x1000)]
    assert led.totals(1).outstanding_bytes == 10 * P


def test_mremap_grow_and_move(led: OutstandingLedger) -> None:
    led.mremap(1, 100 * P, 10 * P, 500 * P, 16 * P)
    assert spans(led) == [(500, 516, 0x1000)]


def test_mremap_shrink_in_place(led: OutstandingLedger) -> None:
    led.mremap(1, 100 * P, 10 * P, 100 * P, 3 * P)
    assert spans(led) == [(100, 103, 0x1000)]


def test_mremap_move_keeps_split_attribution(led: OutstandingLedger) -> None:
    led.mmap(1, 105 * P, 5 * P, B)
    led.mremap(1, 100 * P, 10 * P, 300 * P, 12 * P)
    assert spans(led) == [(300, 305, 0x1000), (305, 312, 0x2000)]


def test_mremap_dontunmap_keeps_old(led: OutstandingLedger) -> None:
    led.mremap(1, 100 * P, 10 * P, 300 * P, 10 * P, dontunmap=True)
    assert spans(led) == [(100, 110, 0x1000), (300, 310, 0x1000)]


def test_mremap_fixed_target_overlays(led: OutstandingLedger) -> None:
    led.mmap(1, 300 * P, 20 * P, B)
    led.mremap(1, 100 * P, 10 * P, 305 * P, 10 * P)
    assert spans(led) == [(300, 305, 0x2000), (305, 315, 0x1000), (315, 320, 0x2000)]


def test_mremap_growth_of_a_preexisting_region_is_the_callers() -> None:
    """A buffer mapped before attach and grown after it: the old bytes stay pre-existing (never blamed),
    the bytes it grew by belong to the mremap's call site — also after it moved, and on the next growth."""
    led = OutstandingLedger()
    led.seed(1, [(100 * P, 110 * P, "")])
    M = Origin("anon", t_born=5, site=0x5000)
    led.mremap(1, 100 * P, 10 * P, 500 * P, 16 * P, origin=M)
    assert spans(led) == [(500, 510, 0), (510, 516, 0x5000)]
    M2 = Origin("anon", t_born=6, site=0x6000)
    led.mremap(1, 500 * P, 16 * P, 900 * P, 20 * P, origin=M2)
    assert spans(led) == [(900, 910, 0), (910, 920, 0x5000)]
    assert led.totals(1).outstanding_bytes == 10 * P


def test_brk_grow_and_shrink() -> None:
    led = OutstandingLedger()
    led.seed(1, [(1000 * P, 1004 * P, "[heap]")])
    led.brk(1, 1010 * P - 10, H)
    assert spans(led) == [(1000, 1004, 0), (1004, 1010, 0x3000)]
    led.brk(1, 1002 * P, H)
    assert spans(led) == [(1000, 1002, 0)]
    assert led.totals(1).outstanding_bytes == 0  # pre-existing bytes are not outstanding
    assert led.totals(1, include_preexisting=True).outstanding_bytes == 2 * P


def test_brk_without_heap_starts_empty() -> None:
    led = OutstandingLedger()
    led.brk(1, 2000 * P, H)
    led.brk(1, 2003 * P, H)
    assert spans(led) == [(2000, 2003, 0x3000)]


def test_exec_and_exit_release_everything(led: OutstandingLedger) -> None:
    led.mmap(2, 100 * P, P, B)
    led.exec(1)
    assert led.intervals(1) == [] and led.execs[1] == 1
    led.exit(2, seq=9)
    assert led.intervals(2) == [] and led.exited[2] == 9


def test_seed_is_preexisting_and_never_outstanding() -> None:
    led = OutstandingLedger()
    led.seed(7, [(10 * P, 20 * P, ""), (30 * P, 31 * P, "/usr/lib/libc.so.6")])
    assert led.totals(7).outstanding_bytes == 0
    led.munmap(7, 12 * P, 2 * P)
    assert led.totals(7, include_preexisting=True).outstanding_bytes == 9 * P


def test_many_random_ops_match_a_page_bitmap() -> None:
    import random

    rnd = random.Random(3)
    led = OutstandingLedger()
    pages: dict[int, int] = {}
    for _ in range(3000):
        a = rnd.randrange(0, 400)
        n = rnd.randrange(1, 40)
        op = rnd.random()
        if op < 0.45:
            site = rnd.randrange(1, 5)
            led.mmap(1, a * P, n * P, Origin("anon", site=site))
            for p in range(a, a + n):
                pages[p] = site
        elif op < 0.9:
            led.munmap(1, a * P, n * P)
            for p in range(a, a + n):
                pages.pop(p, None)
        else:
            b = rnd.randrange(500, 900)
            m = rnd.randrange(1, 40)
            moved = {p - a: pages.pop(p) for p in range(a, a + n) if p in pages}
            for p in range(b, b + m):
                pages.pop(p, None)
            led.mremap(1, a * P, n * P, b * P, m * P)
            last = None
            for off in range(min(n, m)):
                if off in moved:
                    pages[b + off] = moved[off]
            if m > n:
                # growth takes the origin of the last piece moved (nothing moved: no growth tracked)
                last = moved[max(moved)] if moved else None
                if last is not None:
                    for p in range(b + n, b + m):
                        pages[p] = last
    got: dict[int, int] = {}
    for iv in led.intervals(1):
        for p in range(iv.start // P, iv.end // P):
            assert p not in got, "intervals overlap"
            got[p] = iv.origin.site
    assert got == pages
    # A snapshot's sums per call site: the bytes and intervals of each origin, without a step per interval
    by_site: dict[int, int] = {}
    for site in pages.values():
        by_site[site] = by_site.get(site, 0) + P
    totals = led.spaces[1].totals()
    assert {o.site: b for o, b, _n in totals} == by_site
    assert sum(n for _o, _b, n in totals) == len(list(led.intervals(1)))


def test_regions_the_kernel_saw_born_since_the_last_look() -> None:
    """The reconciliation's test: a region is unseen unless the last look held one with its start and birth."""
    from array import array

    from leaktrace.probes.bpf.kernel import KernelRegions, _unseen

    def regions(pairs: list[tuple[int, int]]) -> KernelRegions:
        return KernelRegions(array("Q", [a for a, _ in pairs]), array("Q", [a + P for a, _ in pairs]),
                             array("Q", [q for _, q in pairs]), array("I", [0] * len(pairs)), array("Q"))

    now = regions([(1 * P, 10), (2 * P, 11), (3 * P, 30), (9 * P, 40)])
    assert _unseen(None, now) == [0, 1, 2, 3]
    assert _unseen(regions([]), now) == [0, 1, 2, 3]
    # same start and birth: seen; same start, newer birth: unseen; past every start of the last look: unseen
    assert _unseen(regions([(1 * P, 10), (2 * P, 11), (3 * P, 12), (5 * P, 13)]), now) == [2, 3]


def test_symbolizer_keeps_maps_after_exit_and_reads_elf(tmp_path) -> None:
    import shutil
    import subprocess

    src = tmp_path / "s.c"
    src.write_text("int f(int x){return x*3;}\nint g(int x){return f(x)+1;}\n")
    so = tmp_path / "libs.so"
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", str(src), "-o", str(so)], check=True)
    syms = read_elf_symbols(str(so))
    names = {s[2] for s in syms.syms}
    assert {"f", "g"} <= names
    f_vaddr = next(s[0] for s in syms.syms if s[2] == "f")
    # A pretend mapping of the whole file at 0x7f0000000000 (offset 0): vaddr == file offset here.
    sym = Symbolizer()
    sym.set_maps(5, [MapEntry(0x7F0000000000, 0x7F0000010000, 0, "r-xp", str(so))])
    fr = sym.frame(5, 0x7F0000000000 + syms.file_offset_to_vaddr(f_vaddr) + 2)
    assert (fr.library, fr.symbol, fr.offset) == ("libs.so", "f", 2)
    assert sym.library_of(5, 0x7F0000000000 + f_vaddr, 0) == "libs.so"
    sym.set_maps(5, [])  # the process is gone: earlier file mappings still resolve
    assert sym.frame(5, 0x7F0000000000 + f_vaddr).library == "libs.so"
    stripped = tmp_path / "libstripped.so"
    shutil.copy(so, stripped)
    subprocess.run(["strip", "--strip-all", str(stripped)], check=True)
    assert {"f", "g"} <= {s[2] for s in read_elf_symbols(str(stripped)).syms}  # .dynsym survives


def test_elf_symbols_keep_the_sized_alias_of_an_address(tmp_path) -> None:
    """Two FUNC symbols at one address (hand-written assembly): `nosize`, exported and sizeless, comes first
    (.dynsym is read before .symtab), `sized` is local. The sized one names the address, and an address past
    its size is no symbol's."""
    import subprocess

    src = tmp_path / "a.c"
    src.write_text('__asm__(".text\\n.globl nosize\\n.type nosize,@function\\nnosize:\\n'
                   '.type sized,@function\\nsized:\\nret\\n.size sized,1\\nnop\\nnop\\n");\n'
                   'int g(int x){return x+1;}\n')
    so = tmp_path / "liba.so"
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", str(src), "-o", str(so)], check=True)
    syms = read_elf_symbols(str(so))
    at = {name: value for value, _size, name in syms.syms}
    assert "g" in at and "sized" in at and "nosize" not in at
    assert syms.lookup(at["sized"]) == ("sized", 0)
    assert syms.lookup(at["sized"] + 1) is None
    assert syms.lookup(at["g"] + 1) == ("g", 1)
    # Names are read on lookup, from the file the table was read from: once it is replaced, a name not read
    # yet is unknown (never a name from the new file at the old offset); names read before stay.
    fresh = read_elf_symbols(str(so))
    so.unlink()
    so.write_bytes(b"\x7fELF" + bytes(4096))
    assert fresh.lookup(at["g"]) is None
    assert syms.lookup(at["g"]) == ("g", 0)


def test_arena_reservation_is_committed_by_mprotect() -> None:
    """glibc's arena heaps: a PROT_NONE reservation holds nothing; mprotect read/write commits pieces of it
    to the caller that grew the heap; PROT_NONE again gives them back; munmap removes the rest."""
    led = OutstandingLedger()
    led.mmap(1, 1000 * P, 64 * P, Origin("reserve"))
    assert led.totals(1).outstanding_bytes == 0
    assert led.mprotect(1, 1000 * P, 2 * P, 3, H) == 2 * P
    assert led.mprotect(1, 1002 * P, P, 3, A) == P
    assert led.mprotect(1, 1000 * P, 3 * P, 3, B) == 0  # already committed: the first committer keeps it
    assert spans(led)[:2] == [(1000, 1002, 0x3000), (1002, 1003, 0x1000)]
    assert led.totals(1).outstanding_bytes == 3 * P
    assert led.mprotect(1, 1001 * P, 2 * P, 0, H) == -2 * P  # decommitted (heap shrunk with overcommit 2)
    assert led.totals(1).outstanding_bytes == P
    led.munmap(1, 1000 * P, 64 * P)
    assert led.intervals(1) == []


def test_seeded_reservation_and_plain_mprotect() -> None:
    led = OutstandingLedger()
    led.seed(1, [(1000 * P, 1064 * P, ""), (2000 * P, 2004 * P, "/lib/x.so")], reserved=[(1010 * P, 1064 * P)])
    assert led.mprotect(1, 1010 * P, 4 * P, 3, H) == 4 * P  # the arena grows past what it had at attach
    assert led.mprotect(1, 1000 * P, 4 * P, 3, H) == 0  # pre-existing memory stays pre-existing
    assert led.mprotect(1, 2000 * P, 4 * P, 1, H) == 0  # RELRO of a library: nothing moves
    assert led.totals(1).outstanding_bytes == 4 * P


def test_growth_without_a_window_continues_the_memory_below() -> None:
    led = OutstandingLedger()
    led.mmap(1, 1000 * P, 64 * P, Origin("reserve"))
    led.mprotect(1, 1000 * P, P, 3, H)
    cont = led.origin_before(1, 1001 * P)
    assert cont is not None and cont.site == H.site
    led.mprotect(1, 1001 * P, P, 3, cont)
    assert spans(led)[0] == (1000, 1002, 0x3000) and len(led.intervals(1)) == 2  # one heap interval + the rest
    assert led.origin_before(1, 1010 * P) is None  # reserved below: nothing to continue
    assert led.origin_before(2, 1000 * P) is None


S = Origin("shm", t_born=4, site=0x4000)


def test_sysv_attach_detach_by_address_only(led: OutstandingLedger) -> None:
    """shmdt names an address: the segment attached there goes, whole, and nothing else (the segment
    attached right above it, as the kernel places them, stays)."""
    led.shmat(1, 200 * P, 3 * P + 1, S)  # the size rounds up to pages, like the VMA
    led.shmat(1, 204 * P, 2 * P, S)
    led.shmat(1, 206 * P, 2 * P, S)  # adjacent to the one below
    assert led.totals(1).outstanding_bytes == 10 * P + 4 * P + 2 * P + 2 * P
    assert [(iv.start // P, iv.end // P) for iv in led.shmdt(1, 204 * P)] == [(204, 206)]
    assert spans(led) == [(100, 110, 0x1000), (200, 204, 0x4000), (206, 208, 0x4000)]
    assert led.shmdt(1, 204 * P) == []  # detached already: the kernel's shmdt fails too
    assert led.shmdt(1, 100 * P) == []  # an mmap, not a segment
    assert spans(led)[0] == (100, 110, 0x1000)


def test_sysv_detach_spares_what_was_mapped_into_the_segment(led: OutstandingLedger) -> None:
    """A munmap of part of a segment then a mapping placed in the hole: shmdt removes the segment's
    remaining pieces, not the newcomer (the kernel unmaps only that segment's VMAs)."""
    led.shmat(1, 200 * P, 4 * P, S)
    led.munmap(1, 201 * P, P)
    led.mmap(1, 201 * P, P, B)
    led.shmdt(1, 200 * P)
    assert spans(led) == [(100, 110, 0x1000), (201, 202, 0x2000)]


def test_sysv_detach_only_where_the_segment_was_attached(led: OutstandingLedger) -> None:
    """Its head unmapped, a segment still detaches at its attach address, never at the start of what is left
    (the kernel matches a piece's offset into its segment against its distance from the address named).
    mapfuzz: shmat 11 0 3665888380 858513437 2112384727 / munmap 6 2 3704979773 ... / shmdt 12 0 ..."""
    led.shmat(1, 200 * P, 13 * P, S)
    led.munmap(1, 200 * P, 8 * P)
    assert led.shmdt(1, 208 * P) == []  # EINVAL in the kernel: nothing detached
    assert spans(led)[-1] == (208, 213, 0x4000)
    assert [(iv.start // P, iv.end // P) for iv in led.shmdt(1, 200 * P)] == [(208, 213)]


def test_sysv_segment_unmapped_whole_is_forgotten(led: OutstandingLedger) -> None:
    led.shmat(1, 200 * P, 2 * P, S)
    led.munmap(1, 200 * P, 2 * P)
    led.mmap(1, 200 * P, 2 * P, B)  # a plain mmap reuses the range
    assert led.shmdt(1, 200 * P) == []
    assert spans(led)[-1] == (200, 202, 0x2000)


def test_sysv_segment_attached_before_tracing_detaches() -> None:
    """A segment seen at attach (or inherited at fork) is a pre-existing /SYSV mapping: its shmdt removes
    that one mapping, not the adjacent one of another segment."""
    led = OutstandingLedger()
    led.seed(1, [(200 * P, 202 * P, "/SYSV00000000 (deleted)"), (202 * P, 205 * P, "/SYSV00000000 (deleted)"),
                 (205 * P, 206 * P, "/usr/lib/libc.so.6")])
    assert [(iv.start // P, iv.end // P) for iv in led.shmdt(1, 200 * P)] == [(200, 202)]
    assert led.shmdt(1, 205 * P) == []  # a file mapping is not detached by shmdt
    assert [(iv.start // P, iv.end // P) for iv in led.intervals(1)] == [(202, 205), (205, 206)]


def test_sysv_ipc_rmid_keeps_the_mapping_until_exit(led: OutstandingLedger) -> None:
    """IPC_RMID is not a detach: the segment's memory stays mapped (and counted) while attached; the
    process's exit releases it, and its attachments are forgotten with it."""
    led.shmat(1, 200 * P, 2 * P, S)
    assert led.totals(1).outstanding_bytes == 12 * P
    led.exit(1)
    assert led.totals(1).outstanding_bytes == 0 and 1 not in led.shm_segments


def test_sysv_segment_sized_from_maps_by_inode_and_offset() -> None:
    """A segment's size is its attach's mappings in /proc/PID/maps: the one at the address whose inode is the
    shmid, and those continuing it at their offset (split by mprotect); not the same segment attached again
    right above, nor another segment attached at that address since (inode differs)."""
    from leaktrace.probes.bpf.sysvshm import _segment_extent, read_sysvipc_sizes
    from leaktrace.procfs.parsers import Mapping

    def m(a: int, b: int, off: int, ino: int) -> Mapping:
        return Mapping(a * P, b * P, "rw-s", off * P, "00:01", ino, "/SYSV00000000 (deleted)")

    maps = [m(10, 12, 0, 7), m(12, 13, 2, 7), m(13, 15, 0, 7), m(20, 21, 0, 8)]
    assert _segment_extent(maps, 10 * P, 7) == 3 * P
    assert _segment_extent(maps, 13 * P, 7) == 2 * P
    assert _segment_extent(maps, 20 * P, 7) is None
    text = ("       key      shmid perms                  size  cpid  lpid nattch   uid\n"
            "         0         98  1600                 12388  4242  4242      1     0\n")
    assert read_sysvipc_sizes(text) == {98: 12388}


def test_sysv_segment_moved_by_mremap_detaches_at_its_new_address(led: OutstandingLedger) -> None:
    led.shmat(1, 200 * P, 2 * P, S)
    led.mremap(1, 200 * P, 2 * P, 300 * P, 2 * P)
    assert led.shmdt(1, 200 * P) == []
    assert [(iv.start // P, iv.end // P) for iv in led.shmdt(1, 300 * P)] == [(300, 302)]
    assert spans(led) == [(100, 110, 0x1000)]


def test_covering_most_is_the_one_interval_over_half_of_a_range() -> None:
    """The fault probe's bucket-to-region rule: of the intervals overlapping [a, b), the one covering more than
    half of it (at most one, as they are disjoint), checked against every interval on random layouts."""
    import random

    rng = random.Random(29)
    for _ in range(200):
        sp, layout, at = AddressSpace(), [], 0
        for _k in range(rng.randint(0, 40)):
            at += rng.choice((0, 4096, 1 << 20)) + 4096 * rng.randint(0, 8)
            end = at + 4096 * rng.choice((1, 16, 256, 600, 1024))
            sp.insert(at, end, Origin("anon", site=at))
            layout.append((at, end))
            at = end
        for _q in range(30):
            a = rng.randrange(0, max(at, 1) + (4 << 20)) & ~4095
            b = a + (2 << 20)
            want = [(s, e) for s, e in layout if min(e, b) - max(s, a) > (b - a) // 2]
            got = sp.covering_most(a, b)
            assert len(want) <= 1 and (None if got is None else (got.start, got.end)) == (want[0] if want else None)
            assert got is None or got.origin.site == got.start


def _merge_maps_pairwise(kept: list[MapEntry], entries: list[MapEntry]) -> list[MapEntry]:
    """merge_maps's meaning, written the slow way: each new entry (by start) drops whatever it overlaps."""
    merged = {m.start: m for m in kept if m.path}
    for m in sorted(entries, key=lambda m: m.start):
        for s in [s for s, o in merged.items() if o.start < m.end and m.start < o.end]:
            del merged[s]
        merged[m.start] = m
    return sorted(merged.values(), key=lambda m: m.start)


def _snapshot(rng, n: int, disjoint: bool) -> list[MapEntry]:
    out, at = [], 0x10000
    for _ in range(n):
        at += rng.randrange(0, 5) * 0x1000
        size = rng.randrange(1, 6) * 0x1000
        start = at if disjoint else rng.randrange(0x10000, 0x10000 + n * 0x6000, 0x1000)
        path = rng.choice(["", "", "/usr/lib/libx.so", "/usr/lib/liby.so", "[heap]", "[stack]"])
        out.append(MapEntry(start, start + size, 0, "r-xp", path))
        at = start + size
    rng.shuffle(out)
    return out


@pytest.mark.parametrize("disjoint", [True, False])
def test_merge_maps_keeps_what_no_new_entry_overlaps(disjoint: bool) -> None:
    """A new snapshot over a kept copy: every new entry and the kept file mappings no new entry overlaps — the
    same list as the pairwise rule, on random snapshots (disjoint as /proc writes them, and overlapping)."""
    import random

    from leaktrace.probes.bpf.symbolizer import merge_maps

    rng = random.Random(7)
    for _ in range(300):
        kept = _merge_maps_pairwise([], _snapshot(rng, rng.randrange(0, 40), True))
        new = _snapshot(rng, rng.randrange(0, 40), disjoint)
        assert merge_maps(kept, new) == _merge_maps_pairwise(kept, new)
